"""A request head that cannot fit the tunnel's limits is refused before it becomes an OPEN frame,
with the HTTP status that says which limit (sans-I/O)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunnelhttp.head import TUNNEL_LIMITS, HeadOverLimitError, Impersonation, RequestHead
from wire import codec
from wire.errors import UnsendableFrameError
from wire.frames import Open
from wire.settings import Limits

pytestmark = pytest.mark.timeout(60)

MAX = TUNNEL_LIMITS.max_string


def head(target: str = "/api", headers: tuple[tuple[str, str], ...] = (), **kwargs: object) -> RequestHead:
    return RequestHead(method="GET", target=target, headers=headers, request_id="r" * 32, **kwargs)  # type: ignore[arg-type]


def test_a_head_at_the_limits_fits() -> None:
    at_limits = head("/" + "a" * (MAX - 1), tuple((f"x-{i}", "v") for i in range(TUNNEL_LIMITS.max_array_items)))
    metadata = at_limits.to_metadata()
    assert RequestHead.from_metadata(metadata) == at_limits
    codec.encode_checked(Open(stream_id=1, metadata=metadata), TUNNEL_LIMITS)


@pytest.mark.parametrize(("request_head", "status", "limit", "message"), [
    (head("/" + "a" * MAX), 414, "target",
     "request target is 16385 bytes, over the tunnel's limit of 16384 bytes for a path and query"),
    (head("/" + "é" * (MAX // 2)), 414, "target",  # bytes, not characters
     "request target is 16385 bytes, over the tunnel's limit of 16384 bytes for a path and query"),
    (head(headers=(("x-big", "b" * (MAX + 1)),)), 431, "header",
     "request header 'x-big' is 16385 bytes, over the tunnel's limit of 16384 bytes for a header"),
    (head(headers=tuple((f"x-{i}", "v") for i in range(257))), 431, "headers",
     "request has 257 headers to forward, over the tunnel's limit of 256 headers"),
    (head(headers=tuple((f"x-{i}", "v" * 15000) for i in range(5))), 431, "head",
     "request head does not fit the tunnel: OPEN frame over the limits: control frame of"),
])
def test_a_head_over_a_limit_says_which(request_head: RequestHead, status: int, limit: str, message: str) -> None:
    with pytest.raises(HeadOverLimitError) as caught:
        request_head.to_metadata()
    assert caught.value.status == status and caught.value.limit == limit
    assert str(caught.value).startswith(message)
    assert isinstance(caught.value, UnsendableFrameError)  # a verdict on the head, never on a session


def test_an_impersonation_over_a_limit_is_refused_too() -> None:
    imp = Impersonation(user="u", groups=tuple(f"g{i}" for i in range(300)))
    with pytest.raises(HeadOverLimitError, match="array exceeds 256 items"):
        head(impersonate=imp).to_metadata()


SMALL = Limits(max_string=64, max_array_items=6, max_map_entries=8, max_control_frame=300)
text = st.text(alphabet=st.sampled_from("aé€😀/-"), max_size=80)


@settings(max_examples=300, deadline=None)
@given(
    target=text,
    headers=st.lists(st.tuples(st.text(alphabet="abc-", min_size=1, max_size=70), text), max_size=8),
    groups=st.none() | st.lists(st.text(alphabet="g€", max_size=70), max_size=8),
)
def test_to_metadata_refuses_exactly_what_the_session_would(
        target: str, headers: list[tuple[str, str]], groups: list[str] | None) -> None:
    request_head = RequestHead(method="GET", target="/" + target, headers=tuple(headers), request_id="r" * 8,
                               impersonate=None if groups is None else Impersonation(user="u", groups=tuple(groups)))
    try:
        metadata = request_head.to_metadata(SMALL)
    except HeadOverLimitError:
        refused = True
    else:
        refused = False
        assert RequestHead.from_metadata(metadata) == request_head
    unchecked = {
        "v": 1, "kind": request_head.kind, "method": "GET", "target": request_head.target,
        "headers": [list(h) for h in request_head.headers],
        "impersonate": request_head.impersonate.to_metadata() if request_head.impersonate else None,
        "request_id": request_head.request_id,
    }
    try:
        codec.encode_checked(Open(stream_id=codec.MAX_STREAM_ID, metadata=unchecked), SMALL)
    except UnsendableFrameError:
        assert refused
    else:
        assert not refused


@pytest.mark.parametrize(("sent", "read"), [("3f2a-b.c_d", "3f2a-b.c_d"), ("x" * 65, ""), ("a b", ""), (7, ""), (None, "")])
def test_a_request_id_is_read_only_when_safe(sent: object, read: str) -> None:
    """An id kasd (or an older one, or a peer) sent: kept when it is safe to log as it is, else none;
    a head without one (an older kasd) has none, and the head is still read."""
    metadata = RequestHead(method="GET", target="/api", headers=(), request_id="x").to_metadata()
    metadata["request_id"] = sent
    assert RequestHead.from_metadata(metadata).request_id == read
    del metadata["request_id"]
    assert RequestHead.from_metadata(metadata).request_id == ""
