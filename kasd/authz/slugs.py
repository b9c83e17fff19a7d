"""GitLab's slugs of environment names and refs: ``CI_ENVIRONMENT_SLUG`` and ``CI_COMMIT_REF_SLUG``.

Transcribed from GitLab's ``lib/gitlab/slug/environment.rb`` (``Gitlab::Slug::Environment#generate``)
and ``lib/gitlab/utils.rb`` (``Gitlab::Utils.slugify``, which ``Ci::Build#ref_slug`` calls), and
checked against ``spec/lib/gitlab/slug/environment_spec.rb`` (tests/authz/test_slugs.py).
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["environment_slug", "ref_slug"]

_NOT_ALNUM = re.compile(r"[^a-z0-9]")
_DASHES = re.compile(r"-+")
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _base36(number: int) -> str:
    digits = []
    while number:
        number, digit = divmod(number, 36)
        digits.append(_BASE36[digit])
    return "".join(reversed(digits)) or "0"


def environment_slug(name: str | None) -> str:
    """``CI_ENVIRONMENT_SLUG``: lowercase letters, digits and ``-``, starting with a letter, at most
    24 characters; when the slug is not the name itself, the last 6 base-36 digits of the name's
    SHA-256 keep it unique (``Digest::SHA2.hexdigest(name).to_i(16).to_s(36).last(6)``)."""
    original = name or ""  # Ruby's nil.to_s
    slug = _NOT_ALNUM.sub("-", original.lower())
    if not slug[:1].isalpha():  # ^[a-z]: the slug holds only [a-z0-9-] by now
        slug = "env-" + slug
    slug = _DASHES.sub("-", slug)  # squeeze!('-')
    if len(slug) > 24 or slug != original:
        slug = slug[:17]
        if not slug.endswith("-"):
            slug += "-"
        return slug + _base36(int(_sha256_hex(original), 16))[-6:]
    return slug.removesuffix("-")  # chomp('-'): a name such as "foo-" slugs to itself but the dash


def ref_slug(ref: str) -> str:
    """``CI_COMMIT_REF_SLUG``: lowercased, every character but ``[a-z0-9]`` replaced by ``-``, cut to
    63 characters, then leading and trailing ``-`` removed (``Gitlab::Utils.slugify``)."""
    return _NOT_ALNUM.sub("-", ref.lower())[:63].strip("-")
