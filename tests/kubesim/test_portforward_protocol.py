"""The kubelet's port-forward stream protocol (kubesim/portforward.py): pairing, headers, bounds."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from kubesim import netsim, portforward, spdy
from kubesim.portforward import PairError, PairReady, StreamAccepted, StreamPairing, StreamRefused
from kubesim.portforward_session import PortForwardSession, sandbox_id

pytestmark = pytest.mark.timeout(60)


def _headers(kind: str, port: int | str, request_id: str | None) -> list[tuple[str, str]]:
    headers = [("streamtype", kind), ("port", str(port))]
    if request_id is not None:
        headers.append(("requestid", request_id))
    return headers


@st.composite
def _requests(draw: st.DrawFn) -> list[tuple[str, str, int]]:
    """(request id, stream type, port) for both streams of several requests, in any order."""
    count = draw(st.integers(1, 8))
    ids = draw(st.lists(st.integers(0, 10**6), min_size=count, max_size=count, unique=True))
    ports = draw(st.lists(st.integers(1, 65535), min_size=count, max_size=count))
    streams = [(str(i), kind, port) for i, port in zip(ids, ports, strict=True) for kind in ("error", "data")]
    return draw(st.permutations(streams))


def _check_pairs(opened: list[tuple[int, str, str, int]], events: list[portforward.Event]) -> None:
    """Every stream accepted once, every request paired once, with its own streams and port."""
    accepted = [e.stream_id for e in events if isinstance(e, StreamAccepted)]
    assert sorted(accepted) == sorted(stream_id for stream_id, *_ in opened)
    ready = {e.request_id: e for e in events if isinstance(e, PairReady)}
    assert len(ready) == len([e for e in events if isinstance(e, PairReady)]) == len(opened) // 2
    for stream_id, request_id, kind, port in opened:
        pair = ready[request_id]
        assert (pair.error_stream if kind == "error" else pair.data_stream) == stream_id
        assert pair.port == port
    assert not [e for e in events if isinstance(e, StreamRefused | PairError)]


@given(_requests())
def test_streams_pair_by_request_id_whatever_order_they_arrive_in(streams: list[tuple[str, str, int]]) -> None:
    pairing = StreamPairing()
    events: list[portforward.Event] = []
    opened = []
    for index, (request_id, kind, port) in enumerate(streams):
        stream_id = 2 * index + 1
        opened.append((stream_id, request_id, kind, port))
        events += pairing.stream_opened(stream_id, _headers(kind, port, request_id), now=0.0)
    _check_pairs(opened, events)
    assert pairing.pending == 0 and pairing.next_deadline() is None


@settings(max_examples=60, deadline=None)
@given(_requests(), st.data())
def test_streams_pair_through_spdy_under_any_chunking(streams: list[tuple[str, str, int]], data: st.DataObject) -> None:
    client, server = spdy.Connection(client=True), spdy.Connection()
    pairing = StreamPairing()
    opened = []
    for request_id, kind, port in streams:
        stream_id = client.open_stream(_headers(kind, port, request_id))
        opened.append((stream_id, request_id, kind, port))
    wire = client.data_to_send()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=12)))
    events: list[portforward.Event] = []
    for start, end in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        for event in server.receive_data(wire[start:end]):
            assert isinstance(event, spdy.StreamOpened)
            events += pairing.stream_opened(event.stream_id, event.headers, now=0.0)
    _check_pairs(opened, events)


def test_kubectl_stream_order_pairs_error_then_data() -> None:
    pairing = StreamPairing()
    assert pairing.stream_opened(1, _headers("error", 80, "0"), now=0) == [StreamAccepted(stream_id=1)]
    assert pairing.stream_opened(3, _headers("data", 80, "0"), now=0) == [
        StreamAccepted(stream_id=3), PairReady(request_id="0", port=80, error_stream=1, data_stream=3)]


@pytest.mark.parametrize(("headers", "reason"), [
    ([("streamtype", "data")], '"port" header is required'),
    ([("streamtype", "data"), ("port", "http")],
     'unable to parse "http" as a port: strconv.ParseUint: parsing "http": invalid syntax'),
    ([("streamtype", "data"), ("port", "-1")],
     'unable to parse "-1" as a port: strconv.ParseUint: parsing "-1": invalid syntax'),
    ([("streamtype", "data"), ("port", "65536")],
     'unable to parse "65536" as a port: strconv.ParseUint: parsing "65536": value out of range'),
    ([("streamtype", "data"), ("port", "0")], 'port "0" must be > 0'),
    ([("port", "80")], '"streamType" header is required'),
    ([("port", "80"), ("streamtype", "resize")], 'invalid stream type "resize"'),
])
def test_invalid_headers_refuse_the_stream_with_the_kubelets_reason(headers: list[tuple[str, str]],
                                                                      reason: str) -> None:
    assert StreamPairing().stream_opened(5, headers, now=0) == [StreamRefused(stream_id=5, reason=reason)]


def test_a_stream_without_request_id_gets_the_old_clients_pseudo_id() -> None:
    pairing = StreamPairing()
    events = pairing.stream_opened(5, _headers("error", 8080, None), now=0)
    events += pairing.stream_opened(7, _headers("data", 8080, None), now=0)
    assert events[-1] == PairReady(request_id="5", port=8080, error_stream=5, data_stream=7)


def test_a_duplicate_stream_is_reported_on_the_error_stream() -> None:
    pairing = StreamPairing()
    pairing.stream_opened(1, _headers("error", 80, "9"), now=0)
    assert pairing.stream_opened(3, _headers("error", 80, "9"), now=0) == [
        StreamAccepted(stream_id=3),
        PairError(request_id="9", error_stream=1,
                  message="error processing stream for request 9: error stream already assigned")]
    assert pairing.pending == 1


def test_incomplete_pairs_time_out_with_the_kubelets_message() -> None:
    pairing = StreamPairing(timeout=30)
    pairing.stream_opened(1, _headers("error", 80, "1"), now=100)
    pairing.stream_opened(3, _headers("data", 80, "2"), now=110)
    assert pairing.next_deadline() == 130
    assert pairing.expire(129) == []
    assert pairing.expire(130) == [PairError(request_id="1", error_stream=1,
                                             message="(conn=kubesim, request=1) timed out waiting for streams")]
    [reset] = pairing.expire(140)
    assert isinstance(reset, StreamRefused) and reset.stream_id == 3
    assert pairing.pending == 0


def test_pending_pairs_are_bounded() -> None:
    pairing = StreamPairing(max_pending=3)
    for i in range(3):
        assert pairing.stream_opened(2 * i + 1, _headers("error", 80, str(i)), now=0) == [
            StreamAccepted(stream_id=2 * i + 1)]
    [refused] = pairing.stream_opened(7, _headers("error", 80, "3"), now=0)
    assert isinstance(refused, StreamRefused) and "too many" in refused.reason
    # Completing a waiting pair still works, and frees a place.
    assert isinstance(pairing.stream_opened(9, _headers("data", 80, "0"), now=0)[-1], PairReady)
    assert pairing.stream_opened(11, _headers("error", 80, "3"), now=0) == [StreamAccepted(stream_id=11)]


def test_a_huge_request_id_is_refused() -> None:
    [refused] = StreamPairing().stream_opened(1, _headers("error", 80, "1" * 1000), now=0)
    assert isinstance(refused, StreamRefused)


@given(st.lists(st.tuples(st.sampled_from(["streamtype", "port", "requestid", "x"]),
                          st.text(max_size=20)), max_size=6), st.integers(1, 2**31 - 1))
def test_any_headers_give_events_never_exceptions(headers: list[tuple[str, str]], stream_id: int) -> None:
    pairing = StreamPairing(max_pending=2)
    for offset in range(3):
        events = pairing.stream_opened(stream_id, headers, now=float(offset))
        assert events and isinstance(events[0], StreamRefused | StreamAccepted)
    assert pairing.pending <= 2


def test_the_unreachable_port_message_is_the_kubelets() -> None:
    message = portforward.forward_error(port=81, sandbox_id="abc", netns="/var/run/netns/cni-1",
                                        reason="connection refused")
    assert message == (
        'error forwarding port 81 to pod abc, uid : failed to execute portforward in network namespace '
        '"/var/run/netns/cni-1": failed to connect to localhost:81 inside namespace "abc", IPv4: dial tcp4 '
        '127.0.0.1:81: connect: connection refused IPv6 dial tcp6: address localhost: no suitable address found ')


# -- the session over streams (what the SPDY driver hands it) ------------------------------------


class _FakeStream:
    """A client-opened stream: what the client sends is fed in; what we send is recorded."""

    def __init__(self, stream_id: int, headers: list[tuple[str, str]]) -> None:
        self.stream_id = stream_id
        self.headers = tuple(headers)
        self.accepted = self.was_reset = self.closed = False
        self.sent = bytearray()
        self._send, self._receive = trio.open_memory_channel[bytes](4)
        self.done = trio.Event()

    async def reply(self) -> None:
        await trio.lowlevel.checkpoint()
        self.accepted = True

    async def reset(self) -> None:
        await trio.lowlevel.checkpoint()
        self.was_reset = True

    async def feed(self, data: bytes) -> None:
        await self._send.send(data)

    async def fin(self) -> None:
        await self._send.aclose()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            return b""

    async def send_all(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.sent += data

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint()
        self.closed = True
        self.done.set()


class _Ctl:
    def __init__(self) -> None:
        self.processes: dict[tuple[str, str, str], object] = {}
        self.network = netsim.Network()


_POD = {"metadata": {"namespace": "default", "name": "web", "uid": "u-1"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "c", "state": {"running": {}}}]}}


async def test_a_session_forwards_the_echo_port_both_ways() -> None:
    payload = bytes(range(256)) * 2000
    async with trio.open_nursery() as nursery:
        session = PortForwardSession(_Ctl(), _POD, nursery)  # type: ignore[arg-type]
        error = _FakeStream(1, _headers("error", 7, "0"))
        data = _FakeStream(3, _headers("data", 7, "0"))
        await session.stream_opened(error)
        await session.stream_opened(data)
        assert error.accepted and data.accepted
        for start in range(0, len(payload), 30_000):
            await data.feed(payload[start:start + 30_000])
        await data.fin()
        with trio.fail_after(10):
            await error.done.wait()
    assert bytes(data.sent) == payload
    assert data.closed and error.sent == b""


async def test_a_refused_port_is_reported_on_the_error_stream_and_the_next_pair_works() -> None:
    async with trio.open_nursery() as nursery:
        session = PortForwardSession(_Ctl(), _POD, nursery)  # type: ignore[arg-type]
        bad = [_FakeStream(1, _headers("error", 81, "0")), _FakeStream(3, _headers("data", 81, "0"))]
        bogus = _FakeStream(5, [("streamtype", "data"), ("port", "x")])
        good = [_FakeStream(7, _headers("error", 7, "1")), _FakeStream(9, _headers("data", 7, "1"))]
        for stream in [*bad, bogus, *good]:
            await session.stream_opened(stream)
        await good[1].feed(b"still here")
        await good[1].fin()
        with trio.fail_after(10):
            await bad[0].done.wait()
            await good[0].done.wait()
    assert bogus.was_reset and not bogus.accepted
    message = bad[0].sent.decode()
    assert message.startswith(f"error forwarding port 81 to pod {sandbox_id(_POD)}, uid : failed to execute "
                              "portforward in network namespace \"/var/run/netns/cni-")
    assert "dial tcp4 127.0.0.1:81: connect: connection refused" in message
    assert bytes(good[1].sent) == b"still here"
