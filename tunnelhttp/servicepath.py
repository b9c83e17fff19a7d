"""The path of a request to an in-cluster service, and whether it could be read two ways. Sans-I/O.

kasd checks a service request's path before anything leaves it (``kasd.web.services``), agentd
again before it judges the path against its allow-list (``agentd.services``): one check, so the two
cannot drift. A path that agentd, kasd and the service could read differently would let a prefix
check pass for one path while the service serves another (``/api/v1/../../-/quit``); such a target
is refused as a class, in any spelling and at any depth of percent-encoding (up to three layers;
more is refused too): a target not starting with exactly one ``/``; a dot segment ``.``/``..``
literal, percent-encoded in either case, double-encoded, before a ``;`` parameter (``..;x``, as
servlet containers read it), or as full-width dots folding to ``.`` under NFKC; an encoded ``/``
or any ``\\``/``%5c``; NUL and every other control character; bytes that are not UTF-8 once
decoded; ``#``; raw non-ASCII. What remains decodes one way, and its once-decoded form is what the
prefixes are checked against.

May import: the standard library.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import unquote

#: percent-decodings a path segment may take before it stops changing (``%2525`` is two)
MAX_DECODINGS = 3

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENCODED = re.compile(r"%[0-9A-Fa-f]{2}")


class UnsafeTarget(ValueError):
    """A request target neither kasd nor agentd passes on: the message says what is wrong (answered 400)."""


def normalised_path(target: str) -> str:
    """The path of ``target`` (``/api/v1/query?query=up`` → ``/api/v1/query``) percent-decoded once,
    as the service reads it; ``UnsafeTarget`` for a target whose reading could differ (see the
    module docstring). The query is the service's own business and is not looked at."""
    if not target.startswith("/"):
        raise UnsafeTarget("the path must start with /")
    path = target.partition("?")[0]
    if path.startswith("//"):
        raise UnsafeTarget("the path must start with a single /")
    if "#" in path:
        raise UnsafeTarget("the path holds a fragment (#)")
    if not path.isascii():
        raise UnsafeTarget("the path holds characters that are not percent-encoded")
    return "/".join(_segment(raw) for raw in path.split("/"))


def _segment(raw: str) -> str:
    """One path segment, decoded once, after checking it and each deeper decoding of it."""
    text = raw
    once: str | None = None
    for _ in range(MAX_DECODINGS + 1):
        _check_segment(text)
        if not _ENCODED.search(text):
            return text if once is None else once
        try:
            decoded = unquote(text, errors="strict")
        except UnicodeDecodeError:
            raise UnsafeTarget("the path decodes to bytes that are not UTF-8") from None
        if "/" in decoded:
            raise UnsafeTarget("the path holds an encoded / (%2f)")
        if once is None:
            once = decoded
        text = decoded
    raise UnsafeTarget(f"the path is percent-encoded more than {MAX_DECODINGS} times over")


def _check_segment(text: str) -> None:
    if "\\" in text:
        raise UnsafeTarget("the path holds a backslash (\\ or %5c)")
    if "\x00" in text:
        raise UnsafeTarget("the path holds a NUL (%00)")
    if _CONTROL.search(text):
        raise UnsafeTarget("the path holds a control character")
    # Servlet containers drop ";parameters" from a segment, and some servers fold full-width
    # characters (NFKC): "..;x" and "．．" are dot segments to them.
    for form in (text, unicodedata.normalize("NFKC", text)):
        if form.partition(";")[0] in (".", ".."):
            raise UnsafeTarget("the path holds a dot segment (. or .., in any encoding)")
        if "/" in form or "\\" in form:
            raise UnsafeTarget("the path holds a character that folds to / or \\")


__all__ = ["MAX_DECODINGS", "UnsafeTarget", "normalised_path"]
