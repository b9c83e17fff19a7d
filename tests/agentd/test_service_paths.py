"""agentd's allow-list check of a service request's path, sans I/O: a path it lets through under a
prefix is under that prefix however liberally the service reads it, and each kind of ambiguous
target (dot segments, encoded separators, NUL, double encodings, overlong UTF-8, full-width dots,
``;`` parameters, no leading ``/``) is refused, whatever its spelling."""

from __future__ import annotations

import unicodedata
from urllib.parse import unquote

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentd.services import (
    ServiceSettings,
    UnsafeTarget,
    check_request,
    normalised_path,
    prefix_allows,
)

pytestmark = pytest.mark.timeout(60)


def liberal_reading(path: str) -> str:
    """The path as the most liberal server could read it: decoded until it stops changing, full-width
    characters folded, ``\\`` taken for ``/``, ``;parameters`` dropped, dot segments resolved."""
    text = path
    for _ in range(6):
        text = unquote(text, errors="replace")
    text = unicodedata.normalize("NFKC", text).replace("\\", "/").replace("\x00", "")
    resolved: list[str] = []
    for segment in text.split("/")[1:]:
        segment = segment.partition(";")[0]
        if segment == "..":
            if resolved:
                resolved.pop()
        elif segment != ".":
            resolved.append(segment)
    return "/" + "/".join(resolved)


PIECES = ["api", "v1", "admin", "query", ".", "..", "%2e", "%2E", "%2f", "%2F", "%5c", "%5C", "\\", "%25",
          "2e", "2f", ";", ";x", "%00", "%0a", "/", "//", "%c0%ae", "%ef%bc%8e", "%e2%80%a4", "%", "%zz", "a%20b",
          "%252e", "%25252e", "%ef%bc%8e%ef%bc%8e", "%c0%ae%c0%ae"]
PREFIXES = ["/api/v1/", "/api/v1", "/api/v1/query", "/"]


SEGMENTS = st.lists(st.sampled_from(PIECES), min_size=1, max_size=3).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(SEGMENTS, min_size=1, max_size=6), st.sampled_from(PREFIXES))
@example(["..;x", "admin"], "/api/v1/")  # the spellings attackers reach for first, always tried
@example(["%ef%bc%8e%ef%bc%8e", "admin"], "/api/v1/")
@example(["%252e%252e", "admin"], "/api/v1/")
@example(["%2e%2e%5cadmin"], "/api/v1/")
def test_a_path_let_through_under_a_prefix_is_under_it_for_any_reading(segments: list[str], prefix: str) -> None:
    target = "/api/v1/" + "/".join(segments)
    try:
        path = normalised_path(target)
    except UnsafeTarget:
        return
    if prefix_allows(prefix, path):
        reading = liberal_reading(target)
        assert prefix_allows(prefix, reading), (target, path, reading)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abcxyz019-_~.", min_size=1, max_size=8).filter(lambda s: s.strip(".")),
                min_size=1, max_size=6))
def test_a_plain_path_is_its_own_normal_form(segments: list[str]) -> None:
    path = "/" + "/".join(segments)
    assert normalised_path(path + "?query=up&x=..%2f") == path


@pytest.mark.parametrize(("target", "problem"), [
    ("api/v1/query", "must start with /"),
    ("//evil.example/api/v1/", "single /"),
    ("/api/v1/../admin", "dot segment"),
    ("/api/v1/./query", "dot segment"),
    ("/api/v1/..", "dot segment"),
    ("/api/v1/%2e%2e/admin", "dot segment"),
    ("/api/v1/.%2E/admin", "dot segment"),
    ("/api/v1/%252e%252e/admin", "dot segment"),  # decoded twice by a second hop
    ("/api/v1/..;jsessionid=1/admin", "dot segment"),  # servlet path parameters
    ("/api/v1/%ef%bc%8e%ef%bc%8e/admin", "dot segment"),  # full-width dots, NFKC-folded
    ("/api/v1%2fadmin", "encoded /"),
    ("/api/v1%2Fadmin", "encoded /"),
    ("/api/v1%252fadmin", "encoded /"),
    ("/api/v1\\admin", "backslash"),
    ("/api/v1%5cadmin", "backslash"),
    ("/api/v1%5Cadmin", "backslash"),
    ("/api/v1/%ef%bc%8fadmin", "folds to /"),  # full-width solidus
    ("/api/v1/query%00", "NUL"),
    ("/api/v1/query%2500", "NUL"),
    ("/api/v1/query%0d%0aX: y", "control character"),
    ("/api/v1/%c0%ae%c0%ae/admin", "not UTF-8"),  # overlong '.'
    ("/api/v1/query#frag", "fragment"),
    ("/api/v1/qu\u00e9ry", "not percent-encoded"),
    ("/api/v1/%25252525252e", "more than 3 times"),
])
def test_each_kind_of_ambiguous_target_is_refused(target: str, problem: str) -> None:
    with pytest.raises(UnsafeTarget, match=problem.replace(".", r"\.").replace("/", "/")):
        normalised_path(target)


def test_the_normalised_path_is_decoded_once_and_checked_against_the_prefixes() -> None:
    service = ServiceSettings(name="prometheus", url="http://p:9090", paths=("/api/v1/",))
    assert normalised_path("/api/%761/query?query=up") == "/api/v1/query"
    assert check_request(service, "GET", "/api/%761/query?query=up") is None
    assert check_request(service, "GET", "/api/v1") is None
    assert check_request(service, "HEAD", "/api/v1/status/buildinfo") is None  # the default methods
    forbidden = check_request(service, "POST", "/api/v1/query")
    assert forbidden is not None and (forbidden.status, forbidden.reason) == (403, "Forbidden")
    outside = check_request(service, "GET", "/api/v1beta/query")
    assert outside is not None and outside.status == 403
    assert outside.message == "agentd: service 'prometheus' allows the paths under /api/v1/, not '/api/v1beta/query'"


def test_prefixes_match_whole_segments() -> None:
    assert prefix_allows("/", "/anything")
    assert prefix_allows("/api/v1/", "/api/v1") and prefix_allows("/api/v1", "/api/v1/query")
    assert not prefix_allows("/api/v1", "/api/v10/query")
    assert not prefix_allows("/api/v1/", "/api/v1beta")
