"""CI_ENVIRONMENT_SLUG and CI_COMMIT_REF_SLUG, on GitLab's own spec examples."""

from __future__ import annotations

import pytest

from kasd.authz import slugs
from kasd.authz.slugs import environment_slug, ref_slug


# spec/lib/gitlab/slug/environment_spec.rb: SHA2.hexdigest is stubbed to return 'a' * 64, whose
# base-36 form ends in 'q517sa'.
@pytest.mark.parametrize(("name", "slug"), [
    ("staging-12345678901234567", "staging-123456789-q517sa"),
    ("9-staging-123456789012345", "env-9-staging-123-q517sa"),
    ("staging-1234567890123456", "staging-1234567890123456"),
    ("staging-1234567890123456-", "staging-123456789-q517sa"),
    ("production", "production"),
    ("PRODUCTION", "production-q517sa"),
    ("review/1-foo", "review-1-foo-q517sa"),
    ("1-foo", "env-1-foo-q517sa"),
    ("1/foo", "env-1-foo-q517sa"),
    ("foo-", "foo"),
    ("foo--bar", "foo-bar-q517sa"),
    ("foo**bar", "foo-bar-q517sa"),
    ("*-foo", "env-foo-q517sa"),
    ("staging-12345678-", "staging-12345678"),
    ("staging-12345678-01234567", "staging-12345678-q517sa"),
    ("", "env-q517sa"),
    (None, "env-q517sa"),
])
def test_gitlabs_environment_slug_examples(monkeypatch: pytest.MonkeyPatch, name: str | None, slug: str) -> None:
    monkeypatch.setattr(slugs, "_sha256_hex", lambda text: "a" * 64)
    assert environment_slug(name) == slug


def test_the_environment_suffix_is_the_real_sha256() -> None:
    # int(sha256("review/feature").hexdigest(), 16) in base 36, last 6 digits; the slug is stable
    slug = environment_slug("review/feature")
    assert slug.startswith("review-feature-") and len(slug) == len("review-feature-") + 6
    assert slug == environment_slug("review/feature") != environment_slug("review/feature2")
    assert environment_slug("Review/Feature") != slug  # the digest is of the name as written


@pytest.mark.parametrize(("ref", "slug"), [
    ("main", "main"),
    ("feature/Login_Page", "feature-login-page"),
    ("-v1.2.3-", "v1-2-3"),
    ("a//b", "a--b"),  # not squeezed, unlike the environment slug
    ("x" * 70, "x" * 63),
    ("a" * 62 + "/b", "a" * 62),  # cut to 63 first, then the trailing dash goes
    ("Ünïcode", "n-code"),
])
def test_ref_slug(ref: str, slug: str) -> None:
    assert ref_slug(ref) == slug
