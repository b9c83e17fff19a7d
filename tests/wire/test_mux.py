"""The stream multiplexer, driven as a client/server pair over a fake link and by a hand-made peer."""

from __future__ import annotations

import array
from collections.abc import Callable
from typing import Any

import pytest

import wire.mux
from wire import codec
from wire.errors import ErrorCode, LocalProtocolError, RemoteProtocolError, UnsendableFrameError
from wire.events import (
    DataReceived,
    Event,
    GoAwayReceived,
    HandshakeCompleted,
    NoticeReceived,
    PongReceived,
    StreamAccepted,
    StreamEnded,
    StreamOpened,
    StreamRefused,
    StreamReset,
    WindowUpdated,
)
from wire.frames import (
    Accept,
    Data,
    Frame,
    GoAway,
    HalfClose,
    Hello,
    Open,
    Ping,
    Pong,
    Refuse,
    Reset,
    WindowUpdate,
)
from wire.mux import MuxConnection, StreamInfo
from wire.settings import PROTOCOL_VERSION, Limits, Settings
from wire.streamstate import TRANSITIONS, StreamInput, StreamState

from .pair import ConnectionPair, RawPeer, kinds

S = StreamState
I = StreamInput  # noqa: E741


def open_accepted(
    pair: ConnectionPair, opener: MuxConnection, metadata: dict[str, Any] | None = None
) -> int:
    sid = opener.open_stream(metadata)
    events = pair.send(opener)
    assert events == [StreamOpened(stream_id=sid, metadata=metadata or {})]
    pair.peer(opener).accept_stream(sid)
    assert pair.send(pair.peer(opener)) == [StreamAccepted(stream_id=sid, metadata={})]
    return sid


def local_reset(events: list[Event], sid: int, code: ErrorCode) -> StreamReset:
    """The one event is this side resetting ``sid`` with ``code`` (a stream error)."""
    assert len(events) == 1, events
    (event,) = events
    assert isinstance(event, StreamReset)
    assert (event.stream_id, event.code, event.remote) == (sid, code, False)
    assert event.message
    return event


def info(conn: MuxConnection, sid: int) -> StreamInfo:
    stream = conn.stream_info(sid)
    assert stream is not None
    return stream


def goaway_sent(peer: RawPeer) -> GoAway:
    frames = peer.received()
    assert frames and type(frames[-1]) is GoAway, frames
    return frames[-1]


def session_error(peer: RawPeer, *frames: Frame, data: bytes = b"") -> RemoteProtocolError:
    """Send frames the connection must treat as a session error; check the GOAWAY and stickiness."""
    peer.received()
    with pytest.raises(RemoteProtocolError) as info:
        if data:
            peer.send_bytes(data)
        else:
            peer.send(*frames)
    error = info.value
    goaway = goaway_sent(peer)
    assert goaway.code == error.code
    assert peer.conn.error is error
    # sticky: whatever comes next, the same error again, and nothing more is sent
    with pytest.raises(RemoteProtocolError) as again:
        peer.send(Ping(opaque=1))
    assert again.value is error
    assert peer.received() == []
    peer.conn.goaway(ErrorCode.INTERNAL_ERROR)  # nothing follows the GOAWAY that named the error
    assert peer.received() == []
    with pytest.raises(LocalProtocolError):
        peer.conn.open_stream()
    with pytest.raises(LocalProtocolError):
        peer.conn.ping()
    return error


# ---------------------------------------------------------------------------------------------- handshake


def test_handshake_reports_version_and_peer_metadata() -> None:
    pair = ConnectionPair(handshake=False)
    pair.client.initiate()
    pair.server.initiate()
    client_events, server_events = pair.exchange()
    assert client_events == [
        HandshakeCompleted(version=PROTOCOL_VERSION, peer_metadata={"role": "server"})
    ]
    assert server_events == [
        HandshakeCompleted(version=PROTOCOL_VERSION, peer_metadata={"role": "client"})
    ]
    assert pair.client.peer_settings == Settings()
    assert pair.client.version == pair.server.version == PROTOCOL_VERSION


def test_nothing_opens_before_the_handshake_and_hello_is_sent_once() -> None:
    conn = MuxConnection(client=True)
    with pytest.raises(LocalProtocolError):
        conn.open_stream()
    assert not conn.can_open_stream()
    # HELLO must be the first frame sent: nothing that could queue a reply works before initiate()
    peer_hello = codec.encode(Hello(major=1, minor=0, settings={}, metadata={}))
    with pytest.raises(LocalProtocolError):
        conn.receive_data(peer_hello + codec.encode(Ping(opaque=1)))
    with pytest.raises(LocalProtocolError):
        conn.ping()
    assert conn.data_to_send() == b""
    conn.initiate()
    with pytest.raises(LocalProtocolError):
        conn.initiate()
    assert [type(f) for f in codec.FrameDecoder().feed(conn.data_to_send())] == [Hello]


def test_a_different_major_version_gets_goaway_unsupported_version_naming_both() -> None:
    conn = MuxConnection(client=False)
    peer = RawPeer(conn, handshake=False)
    conn.initiate()
    peer.version = (PROTOCOL_VERSION[0] + 1, 4)
    with pytest.raises(RemoteProtocolError) as info:
        peer.handshake()
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION
    hello, goaway = peer.received()
    assert type(hello) is Hello
    assert type(goaway) is GoAway
    assert goaway.code == ErrorCode.UNSUPPORTED_VERSION
    assert f"{PROTOCOL_VERSION[0] + 1}.4" in goaway.message
    assert "{}.{}".format(*PROTOCOL_VERSION) in goaway.message


def test_the_side_turned_away_learns_why_even_before_a_hello() -> None:
    conn = MuxConnection(client=True)
    conn.initiate()
    events = conn.receive_data(
        codec.encode(GoAway(last_stream_id=0, code=ErrorCode.UNSUPPORTED_VERSION, message="no"))
    )
    assert events == [
        GoAwayReceived(last_stream_id=0, code=ErrorCode.UNSUPPORTED_VERSION, message="no")
    ]
    assert not conn.can_open_stream()


@pytest.mark.parametrize(
    ("ours", "theirs", "agreed"),
    [((1, 0), (1, 7), (1, 0)), ((1, 3), (1, 1), (1, 1)), ((1, 2), (1, 2), (1, 2))],
)
def test_minor_versions_negotiate_down(
    monkeypatch: pytest.MonkeyPatch,
    ours: tuple[int, int],
    theirs: tuple[int, int],
    agreed: tuple[int, int],
) -> None:
    monkeypatch.setattr(wire.mux, "PROTOCOL_VERSION", ours)
    conn = MuxConnection(client=True)
    peer = RawPeer(conn, version=theirs, handshake=False)
    conn.initiate()
    assert peer.handshake() == [HandshakeCompleted(version=agreed, peer_metadata={})]
    hello = peer.received()[0]
    assert type(hello) is Hello
    assert (hello.major, hello.minor) == ours


def test_unknown_settings_are_ignored_and_invalid_ones_are_a_protocol_error() -> None:
    conn = MuxConnection(client=True)
    peer = RawPeer(conn, handshake=False)
    conn.initiate()
    settings = {**Settings(initial_window=1000).to_wire(), "future_knob": "on"}
    assert kinds(peer.send(Hello(major=1, minor=0, settings=settings, metadata={}))) == [
        "HandshakeCompleted"
    ]
    assert conn.peer_settings == Settings(initial_window=1000)

    peer = RawPeer(MuxConnection(client=True), handshake=False)
    peer.conn.initiate()
    bad = Hello(major=1, minor=0, settings={"initial_window": 0}, metadata={})
    assert session_error(peer, bad).code is ErrorCode.PROTOCOL_ERROR
    peer = RawPeer(MuxConnection(client=True), handshake=False)
    peer.conn.initiate()
    bad = Hello(major=1, minor=0, settings={"max_window": "big"}, metadata={})
    assert session_error(peer, bad).code is ErrorCode.PROTOCOL_ERROR


def test_first_frame_must_be_hello_and_only_one() -> None:
    peer = RawPeer(MuxConnection(client=True), handshake=False)
    peer.conn.initiate()
    assert session_error(peer, Ping(opaque=1)).code is ErrorCode.PROTOCOL_ERROR
    peer = RawPeer(MuxConnection(client=True))
    assert (
        session_error(peer, Hello(major=1, minor=0, settings={}, metadata={})).code
        is ErrorCode.PROTOCOL_ERROR
    )


def test_limits_must_admit_the_announced_frame_payload() -> None:
    with pytest.raises(ValueError):
        MuxConnection(
            client=True,
            settings=Settings(max_frame_payload=1000),
            limits=Limits(max_frame_payload=999),
        )


# ---------------------------------------------------------------------------------------------- stream ids


def test_stream_ids_by_side_open_concurrently_without_collision() -> None:
    pair = ConnectionPair()
    client_ids = [pair.client.open_stream({"n": i}) for i in range(3)]
    server_ids = [pair.server.open_stream({"n": i}) for i in range(3)]
    assert client_ids == [1, 3, 5]
    assert server_ids == [2, 4, 6]
    client_events, server_events = pair.exchange()
    assert server_events == [
        StreamOpened(stream_id=s, metadata={"n": i}) for i, s in enumerate(client_ids)
    ]
    assert client_events == [
        StreamOpened(stream_id=s, metadata={"n": i}) for i, s in enumerate(server_ids)
    ]
    for sid in client_ids:
        pair.server.accept_stream(sid)
    for sid in server_ids:
        pair.client.accept_stream(sid)
    pair.exchange()
    for conn in (pair.client, pair.server):
        assert {i.stream_id: i.state for i in conn.streams()} == dict.fromkeys(
            client_ids + server_ids, S.OPEN
        )
        assert conn.local_stream_count == conn.peer_stream_count == 3
    assert [i.local for i in pair.client.streams()] == [True] * 3 + [False] * 3


def test_metadata_round_trips_typed() -> None:
    pair = ConnectionPair()
    meta = {
        "method": "GET",
        "path": "/api/v1/pods",
        "headers": [["accept", "application/json"], ["x-empty", ""]],
        "impersonate": {"user": "ci", "groups": ["a", "b"], "extra": {}},
        "body_length": -1,
        "big": 2**64 - 1,
        "ratio": 0.25,
        "flag": True,
        "none": None,
        "raw": b"\x00\xff",
    }
    sid = pair.client.open_stream(meta)
    assert pair.send(pair.client) == [StreamOpened(stream_id=sid, metadata=meta)]
    pair.server.accept_stream(sid, {"status": 200, "headers": [["content-type", "text/plain"]]})
    assert pair.send(pair.server) == [
        StreamAccepted(
            stream_id=sid, metadata={"status": 200, "headers": [["content-type", "text/plain"]]}
        )
    ]


def test_invalid_metadata_is_refused_locally_and_changes_nothing() -> None:
    pair = ConnectionPair()
    for bad in (
        {"s": {1, 2}},
        {"k": object()},
        {"n": 2**64},
        {"h": "x" * (Limits().max_string + 1)},
        {1: "int key"},
    ):
        with pytest.raises(LocalProtocolError):
            pair.client.open_stream(bad)  # type: ignore[arg-type]
    assert pair.client.data_to_send() == b""
    assert list(pair.client.streams()) == []
    assert pair.client.open_stream() == 1  # no id was used up
    pair.exchange()
    huge = {f"h{i}": "v" * 1000 for i in range(100)}  # every part fine, the frame too big
    with pytest.raises(LocalProtocolError) as info:
        pair.server.accept_stream(1, huge)
    assert info.value.code is ErrorCode.FRAME_SIZE_ERROR
    assert pair.server.stream_state(1) is S.OPEN_RECEIVED
    assert pair.server.data_to_send() == b""
    pair.server.accept_stream(1, {"ok": True})
    assert pair.send(pair.server) == [StreamAccepted(stream_id=1, metadata={"ok": True})]


# ---------------------------------------------------------------------------------------------- lifecycle


def test_refuse() -> None:
    pair = ConnectionPair()
    sid = pair.client.open_stream()
    pair.send(pair.client)
    pair.server.refuse_stream(sid, 0x105, "agent busy")
    assert pair.server.stream_state(sid) is S.CLOSED
    assert pair.send(pair.server) == [
        StreamRefused(stream_id=sid, code=0x105, message="agent busy")
    ]
    assert pair.client.stream_state(sid) is S.CLOSED
    with pytest.raises(LocalProtocolError) as info:
        pair.client.send_data(sid, b"x")
    assert info.value.code is ErrorCode.STREAM_CLOSED


def test_sent_data_is_what_the_caller_passed_even_if_its_buffer_changes_later() -> None:
    pair = ConnectionPair()
    sid = open_accepted(pair, pair.client)
    buffer = bytearray(b"mutable!")
    immutable = b"i" * 70_000  # more than one frame (64 KiB each): views into it are queued
    pair.client.send_data(sid, buffer)
    pair.client.send_data(sid, memoryview(immutable)[1000:])
    buffer[:] = b"CHANGED!"  # the caller reuses its buffer once send_data returned
    events = pair.send(pair.client)
    assert b"".join(e.data for e in events if isinstance(e, DataReceived)) == b"mutable!" + immutable[1000:]


def test_half_close_each_way() -> None:
    pair = ConnectionPair()
    sid = open_accepted(pair, pair.client)
    pair.client.send_data(sid, b"request")
    pair.client.end_stream(sid)
    assert pair.client.stream_state(sid) is S.HALF_CLOSED_LOCAL
    assert pair.send(pair.client) == [
        DataReceived(stream_id=sid, data=b"request"),
        StreamEnded(stream_id=sid),
    ]
    assert pair.server.stream_state(sid) is S.HALF_CLOSED_REMOTE
    with pytest.raises(LocalProtocolError):
        pair.client.send_data(sid, b"more")
    pair.server.send_data(sid, b"response")
    assert pair.send(pair.server) == [DataReceived(stream_id=sid, data=b"response")]
    pair.server.end_stream(sid)
    assert pair.server.stream_state(sid) is S.CLOSED
    assert pair.send(pair.server) == [StreamEnded(stream_id=sid)]
    assert pair.client.stream_state(sid) is S.CLOSED
    assert list(pair.client.streams()) == list(pair.server.streams()) == []


def test_half_close_by_the_acceptor_first() -> None:
    pair = ConnectionPair()
    sid = open_accepted(pair, pair.server)
    pair.client.end_stream(sid)
    assert pair.send(pair.client) == [StreamEnded(stream_id=sid)]
    assert pair.server.stream_state(sid) is S.HALF_CLOSED_REMOTE
    assert pair.client.stream_state(sid) is S.HALF_CLOSED_LOCAL
    pair.server.send_data(sid, b"still flowing")
    assert pair.send(pair.server) == [DataReceived(stream_id=sid, data=b"still flowing")]


def test_reset_either_way_and_after_half_close() -> None:
    pair = ConnectionPair()
    sid = open_accepted(pair, pair.client)
    pair.client.reset_stream(sid, ErrorCode.CANCEL, "bye")
    assert pair.send(pair.client) == [
        StreamReset(stream_id=sid, code=ErrorCode.CANCEL, message="bye", remote=True)
    ]
    assert pair.client.stream_state(sid) is pair.server.stream_state(sid) is S.CLOSED
    pair.client.reset_stream(sid)  # already closed: a no-op, both sides may race to reset
    assert pair.client.data_to_send() == b""

    sid = open_accepted(pair, pair.client)
    pair.client.end_stream(sid)
    pair.send(pair.client)
    pair.server.reset_stream(sid, 0x200, "upstream died")  # half-closed-remote → reset
    assert pair.send(pair.server) == [
        StreamReset(stream_id=sid, code=0x200, message="upstream died", remote=True)
    ]
    assert pair.client.stream_state(sid) is S.CLOSED

    sid = open_accepted(pair, pair.server)
    pair.server.end_stream(sid)
    pair.server.reset_stream(sid)  # half-closed-local → reset ("stop sending")
    assert kinds(pair.send(pair.server)) == ["StreamEnded", "StreamReset"]


def test_late_frames_on_a_reset_stream_are_ignored() -> None:
    pair = ConnectionPair()
    sid = open_accepted(pair, pair.client)
    pair.server.send_data(sid, b"in flight")
    pair.server.end_stream(sid)
    pair.client.reset_stream(sid)
    assert pair.send(pair.server) == []  # data and half-close for a stream the client already reset
    assert kinds(pair.send(pair.client)) == ["StreamReset"]
    assert pair.client.error is pair.server.error is None


def test_reset_messages_are_clipped_and_codes_checked() -> None:
    pair = ConnectionPair()
    sid = open_accepted(pair, pair.client)
    pair.client.reset_stream(sid, ErrorCode.INTERNAL_ERROR, "é" * 5000)
    (event,) = pair.send(pair.client)
    assert isinstance(event, StreamReset)
    assert 0 < len(event.message.encode()) <= 1024
    sid = open_accepted(pair, pair.client)
    for bad in (-1, 2**32):
        with pytest.raises(LocalProtocolError):
            pair.client.reset_stream(sid, bad)
    assert pair.client.stream_state(sid) is S.OPEN


def test_opener_may_send_before_accept_but_not_the_acceptor() -> None:
    pair = ConnectionPair()
    sid = pair.client.open_stream({"method": "POST"})
    assert pair.client.send_data(sid, b"body") == 4
    pair.client.end_stream(sid)
    assert pair.client.stream_state(sid) is S.OPEN_SENT_LOCAL_CLOSED
    assert pair.send(pair.client) == [
        StreamOpened(stream_id=sid, metadata={"method": "POST"}),
        DataReceived(stream_id=sid, data=b"body"),
        StreamEnded(stream_id=sid),
    ]
    assert pair.server.stream_state(sid) is S.OPEN_RECEIVED_REMOTE_CLOSED
    with pytest.raises(LocalProtocolError):
        pair.server.send_data(sid, b"too early")
    with pytest.raises(LocalProtocolError):
        pair.server.end_stream(sid)
    pair.server.accept_stream(sid)
    assert pair.server.stream_state(sid) is S.HALF_CLOSED_REMOTE
    pair.server.send_data(sid, b"ok")
    assert pair.send(pair.server) == [
        StreamAccepted(stream_id=sid, metadata={}),
        DataReceived(stream_id=sid, data=b"ok"),
    ]
    assert pair.client.stream_state(sid) is S.HALF_CLOSED_LOCAL


def test_an_acceptor_sending_before_accept_gets_its_stream_reset() -> None:
    conn = MuxConnection(client=True)
    peer = RawPeer(conn)
    sid = conn.open_stream()
    peer.received()
    reset = local_reset(
        peer.send(Data(stream_id=sid, payload=b"early")), sid, ErrorCode.STREAM_CLOSED
    )
    assert peer.received() == [
        Reset(stream_id=sid, code=ErrorCode.STREAM_CLOSED, message=reset.message)
    ]
    assert conn.error is None


# ---------------------------------------------------------------------------------------------- concurrency


def test_max_concurrent_streams_local_open_over_the_peers_limit() -> None:
    pair = ConnectionPair(server_settings=Settings(max_concurrent_streams=2))
    a = open_accepted(pair, pair.client)
    pair.client.open_stream()
    assert not pair.client.can_open_stream()
    with pytest.raises(LocalProtocolError) as info:
        pair.client.open_stream()
    assert info.value.code is ErrorCode.LIMIT_EXCEEDED
    pair.client.reset_stream(a)
    assert pair.client.can_open_stream()
    pair.exchange()
    assert pair.client.open_stream() == 5
    # the server's own opens count against the client's (default) limit, not its own
    assert [pair.server.open_stream() for _ in range(3)] == [2, 4, 6]


def test_max_concurrent_streams_peer_over_the_limit_is_refused() -> None:
    conn = MuxConnection(client=False, settings=Settings(max_concurrent_streams=2))
    peer = RawPeer(conn)
    events = peer.send(Open(stream_id=1), Open(stream_id=3), Open(stream_id=5))
    assert kinds(events) == ["StreamOpened", "StreamOpened"]
    (refuse,) = peer.received()
    assert type(refuse) is Refuse
    assert (refuse.stream_id, refuse.code) == (5, ErrorCode.REFUSED_STREAM)
    assert conn.streams_refused == 1
    assert conn.stream_state(5) is S.CLOSED
    assert (
        peer.send(Data(stream_id=5, payload=b"in flight")) == []
    )  # late frames for it are ignored
    conn.refuse_stream(1)
    assert kinds(peer.send(Open(stream_id=7))) == ["StreamOpened"]
    assert conn.error is None


# ---------------------------------------------------------------------------------------------- flow control


def test_data_beyond_the_window_resets_only_that_stream() -> None:
    conn = MuxConnection(client=False, settings=Settings(initial_window=100, max_window=100))
    peer = RawPeer(conn)
    peer.send(Open(stream_id=1), Open(stream_id=3))
    conn.accept_stream(1)
    conn.accept_stream(3)
    peer.received()
    assert peer.send(
        Data(stream_id=1, payload=b"a" * 60), Data(stream_id=1, payload=b"a" * 40)
    ) == [
        DataReceived(stream_id=1, data=b"a" * 60),
        DataReceived(stream_id=1, data=b"a" * 40),
    ]
    (event,) = peer.send(Data(stream_id=1, payload=b"!"))
    assert isinstance(event, StreamReset)
    assert (event.stream_id, event.code, event.remote) == (1, ErrorCode.FLOW_CONTROL_ERROR, False)
    assert peer.received() == [
        Reset(stream_id=1, code=ErrorCode.FLOW_CONTROL_ERROR, message=event.message)
    ]
    assert conn.stream_state(1) is S.CLOSED
    assert peer.send(Data(stream_id=3, payload=b"b" * 100)) == [
        DataReceived(stream_id=3, data=b"b" * 100)
    ]
    assert conn.stream_state(3) is S.OPEN
    assert conn.error is None


def test_credit_returns_only_after_the_application_consumed() -> None:
    pair = ConnectionPair(server_settings=Settings(initial_window=1000, max_window=1000))
    sid = open_accepted(pair, pair.client)
    assert pair.client.send_window(sid) == 1000
    assert pair.client.send_data(sid, b"x" * 1500) == 1000
    assert pair.client.send_data(sid, b"x") == 0
    assert pair.client.send_window(sid) == 0
    pair.send(pair.client)
    assert info(pair.server, sid).buffered == 1000
    assert pair.send(pair.server) == []  # received is not consumed: no credit yet
    pair.server.acknowledge_received_data(sid, 400)
    assert pair.send(pair.server) == []  # under half a window: batched
    pair.server.acknowledge_received_data(sid, 100)
    assert pair.send(pair.server) == [WindowUpdated(stream_id=sid, increment=500)]
    assert pair.client.send_window(sid) == 500
    assert info(pair.server, sid).buffered == 500
    with pytest.raises(LocalProtocolError):
        pair.server.acknowledge_received_data(sid, 501)


def test_data_splits_into_frames_of_the_peers_max_payload() -> None:
    conn = MuxConnection(client=True)
    peer = RawPeer(conn, settings=Settings(max_frame_payload=1000))
    sid = conn.open_stream()
    assert conn.send_data(sid, b"z" * 2500) == 2500
    assert [len(f.payload) for f in peer.received() if type(f) is Data] == [1000, 1000, 500]


def test_window_auto_grows_when_consumed_fast_relative_to_rtt_never_past_max() -> None:
    pair = ConnectionPair(server_settings=Settings(initial_window=1000, max_window=5000))
    sid = open_accepted(pair, pair.client)
    pair.server.ping(now=0.0)
    pair.now = 0.1
    pair.exchange()
    assert pair.server.rtt == pytest.approx(0.1)

    def round_trip(consumed_at: float) -> int:
        window = pair.client.send_window(sid)
        assert pair.client.send_data(sid, b"d" * window) == window
        pair.send(pair.client)
        pair.server.acknowledge_received_data(sid, window, now=consumed_at)
        pair.send(pair.server)
        info = pair.server.stream_info(sid)
        assert info is not None
        assert pair.client.send_window(sid) == info.recv_window  # sender and receiver agree
        return info.recv_window

    assert round_trip(1.0) == 1000  # first update: nothing to compare with yet
    assert round_trip(1.05) == 2000  # a whole window within 2 rtt: the window limits throughput
    assert round_trip(1.10) == 4000
    assert round_trip(1.15) == 5000  # capped at max_window
    assert round_trip(1.20) == 5000
    assert round_trip(9.00) == 5000  # slow consumer: no growth (and never shrinks)


def test_slow_consumer_does_not_grow_the_window() -> None:
    pair = ConnectionPair(server_settings=Settings(initial_window=1000, max_window=8000))
    sid = open_accepted(pair, pair.client)
    pair.server.ping(now=0.0)
    pair.now = 0.01
    pair.exchange()
    for t in (1.0, 2.0, 3.0):
        pair.client.send_data(sid, b"s" * pair.client.send_window(sid))
        pair.send(pair.client)
        pair.server.acknowledge_received_data(sid, 1000, now=t)
        pair.send(pair.server)
    assert info(pair.server, sid).recv_window == 1000


def test_window_update_past_2_31_resets_the_stream() -> None:
    conn = MuxConnection(client=True)
    peer = RawPeer(conn)
    sid = conn.open_stream()
    (event,) = peer.send(WindowUpdate(stream_id=sid, increment=2**31 - 1))
    assert isinstance(event, StreamReset)
    assert event.code == ErrorCode.FLOW_CONTROL_ERROR
    assert conn.error is None


def test_credit_granted_before_accept_counts() -> None:
    conn = MuxConnection(client=False, settings=Settings())
    peer = RawPeer(conn, settings=Settings(initial_window=10))
    peer.send(Open(stream_id=1))
    assert peer.send(WindowUpdate(stream_id=1, increment=5)) == [
        WindowUpdated(stream_id=1, increment=5)
    ]
    conn.accept_stream(1)
    assert conn.send_window(1) == 15


# ---------------------------------------------------------------------------------------------- ping


def test_ping_pong_reports_rtt() -> None:
    pair = ConnectionPair()
    pair.now = 1.0
    opaque = pair.client.ping(now=1.0)
    assert pair.send(pair.client) == []  # the pong is automatic
    pair.now = 1.25
    assert pair.send(pair.server) == [PongReceived(opaque=opaque, rtt=0.25)]
    assert pair.client.rtt == 0.25
    untimed = pair.client.ping()
    pair.exchange()
    assert pair.send(pair.server) == []
    assert pair.client.rtt == 0.25
    conn = MuxConnection(client=True)
    peer = RawPeer(conn)
    assert peer.send(Pong(opaque=untimed + 99)) == [PongReceived(opaque=untimed + 99, rtt=None)]


def test_untimed_ping_pong_has_no_rtt() -> None:
    pair = ConnectionPair()
    opaque = pair.client.ping()
    client_events, _ = pair.exchange()
    assert client_events == [PongReceived(opaque=opaque, rtt=None)]
    assert pair.client.rtt is None


def test_every_ping_is_answered_with_its_opaque() -> None:
    conn = MuxConnection(client=False)
    peer = RawPeer(conn)
    peer.received()
    assert peer.send(Ping(opaque=0), Ping(opaque=2**64 - 1)) == []
    assert peer.received() == [Pong(opaque=0), Pong(opaque=2**64 - 1)]


# ---------------------------------------------------------------------------------------------- goaway


def test_goaway_drains_in_flight_streams_and_refuses_new_ones() -> None:
    pair = ConnectionPair()
    sid = open_accepted(pair, pair.client)
    unprocessed = pair.client.open_stream()  # still in the client's queue when the server drains
    pair.server.goaway(ErrorCode.NO_ERROR, "restarting")
    assert pair.send(pair.server) == [
        StreamRefused(
            stream_id=unprocessed,
            code=ErrorCode.REFUSED_STREAM,
            message="not processed before GOAWAY",
        ),
        GoAwayReceived(last_stream_id=sid, code=ErrorCode.NO_ERROR, message="restarting"),
    ]
    assert pair.client.stream_state(unprocessed) is S.CLOSED
    assert not pair.client.can_open_stream()
    with pytest.raises(LocalProtocolError):
        pair.client.open_stream()
    with pytest.raises(LocalProtocolError):
        pair.server.open_stream()
    # the OPEN that crossed the GOAWAY is refused by the server, silently for the client
    assert pair.send(pair.client) == []
    assert pair.server.streams_refused == 1
    assert pair.send(pair.server) == []
    # the in-flight stream finishes normally
    pair.client.send_data(sid, b"last request")
    pair.client.end_stream(sid)
    assert kinds(pair.send(pair.client)) == ["DataReceived", "StreamEnded"]
    pair.server.send_data(sid, b"last response")
    pair.server.end_stream(sid)
    assert kinds(pair.send(pair.server)) == ["DataReceived", "StreamEnded"]
    assert list(pair.client.streams()) == list(pair.server.streams()) == []
    assert pair.client.error is pair.server.error is None


def test_goaway_names_the_last_peer_stream_seen() -> None:
    conn = MuxConnection(client=False)
    peer = RawPeer(conn)
    peer.send(Open(stream_id=1), Open(stream_id=7))
    peer.received()
    conn.goaway()
    conn.goaway()  # a second graceful GOAWAY adds nothing
    assert peer.received() == [GoAway(last_stream_id=7, code=ErrorCode.NO_ERROR, message="")]
    assert peer.send(Open(stream_id=9)) == []
    assert peer.received() == [
        Refuse(stream_id=9, code=ErrorCode.REFUSED_STREAM, message="draining")
    ]


# ---------------------------------------------------------------------------------------------- bad peers


def raw(client: bool = True) -> RawPeer:
    return RawPeer(MuxConnection(client=client))


@pytest.mark.parametrize(
    "frame",
    [
        Data(stream_id=99, payload=b"x"),  # odd: an id of the client's own it never used
        Data(stream_id=98, payload=b"x"),  # even: an id the server never opened
        HalfClose(stream_id=98),
        Reset(stream_id=98, code=0, message=""),
        WindowUpdate(stream_id=98, increment=1),
        Accept(stream_id=97, metadata={}),
        Refuse(stream_id=97, code=6, message=""),
    ],
)
def test_frames_on_never_opened_streams_are_session_errors(frame: Frame) -> None:
    assert session_error(raw(client=True), frame).code is ErrorCode.PROTOCOL_ERROR


def test_open_with_the_wrong_parity_or_a_reused_id_is_a_session_error() -> None:
    assert session_error(raw(client=False), Open(stream_id=2)).code is ErrorCode.PROTOCOL_ERROR
    peer = raw(client=False)
    peer.send(Open(stream_id=5))
    assert session_error(peer, Open(stream_id=5)).code is ErrorCode.PROTOCOL_ERROR
    peer = raw(client=False)
    peer.send(Open(stream_id=5))
    assert session_error(peer, Open(stream_id=3)).code is ErrorCode.PROTOCOL_ERROR


def test_accept_of_a_stream_the_peer_opened_itself_is_a_session_error() -> None:
    peer = raw(client=False)
    peer.send(Open(stream_id=1))
    assert session_error(peer, Accept(stream_id=1, metadata={})).code is ErrorCode.PROTOCOL_ERROR


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\x92\x0b\x01", ErrorCode.PROTOCOL_ERROR),  # unknown kind 11
        (b"\x92\x04\x01", ErrorCode.PROTOCOL_ERROR),  # DATA missing its payload
        (b"\xc1", ErrorCode.PROTOCOL_ERROR),  # never-used msgpack byte
        (b"\x93\x04\x01\xc6\x7f\xff\xff\xff" + b"\0" * 200_000, ErrorCode.FRAME_SIZE_ERROR),
    ],
)
def test_undecodable_input_is_a_session_error(data: bytes, code: ErrorCode) -> None:
    assert session_error(raw(), data=data).code is code


def test_a_truncated_frame_yields_nothing_until_it_completes() -> None:
    conn = MuxConnection(client=True)
    peer = RawPeer(conn)
    sid = conn.open_stream()
    peer.send(Accept(stream_id=sid, metadata={}))
    data = codec.encode(Data(stream_id=sid, payload=b"0123456789"))
    assert peer.send_bytes(data[:-1]) == []
    assert peer.send_bytes(data[-1:]) == [DataReceived(stream_id=sid, data=b"0123456789")]


@pytest.mark.parametrize(
    ("setup", "frame"),
    [
        ("half-closed-remote", Data(stream_id=1, payload=b"after FIN")),
        ("half-closed-remote", HalfClose(stream_id=1)),
        ("open", Accept(stream_id=1, metadata={})),
        ("open", Refuse(stream_id=1, code=6, message="")),
    ],
)
def test_frames_a_stream_state_forbids_reset_only_that_stream(setup: str, frame: Frame) -> None:
    conn = MuxConnection(client=True)
    peer = RawPeer(conn)
    sid = conn.open_stream()
    other = conn.open_stream()
    peer.send(Accept(stream_id=sid, metadata={}), Accept(stream_id=other, metadata={}))
    if setup == "half-closed-remote":
        peer.send(HalfClose(stream_id=sid))
    peer.received()
    (event,) = peer.send(frame)
    assert isinstance(event, StreamReset)
    assert (event.stream_id, event.code, event.remote) == (sid, ErrorCode.STREAM_CLOSED, False)
    assert [type(f) for f in peer.received()] == [Reset]
    assert conn.stream_state(other) is S.OPEN
    assert conn.error is None


# ---------------------------------------------------------------------------------------------- the state table


def reach(state: StreamState, local: bool) -> tuple[MuxConnection, RawPeer, int]:
    """A connection (the client) with one stream in ``state``, opened by it (local) or its peer."""
    conn = MuxConnection(client=True)
    peer = RawPeer(conn)
    if local:
        sid = conn.open_stream()
        path = {
            S.OPEN_SENT: [],
            S.OPEN_SENT_LOCAL_CLOSED: ["end"],
            S.OPEN: ["accepted"],
            S.HALF_CLOSED_LOCAL: ["accepted", "end"],
            S.HALF_CLOSED_REMOTE: ["accepted", "fin"],
            S.CLOSED: ["accepted", "reset"],
        }[state]
    else:
        sid = 2
        peer.send(Open(stream_id=sid))
        path = {
            S.OPEN_RECEIVED: [],
            S.OPEN_RECEIVED_REMOTE_CLOSED: ["fin"],
            S.OPEN: ["accept"],
            S.HALF_CLOSED_LOCAL: ["accept", "end"],
            S.HALF_CLOSED_REMOTE: ["accept", "fin"],
            S.CLOSED: ["accept", "reset"],
        }[state]
    for step in path:
        match step:
            case "end":
                conn.end_stream(sid)
            case "accepted":
                peer.send(Accept(stream_id=sid, metadata={}))
            case "accept":
                conn.accept_stream(sid)
            case "fin":
                peer.send(HalfClose(stream_id=sid))
            case "reset":
                conn.reset_stream(sid)
    assert conn.stream_state(sid) is state
    peer.received()
    return conn, peer, sid


def no_events(
    call: Callable[[MuxConnection, int], object],
) -> Callable[[MuxConnection, RawPeer, int], list[Event]]:
    def apply(conn: MuxConnection, peer: RawPeer, sid: int) -> list[Event]:
        call(conn, sid)
        return []

    return apply


INPUTS: dict[StreamInput, Callable[[MuxConnection, RawPeer, int], list[Event]]] = {
    I.SEND_ACCEPT: no_events(MuxConnection.accept_stream),
    I.SEND_REFUSE: no_events(MuxConnection.refuse_stream),
    I.SEND_DATA: no_events(lambda c, s: c.send_data(s, b"x")),
    I.SEND_HALF_CLOSE: no_events(MuxConnection.end_stream),
    I.SEND_RESET: no_events(MuxConnection.reset_stream),
    I.RECV_OPEN: lambda c, p, s: p.send(Open(stream_id=s)),
    I.RECV_ACCEPT: lambda c, p, s: p.send(Accept(stream_id=s, metadata={})),
    I.RECV_REFUSE: lambda c, p, s: p.send(Refuse(stream_id=s, code=6, message="")),
    I.RECV_DATA: lambda c, p, s: p.send(Data(stream_id=s, payload=b"x")),
    I.RECV_HALF_CLOSE: lambda c, p, s: p.send(HalfClose(stream_id=s)),
    I.RECV_RESET: lambda c, p, s: p.send(Reset(stream_id=s, code=8, message="")),
}
REACHABLE = [
    (state, local)
    for state in StreamState
    for local in (True, False)
    if state
    not in (
        (S.OPEN_SENT, S.OPEN_SENT_LOCAL_CLOSED)
        if not local
        else (S.OPEN_RECEIVED, S.OPEN_RECEIVED_REMOTE_CLOSED)
    )
]
EXPECTED_FRAME = {
    I.SEND_ACCEPT: Accept,
    I.SEND_REFUSE: Refuse,
    I.SEND_DATA: Data,
    I.SEND_HALF_CLOSE: HalfClose,
    I.SEND_RESET: Reset,
}
EXPECTED_EVENT = {
    I.RECV_ACCEPT: StreamAccepted,
    I.RECV_REFUSE: StreamRefused,
    I.RECV_DATA: DataReceived,
    I.RECV_HALF_CLOSE: StreamEnded,
    I.RECV_RESET: StreamReset,
}


@pytest.mark.parametrize(
    ("state", "local"),
    REACHABLE,
    ids=[f"{s.value}-{'local' if loc else 'remote'}" for s, loc in REACHABLE],
)
@pytest.mark.parametrize("event", list(INPUTS), ids=[i.value for i in INPUTS])
def test_state_table_every_state_and_input(
    state: StreamState, local: bool, event: StreamInput
) -> None:
    conn, peer, sid = reach(state, local)
    target = TRANSITIONS.get((state, event))
    if state is S.CLOSED:
        # a stream that existed and closed: the API refuses, late peer frames are ignored
        if event.value.startswith("send"):
            if event is I.SEND_RESET:
                INPUTS[event](conn, peer, sid)  # a no-op: both sides may race to reset
            else:
                with pytest.raises(LocalProtocolError) as info:
                    INPUTS[event](conn, peer, sid)
                assert info.value.code is ErrorCode.STREAM_CLOSED
            assert peer.received() == []
        elif event is I.RECV_OPEN:
            with pytest.raises(RemoteProtocolError):
                INPUTS[event](conn, peer, sid)
        else:
            assert INPUTS[event](conn, peer, sid) == []
            assert peer.received() == []
            assert conn.error is None
        return
    if target is not None:
        events = INPUTS[event](conn, peer, sid)
        assert conn.stream_state(sid) is target
        if event in EXPECTED_FRAME:
            assert [type(f) for f in peer.received()] == [EXPECTED_FRAME[event]]
            assert events == []
        else:
            assert [type(e) for e in events] == [EXPECTED_EVENT[event]]
            assert not any(isinstance(e, StreamReset) and not e.remote for e in events)
        return
    # not in the table: the mux rejects it
    if event.value.startswith("send"):
        with pytest.raises(LocalProtocolError):
            INPUTS[event](conn, peer, sid)
        assert conn.stream_state(sid) is state  # nothing changed, nothing sent
        assert peer.received() == []
    else:
        try:
            events = INPUTS[event](conn, peer, sid)
        except RemoteProtocolError:
            assert type(goaway_sent(peer)) is GoAway
        else:
            local_reset(events, sid, ErrorCode.STREAM_CLOSED)
            assert conn.stream_state(sid) is S.CLOSED
            assert [type(f) for f in peer.received()] == [Reset]


def test_the_table_only_opens_from_nothing_and_never_leaves_closed() -> None:
    assert {k: v for k, v in TRANSITIONS.items() if k[0] is None} == {
        (None, I.SEND_OPEN): S.OPEN_SENT,
        (None, I.RECV_OPEN): S.OPEN_RECEIVED,
    }
    assert not [k for k in TRANSITIONS if k[0] is S.CLOSED]
    assert not [k for k in TRANSITIONS if k[1] in (I.SEND_OPEN, I.RECV_OPEN) and k[0] is not None]


def test_send_data_counts_bytes_of_any_buffer() -> None:
    pair = ConnectionPair(server_settings=Settings(initial_window=10, max_window=10))
    sid = open_accepted(pair, pair.client)
    words = memoryview(array.array("H", range(8)))  # 8 items, 16 bytes
    assert pair.client.send_data(sid, words) == 10
    (event,) = pair.send(pair.client)
    assert event == DataReceived(stream_id=sid, data=words.tobytes()[:10])


# ---------------------------------------------------------------------------- NOTICE (protocol 1.1)


def test_a_notice_reaches_a_1_1_peer_as_an_event() -> None:
    pair = ConnectionPair()
    assert pair.server.version == (1, 1)
    assert pair.server.notice({"type": "placement", "home": "a:1"}) is True
    assert pair.send(pair.server) == [NoticeReceived(metadata={"type": "placement", "home": "a:1"})]


def test_no_notice_is_sent_to_a_1_0_peer() -> None:
    conn = MuxConnection(client=False)
    peer = RawPeer(conn, version=(1, 0))  # an agentd from before NOTICE
    assert conn.version == (1, 0)
    assert conn.notice({"type": "placement"}) is False
    assert conn.data_to_send() == b""  # nothing queued that would end its session
    assert peer.received() == []


def test_a_notice_over_the_control_frame_limit_fails_only_the_call() -> None:
    pair = ConnectionPair()
    with pytest.raises(UnsendableFrameError):
        pair.server.notice({"type": "placement", "pad": "x" * (pair.server.limits.max_control_frame + 1)})
    assert pair.server.notice({"type": "ok"}) is True
