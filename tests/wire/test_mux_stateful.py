"""A stateful model of two well-behaved peers over a fake link with a byte queue per direction.

Rules open, accept, refuse, send, half-close, reset, consume, ping and goaway on either side, and
deliver any prefix of the pending bytes in any chunking. Invariants: stream bytes arrive exactly once
and in order (a prefix of what was sent, all of it by the FIN), windows stay within their bounds, no
well-behaved exchange ever causes a stream or session error, and once the link is drained both sides
agree on every stream's state and on its credit.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import event as note_event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from wire.errors import LocalProtocolError
from wire.events import (
    DataReceived,
    Event,
    GoAwayReceived,
    HandshakeCompleted,
    PongReceived,
    StreamAccepted,
    StreamEnded,
    StreamOpened,
    StreamRefused,
    StreamReset,
    WindowUpdated,
)
from wire.mux import MuxConnection
from wire.settings import Settings
from wire.streamstate import LOCAL_OPEN, REMOTE_OPEN, StreamState

S = StreamState
_Rule = TypeVar("_Rule", bound=Callable[..., None])
#: what the other side's state must be once the link is drained
MIRROR = {
    S.OPEN_SENT: S.OPEN_RECEIVED,
    S.OPEN_SENT_LOCAL_CLOSED: S.OPEN_RECEIVED_REMOTE_CLOSED,
    S.OPEN_RECEIVED: S.OPEN_SENT,
    S.OPEN_RECEIVED_REMOTE_CLOSED: S.OPEN_SENT_LOCAL_CLOSED,
    S.OPEN: S.OPEN,
    S.HALF_CLOSED_LOCAL: S.HALF_CLOSED_REMOTE,
    S.HALF_CLOSED_REMOTE: S.HALF_CLOSED_LOCAL,
    S.CLOSED: S.CLOSED,
}
SIDES = st.sampled_from([0, 1])
PENDING = frozenset({S.OPEN_RECEIVED, S.OPEN_RECEIVED_REMOTE_CLOSED})
MAY_END = frozenset({S.OPEN_SENT, S.OPEN, S.HALF_CLOSED_REMOTE})


def having(states: frozenset[StreamState]) -> Callable[[_Rule], _Rule]:
    """Enable a rule only while some stream on either side is in one of ``states``."""
    return precondition(
        lambda self: any(i.state in states for conn in self.conns for i in conn.streams())
    )


settings_strategy = st.builds(
    lambda window, growth, payload, streams: Settings(
        initial_window=window,
        max_window=window * growth,
        max_frame_payload=payload,
        max_concurrent_streams=streams,
    ),
    window=st.sampled_from([8, 100, 1000]),
    growth=st.sampled_from([1, 2, 8]),
    payload=st.sampled_from([4, 64, 1024]),
    streams=st.sampled_from([1, 3, 100]),
)


class TwoPeers(RuleBasedStateMachine):
    @initialize(a=settings_strategy, b=settings_strategy)
    def handshake(self, a: Settings, b: Settings) -> None:
        self.conns = [
            MuxConnection(client=True, settings=a),
            MuxConnection(client=False, settings=b),
        ]
        self.links = [bytearray(), bytearray()]  # links[i]: bytes from side i not yet delivered
        self.now = 0.0
        self.sent: dict[tuple[int, int], bytearray] = defaultdict(
            bytearray
        )  # (side, sid) -> bytes sent
        self.received: dict[tuple[int, int], bytearray] = defaultdict(
            bytearray
        )  # (side, sid) -> received
        self.unconsumed: dict[tuple[int, int], int] = defaultdict(int)
        self.ended: set[tuple[int, int]] = set()  # (receiving side, sid) that saw the peer's FIN
        self.aborted: set[int] = set()  # reset or refused: bytes may be lost
        self.metadata: dict[int, dict[str, int]] = {}
        for conn in self.conns:
            conn.initiate()
        self.drain()
        assert all(conn.version is not None for conn in self.conns)

    # ------------------------------------------------------------------ the link

    def flush(self) -> None:
        for side, conn in enumerate(self.conns):
            self.links[side] += conn.data_to_send()

    def deliver_bytes(self, side: int, count: int, chunk: int) -> None:
        """Deliver ``count`` bytes sent by ``side`` to the other side, ``chunk`` bytes at a time."""
        link = self.links[side]
        data = bytes(link[:count])
        del link[:count]
        for start in range(0, len(data), chunk):
            events = self.conns[1 - side].receive_data(data[start : start + chunk], self.now)
            self.on_events(1 - side, events)

    def drain(self) -> None:
        self.flush()
        while any(self.links):
            for side in (0, 1):
                self.deliver_bytes(side, len(self.links[side]), max(len(self.links[side]), 1))
            self.now += 0.005  # link latency: gives pings a round-trip time
            self.flush()

    def drained(self) -> bool:
        return not any(self.links) and not any(conn.outbound_size for conn in self.conns)

    def on_events(self, side: int, events: list[Event]) -> None:
        for event in events:
            match event:
                case DataReceived(stream_id=sid, data=data):
                    self.received[(side, sid)] += data
                    self.unconsumed[(side, sid)] += len(data)
                    # in order, exactly once: always a prefix of what the peer sent
                    assert self.sent[(1 - side, sid)].startswith(self.received[(side, sid)])
                case StreamEnded(stream_id=sid):
                    self.ended.add((side, sid))
                    note_event("FIN after data checked")
                    assert self.received[(side, sid)] == self.sent[(1 - side, sid)]
                case StreamOpened(stream_id=sid, metadata=metadata):
                    assert metadata == self.metadata[sid]
                case StreamReset(stream_id=sid, remote=remote):
                    assert remote, f"a well-behaved peer caused a stream error: {event}"
                    self.aborted.add(sid)
                case StreamRefused(stream_id=sid):
                    self.aborted.add(sid)
                case WindowUpdated(increment=increment):
                    if increment > self.conns[1 - side].local_settings.initial_window:
                        note_event("a window auto-grew")
                case StreamAccepted() | PongReceived() | GoAwayReceived() | HandshakeCompleted():
                    pass

    # ------------------------------------------------------------------ rules

    def pick(
        self, data: st.DataObject, side: int, states: frozenset[StreamState] | set[StreamState]
    ) -> int | None:
        candidates = sorted(i.stream_id for i in self.conns[side].streams() if i.state in states)
        return data.draw(st.sampled_from(candidates)) if candidates else None

    @rule(side=SIDES, n=st.integers(0, 3))
    def open(self, side: int, n: int) -> None:
        conn = self.conns[side]
        if conn.can_open_stream():
            sid = conn.open_stream({"n": n})
            self.metadata[sid] = {"n": n}
            assert conn.stream_state(sid) is S.OPEN_SENT
        else:
            try:
                conn.open_stream()
            except LocalProtocolError:
                pass
            else:
                raise AssertionError("open_stream succeeded although can_open_stream said no")

    @having(PENDING)
    @rule(side=SIDES, data=st.data())
    def accept(self, side: int, data: st.DataObject) -> None:
        sid = self.pick(data, side, {S.OPEN_RECEIVED, S.OPEN_RECEIVED_REMOTE_CLOSED})
        if sid is not None:
            self.conns[side].accept_stream(sid, {"ok": 1})

    @having(PENDING)
    @rule(side=SIDES, data=st.data())
    def refuse(self, side: int, data: st.DataObject) -> None:
        sid = self.pick(data, side, {S.OPEN_RECEIVED, S.OPEN_RECEIVED_REMOTE_CLOSED})
        if sid is not None:
            self.conns[side].refuse_stream(sid)
            self.aborted.add(sid)

    @having(LOCAL_OPEN)
    @rule(side=SIDES, data=st.data(), payload=st.binary(max_size=300))
    def send(self, side: int, data: st.DataObject, payload: bytes) -> None:
        sid = self.pick(data, side, LOCAL_OPEN)
        if sid is None:
            return
        self.send_payload(side, sid, payload)

    def send_payload(self, side: int, sid: int, payload: bytes) -> None:
        conn = self.conns[side]
        window = conn.send_window(sid)
        taken = conn.send_data(sid, payload)
        assert taken == min(window, len(payload))
        assert conn.send_window(sid) == window - taken
        self.sent[(side, sid)] += payload[:taken]

    @having(MAY_END)
    @rule(side=SIDES, data=st.data())
    def half_close(self, side: int, data: st.DataObject) -> None:
        sid = self.pick(data, side, {S.OPEN_SENT, S.OPEN, S.HALF_CLOSED_REMOTE})
        if sid is not None:
            self.conns[side].end_stream(sid)

    @having(frozenset(StreamState))
    @rule(side=SIDES, data=st.data())
    def reset(self, side: int, data: st.DataObject) -> None:
        sid = self.pick(data, side, set(StreamState))
        if sid is not None:
            self.conns[side].reset_stream(sid)
            self.aborted.add(sid)

    @precondition(lambda self: any(self.unconsumed.values()))
    @rule(side=SIDES, data=st.data(), fraction=st.floats(0, 1))
    def consume(self, side: int, data: st.DataObject, fraction: float) -> None:
        conn = self.conns[side]
        candidates = sorted(
            sid
            for (s, sid), n in self.unconsumed.items()
            if s == side and n and conn.stream_info(sid) is not None
        )
        if not candidates:
            return
        sid = data.draw(st.sampled_from(candidates))
        amount = max(1, int(self.unconsumed[(side, sid)] * fraction))
        conn.acknowledge_received_data(sid, amount, self.now)
        self.unconsumed[(side, sid)] -= amount

    @having(LOCAL_OPEN)
    @rule(side=SIDES, data=st.data(), rounds=st.integers(1, 4))
    def fast_transfer(self, side: int, data: st.DataObject, rounds: int) -> None:
        """A sender that fills the window and a consumer that keeps up: what makes windows grow."""
        conn, peer = self.conns[side], self.conns[1 - side]
        sid = self.pick(data, side, LOCAL_OPEN)
        if sid is None:
            return
        for _ in range(rounds):
            if conn.stream_state(sid) not in LOCAL_OPEN:
                return
            payload = bytes([sid % 251]) * conn.send_window(sid)
            self.send_payload(side, sid, payload)
            self.drain()
            if peer.stream_info(sid) is not None and self.unconsumed[(1 - side, sid)]:
                peer.acknowledge_received_data(sid, self.unconsumed[(1 - side, sid)], self.now)
                self.unconsumed[(1 - side, sid)] = 0
            self.drain()

    @rule(side=SIDES)
    def ping(self, side: int) -> None:
        self.conns[side].ping(self.now)

    @rule(side=SIDES, roll=st.integers(0, 5))
    def goaway(self, side: int, roll: int) -> None:
        # rarely: after a GOAWAY nothing new opens, which would end most of the exploration
        if roll == 0:
            self.conns[side].goaway()

    @rule(dt=st.sampled_from([0.001, 0.05, 1.0]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(side=SIDES, fraction=st.floats(0, 1), chunk=st.integers(1, 200))
    def deliver(self, side: int, fraction: float, chunk: int) -> None:
        self.flush()
        self.deliver_bytes(side, int(len(self.links[side]) * fraction), chunk)

    @rule()
    def deliver_all(self) -> None:
        self.drain()

    # ------------------------------------------------------------------ invariants

    @invariant()
    def no_session_error(self) -> None:
        for conn in self.conns:
            assert conn.error is None

    @invariant()
    def windows_within_bounds(self) -> None:
        for side, conn in enumerate(self.conns):
            for info in conn.streams():
                assert info.send_window >= 0
                assert (
                    conn.local_settings.initial_window
                    <= info.recv_window
                    <= conn.local_settings.max_window
                )
                assert 0 <= info.buffered <= info.recv_window
                # what the application was told about and has not consumed is what the mux buffers
                assert info.buffered == self.unconsumed[(side, info.stream_id)]

    @invariant()
    def stream_counts_match_the_table(self) -> None:
        # kept as counters (every OPEN checks a limit against them), so they must follow every way
        # a stream ends: close, reset, refuse, GOAWAY
        for conn in self.conns:
            local = sum(1 for info in conn.streams() if info.local)
            assert (conn.local_stream_count, conn.peer_stream_count) == (local, len(conn.open_stream_ids) - local)

    @invariant()
    def bytes_arrive_in_order(self) -> None:
        for (side, sid), got in self.received.items():
            assert self.sent[(1 - side, sid)].startswith(got)

    @invariant()
    def drained_link_means_agreement(self) -> None:
        if not self.drained():
            return
        a, b = self.conns
        tracked = set(a.open_stream_ids) | set(b.open_stream_ids)
        note_event(f"drained with {min(len(tracked), 3)}+ streams tracked")
        for sid in tracked:
            assert b.stream_state(sid) is MIRROR[a.stream_state(sid)], (
                sid,
                a.stream_state(sid),
                b.stream_state(sid),
            )
        for side, conn in enumerate(self.conns):
            peer = self.conns[1 - side]
            for info in conn.streams():
                sid = info.stream_id
                if sid not in self.aborted:
                    # nothing in flight: every byte sent has arrived, exactly once
                    assert self.received[(1 - side, sid)] == self.sent[(side, sid)]
                if info.state in LOCAL_OPEN and peer.stream_state(sid) in REMOTE_OPEN:
                    theirs = peer.stream_info(sid)
                    assert theirs is not None
                    # the sender's credit never exceeds the room the receiver has left
                    assert info.send_window <= theirs.recv_window - theirs.buffered


TwoPeers.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_two_peers = TwoPeers.TestCase
