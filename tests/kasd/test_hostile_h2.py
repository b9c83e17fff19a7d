"""Hostile HTTP/2 clients on both of kasd's HTTP/2 ports (8150 agent, 8154 proxy), crafting frames
h2 itself would never send: oversize frames, CONTINUATION floods, rapid reset, PINGs that try to
keep a connection alive. Each gets its GOAWAY (and the connection closed) within its bound, while
other clients are served, and the logs say so in a few lines, not one per stream."""

from __future__ import annotations

import logging
import struct
from typing import Any

import h2.errors
import h2.frame_buffer
import hpack
import hyperframe.frame as hf
import pytest
import trio

from daemonkit.logs import BurstLimitedLog
from kasd.k8sproxy import http2 as proxy_http2
from kasd.k8sproxy.pipeline import RequestPipeline
from tests.kasd.helpers import (
    CI_TOKEN,
    bearer,
    fake_agent,
    http_request,
    make_config,
    reply,
    running_kasd,
)
from tunnelhttp.head import RequestHead, ResponseHead
from wire import h2carrier
from wire.session import MuxStream, Session

pytestmark = pytest.mark.timeout(30)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MiB = 1 << 20
#: the client preface and an empty SETTINGS frame
OPENING = PREFACE + hf.SettingsFrame(0).serialize()


def data_frame_header(stream_id: int, length: int) -> bytes:
    """Just the 9-byte header of a DATA frame announcing ``length`` bytes (the body never follows)."""
    return struct.pack(">HBBBL", length >> 8, length & 0xFF, 0x0, 0x0, stream_id)


def ping() -> bytes:
    return hf.PingFrame(0, opaque_data=b"12345678").serialize()


def rst(stream_id: int) -> bytes:
    return hf.RstStreamFrame(stream_id, error_code=h2.errors.ErrorCodes.CANCEL).serialize()


class HostileClient:
    """Raw HTTP/2 frames to kasd (hyperframe and hpack, no h2 state machine to stop us), and what
    kasd sends back, parsed into frames."""

    def __init__(self, stream: trio.abc.Stream, *, scheme: str = "http") -> None:
        self.stream = stream
        self.scheme = scheme
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.buffer = h2.frame_buffer.FrameBuffer(server=False)
        self.buffer.max_frame_size = (1 << 24) - 1
        #: every frame kasd sent, in order; response heads decoded in ``heads``
        self.frames: list[hf.Frame] = []
        self.heads: dict[int, dict[str, str]] = {}
        self.closed = False

    @classmethod
    async def connect(cls, port: int, *, source: str | None = None) -> HostileClient:
        if source is None:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        else:  # another source address on loopback (127.0.0.2 …)
            sock = trio.socket.socket()
            await sock.bind((source, 0))
            await sock.connect(("127.0.0.1", port))
            stream = trio.SocketStream(sock)
        client = cls(stream)
        await client.send(OPENING)
        return client

    def headers(
        self, stream_id: int, headers: list[tuple[str, str]], *, end_stream: bool = True, end_headers: bool = True
    ) -> bytes:
        frame = hf.HeadersFrame(stream_id, data=self.encoder.encode(headers))
        if end_stream:
            frame.flags.add("END_STREAM")
        if end_headers:
            frame.flags.add("END_HEADERS")
        return frame.serialize()

    def request(self, stream_id: int, path: str = "/api", extra: list[tuple[str, str]] | None = None, **kw: Any) -> bytes:
        head = [(":method", "GET"), (":scheme", self.scheme), (":authority", "kasd.test"), (":path", path)]
        return self.headers(stream_id, head + (extra or []), **kw)

    async def send(self, *chunks: bytes) -> bool:
        """False once kasd closed the connection."""
        try:
            await self.stream.send_all(b"".join(chunks))
        except trio.BrokenResourceError:
            return False
        return True

    async def read(self) -> list[hf.Frame]:
        """One read's frames; [] (and ``closed``) once kasd closed the connection."""
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            self.closed = True
            return []
        self.buffer.add_data(data)
        frames = list(self.buffer)
        for frame in frames:
            if isinstance(frame, hf.HeadersFrame):
                self.heads[frame.stream_id] = {k.decode(): v.decode() for k, v in self.decoder.decode(frame.data, raw=True)}
        self.frames.extend(frames)
        return frames

    async def status(self, stream_id: int) -> int:
        while stream_id not in self.heads:
            assert await self.read() or not self.closed, f"connection closed before stream {stream_id} was answered"
        return int(self.heads[stream_id][":status"])

    async def until_closed(self) -> hf.GoAwayFrame:
        """Read until kasd closes the connection; the GOAWAY it sent before."""
        while not self.closed:
            await self.read()
        goaways = [f for f in self.frames if isinstance(f, hf.GoAwayFrame)]
        assert goaways, f"connection closed without GOAWAY; frames: {self.frames}"
        return goaways[-1]

    def count(self, kind: type[hf.Frame]) -> int:
        return sum(1 for f in self.frames if isinstance(f, kind))

    async def aclose(self) -> None:
        await self.stream.aclose()


@pytest.fixture(autouse=True)
def fresh_burst_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines a stranger repeats are written once per 10 s per source address, and every test's
    stranger is 127.0.0.1: give each test its own interval."""
    monkeypatch.setattr(proxy_http2, "_strangers", BurstLimitedLog(proxy_http2.log))
    monkeypatch.setattr(h2carrier, "_strangers", BurstLimitedLog(h2carrier.log))


def _agent_config(**agent: Any) -> Any:
    return make_config({"listeners": {
        "agent": {"address": "127.0.0.1:0", **agent},
        "observability": {"address": "127.0.0.1:0"},
        "kubernetes_api": {"address": "127.0.0.1:0"},
    }})


def _tunnel_request(client: HostileClient, stream_id: int, token: str, **kw: Any) -> bytes:
    head = [(":method", "POST"), (":scheme", "http"), (":authority", "kasd"), (":path", "/tunnel")]
    return client.headers(stream_id, [*head, ("authorization", f"Bearer {token}")], **kw)


def _log_lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


# --------------------------------------------------------------------------- oversize frames


@pytest.mark.parametrize("port_name", ["agent", "kubernetes_api"])
async def test_an_oversize_data_frame_is_refused_from_its_header(port_name: str) -> None:
    """A DATA frame announcing more than the 16 KiB advertised (1 MiB here: what the agent port
    used to advertise to anyone) gets GOAWAY FRAME_SIZE_ERROR at once: kasd does not wait for,
    nor buffer, the body."""
    async with running_kasd(_agent_config(handshake_timeout=20)) as kasd:
        client = await HostileClient.connect(kasd.port(port_name))
        headers = (
            _tunnel_request(client, 1, "no-such-token", end_stream=False)
            if port_name == "agent"
            else client.request(1, extra=[bearer(CI_TOKEN)], end_stream=False)
        )
        await client.send(headers, data_frame_header(1, MiB), b"x" * 100)
        with trio.fail_after(5):
            goaway = await client.until_closed()
        assert goaway.error_code == h2.errors.ErrorCodes.FRAME_SIZE_ERROR
        assert b"SETTINGS_MAX_FRAME_SIZE 16384" in goaway.additional_data


async def test_the_agent_port_takes_1_mib_frames_once_the_tunnel_is_accepted() -> None:
    async def big(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await reply(stream, 200, b"y" * (3 * MiB))  # in 1 MiB DATA frames from agentd to kasd

    async with running_kasd() as kasd, fake_agent(kasd, big) as agent:
        assert agent.session.transport.driver.conn.max_outbound_frame_size == MiB  # type: ignore[attr-defined]
        answer = await http_request(kasd.port("kubernetes_api"), "GET", "/big", [bearer(CI_TOKEN)])
        assert answer.status == 200 and len(answer.body) == 3 * MiB
        (tunnel,) = kasd.registry.tunnels(1)
        assert tunnel.session.transport.driver.max_inbound_frame_size == MiB  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- CONTINUATION flood


@pytest.mark.parametrize("port_name", ["agent", "kubernetes_api"])
async def test_a_continuation_flood_gets_goaway_enhance_your_calm(port_name: str) -> None:
    """A header block beyond MAX_HEADER_LIST_SIZE (16 KiB on the agent port, 64 KiB on the proxy
    port) plus slack ends the connection, whatever its frames: h2 alone would hold 64 of them."""
    async with running_kasd(_agent_config(handshake_timeout=20)) as kasd:
        client = await HostileClient.connect(kasd.port(port_name))
        start = client.request(1, end_stream=True, end_headers=False)
        pieces = 2 if port_name == "agent" else 5
        flood = [hf.ContinuationFrame(1, data=b"\x00" * 16000).serialize() for _ in range(pieces)]
        await client.send(start, *flood)
        with trio.fail_after(5):
            goaway = await client.until_closed()
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert b"header block over" in goaway.additional_data


# --------------------------------------------------------------------------- rapid reset


def _reset_config(budget: int) -> Any:
    return make_config({"listeners": {
        "agent": {"address": "127.0.0.1:0", "http2": {"reset_budget": budget}},
        "observability": {"address": "127.0.0.1:0"},
        "kubernetes_api": {"address": "127.0.0.1:0", "http2": {"reset_budget": budget}},
    }})


async def test_rapid_reset_on_the_proxy_port(caplog: pytest.LogCaptureFixture) -> None:
    """HEADERS + RST_STREAM pairs, with a token: GOAWAY ENHANCE_YOUR_CALM once the budget is spent,
    no request reaches the agent, the access log gets no line per stream, and kubectl on another
    connection is served."""
    caplog.set_level(logging.INFO)
    async with running_kasd(_reset_config(20)) as kasd, fake_agent(kasd) as agent:
        client = await HostileClient.connect(kasd.port("kubernetes_api"))
        pairs = [client.request(2 * i + 1, extra=[bearer(CI_TOKEN)]) + rst(2 * i + 1) for i in range(30)]
        await client.send(*pairs)
        with trio.fail_after(5):
            goaway = await client.until_closed()
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert b"more than 20 streams reset" in goaway.additional_data
        assert client.count(hf.HeadersFrame) == 0 and agent.heads == []  # no stream was served

        good = await http_request(kasd.port("kubernetes_api"), "GET", "/api", [bearer(CI_TOKEN)])
        assert good.status == 200
    access = _log_lines(caplog, "kasd.access")
    assert len(access) == 1 and "path=/api " in access[0]  # kubectl's line only
    summary = [m for m in _log_lines(caplog, "kasd.k8sproxy") if "dropped" in m]
    assert len(summary) == 1 and "HTTP/2 client dropped " in summary[0] and "ENHANCE_YOUR_CALM" in summary[0]


async def test_a_reset_flood_is_decoded_only_as_far_as_the_budget() -> None:
    """h2 decodes what it is fed before its resets can be counted: kasd feeds it a read of pairs
    only up to the reset beyond the budget, so the GOAWAY names a stream just past it as the last
    one processed, not the last one sent."""
    async with running_kasd(_reset_config(20)) as kasd:
        client = await HostileClient.connect(kasd.port("kubernetes_api"))
        pairs = [client.request(2 * i + 1, extra=[bearer(CI_TOKEN)]) + rst(2 * i + 1) for i in range(200)]
        await client.send(b"".join(pairs))  # 200 pairs, about 8 KiB: one read
        with trio.fail_after(5):
            goaway = await client.until_closed()
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert goaway.last_stream_id <= 2 * 21 + 1


async def test_a_source_that_spent_its_reset_budget_is_turned_away_at_accept() -> None:
    """An attacker that dials again after its GOAWAY finds its source's budget spent: the new
    connection ends at its first reset; after the third time, kasd refuses the source's connections
    at accept (no TLS handshake, no frame) until a token came back, and counts them. Another source
    address has its own budget. (One GOAWAY bars nothing: see test_rapid_reset_on_the_proxy_port.)"""
    async with running_kasd(_reset_config(20)) as kasd, fake_agent(kasd):
        port = kasd.port("kubernetes_api")
        for attempt in range(3):  # the budget, then two more dials that end at their first reset
            attacker = await HostileClient.connect(port)
            await attacker.send(*[attacker.request(2 * i + 1) + rst(2 * i + 1) for i in range(30)])
            with trio.fail_after(5):
                goaway = await attacker.until_closed()
            assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
            if attempt:
                assert goaway.last_stream_id <= 3  # no budget left for a new connection

        with trio.fail_after(5):
            try:
                again = await HostileClient.connect(port)
            except OSError:
                pass  # reset at accept, before the preface was even sent
            else:
                assert await again.read() == [] and again.closed  # reset at accept: not a frame
        refused = kasd.metrics.registry.get_sample_value(
            "kasd_connections_refused_total", {"listener": "kubernetes_api", "reason": "reset_budget"})
        assert refused == 1.0

        other = await HostileClient.connect(port, source="127.0.0.2")
        await other.send(*[other.request(2 * i + 1, extra=[bearer(CI_TOKEN)]) + rst(2 * i + 1) for i in range(10)])
        await other.send(other.request(41, extra=[bearer(CI_TOKEN)]))
        with trio.fail_after(5):
            assert await other.status(41) == 200
        assert other.count(hf.GoAwayFrame) == 0
        await other.aclose()


async def test_streams_reset_after_their_task_started_count_too(caplog: pytest.LogCaptureFixture) -> None:
    """The slow variant: each request reaches the agent before the client resets it. Each costs
    the budget, and none writes an access line of its own."""
    caplog.set_level(logging.INFO)
    arrived = trio.Event()

    async def hang(stream: MuxStream, head: RequestHead, session: Session) -> None:
        arrived.set()
        await trio.sleep_forever()

    async with running_kasd(_reset_config(3)) as kasd, fake_agent(kasd, hang) as agent:
        client = await HostileClient.connect(kasd.port("kubernetes_api"))
        for i in range(4):
            arrived = trio.Event()
            await client.send(client.request(2 * i + 1, extra=[bearer(CI_TOKEN)]))
            await arrived.wait()
            await client.send(rst(2 * i + 1))
        with trio.fail_after(5):
            goaway = await client.until_closed()
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert len(agent.heads) == 4
    assert _log_lines(caplog, "kasd.access") == []
    summary = [m for m in _log_lines(caplog, "kasd.k8sproxy") if "dropped" in m]
    assert len(summary) == 1 and "HTTP/2 client dropped 4 streams" in summary[0]


async def test_rapid_reset_on_the_agent_port(caplog: pytest.LogCaptureFixture) -> None:
    """Without a token: the pairs are never authenticated (no rejection per stream), and the
    connection gets GOAWAY ENHANCE_YOUR_CALM; the agent already connected keeps working."""
    caplog.set_level(logging.INFO)
    async with running_kasd(_reset_config(20)) as kasd, fake_agent(kasd):
        client = await HostileClient.connect(kasd.port("agent"))
        pairs = [_tunnel_request(client, 2 * i + 1, "wrong-token") + rst(2 * i + 1) for i in range(30)]
        await client.send(*pairs)
        with trio.fail_after(5):
            goaway = await client.until_closed()
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert client.count(hf.HeadersFrame) == 0
        good = await http_request(kasd.port("kubernetes_api"), "GET", "/api", [bearer(CI_TOKEN)])
        assert good.status == 200
    assert not [m for m in _log_lines(caplog, "wire.h2carrier") if "rejected" in m]


async def test_the_agent_port_closes_after_a_few_rejected_tunnel_requests(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with running_kasd(_agent_config(handshake_timeout=20)) as kasd:
        client = await HostileClient.connect(kasd.port("agent"))
        statuses = []
        for i in range(3):
            assert await client.send(_tunnel_request(client, 2 * i + 1, "wrong-token"))
            statuses.append(await client.status(2 * i + 1))
        assert statuses == [401, 401, 401]
        with trio.fail_after(5):
            goaway = await client.until_closed()
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    rejected = [m for m in _log_lines(caplog, "wire.h2carrier") if "rejected" in m]
    assert len(rejected) <= 1  # a stranger repeating a bad token gets one line per 10 s


# --------------------------------------------------------------------------- clocks PINGs do not move


async def _ping_until_closed(client: HostileClient) -> None:
    """A PING every 50 ms (pacing, not synchronisation) until kasd closes the connection."""

    async def pinger() -> None:
        while True:
            if not await client.send(ping()):
                return
            await trio.sleep(0.05)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pinger)
        while not client.closed:
            await client.read()
        nursery.cancel_scope.cancel()


async def test_pings_after_a_401_do_not_keep_an_unauthenticated_connection() -> None:
    config = make_config(header_timeout=1.0, idle_timeout=1.0)
    async with running_kasd(config) as kasd:
        client = await HostileClient.connect(kasd.port("kubernetes_api"))
        await client.send(client.request(1, extra=[bearer("ci:1:wrong")]))
        assert await client.status(1) == 401
        with trio.fail_after(4):  # the head deadline: 1 s from accept
            await _ping_until_closed(client)
        goaways = [f for f in client.frames if isinstance(f, hf.GoAwayFrame)]
        assert goaways and goaways[-1].error_code == h2.errors.ErrorCodes.NO_ERROR
        assert client.count(hf.PingFrame) > 1  # kasd answered PINGs meanwhile


async def test_a_shut_window_does_not_keep_an_unauthenticated_connection() -> None:
    """A client that never opens its window for the 401's body keeps no request running past the
    head deadline, so the connection still closes then."""
    config = make_config(header_timeout=1.0, idle_timeout=1.0)
    async with running_kasd(config) as kasd:
        stream = await trio.open_tcp_stream("127.0.0.1", kasd.port("kubernetes_api"))
        client = HostileClient(stream)
        shut = hf.SettingsFrame(0, settings={hf.SettingsFrame.INITIAL_WINDOW_SIZE: 0}).serialize()
        await client.send(PREFACE, shut, client.request(1, extra=[bearer("ci:1:wrong")]))
        assert await client.status(1) == 401  # the head is not flow-controlled; its body is
        with trio.fail_after(4):
            await _ping_until_closed(client)
        assert client.count(hf.DataFrame) == 0
        assert any(isinstance(f, hf.GoAwayFrame) for f in client.frames)


async def test_pings_do_not_reset_the_idle_timeout_of_an_authenticated_connection() -> None:
    config = make_config(header_timeout=30.0, idle_timeout=1.0)
    async with running_kasd(config) as kasd, fake_agent(kasd):
        client = await HostileClient.connect(kasd.port("kubernetes_api"))
        await client.send(client.request(1, extra=[bearer(CI_TOKEN)]))
        assert await client.status(1) == 200
        with trio.fail_after(4):
            await _ping_until_closed(client)
        assert any(isinstance(f, hf.GoAwayFrame) for f in client.frames)


async def test_pings_do_not_extend_the_agent_handshake_timeout() -> None:
    async with running_kasd(_agent_config(handshake_timeout=1.0)) as kasd:
        client = await HostileClient.connect(kasd.port("agent"))
        await client.send(_tunnel_request(client, 1, "wrong-token"))
        assert await client.status(1) == 401
        with trio.fail_after(4):
            await _ping_until_closed(client)


async def test_an_unauthenticated_connection_gets_a_few_401s_then_goaway() -> None:
    async with running_kasd(make_config(header_timeout=30.0)) as kasd:
        client = await HostileClient.connect(kasd.port("kubernetes_api"))
        for i in range(4):
            await client.send(client.request(2 * i + 1, extra=[bearer("ci:1:wrong")]))
            assert await client.status(2 * i + 1) == 401
        with trio.fail_after(5):  # well before the 30 s head deadline
            goaway = await client.until_closed()
        assert goaway.error_code == h2.errors.ErrorCodes.NO_ERROR


async def test_an_authenticated_connection_is_not_closed_for_401s() -> None:
    async with running_kasd(make_config(header_timeout=30.0)) as kasd, fake_agent(kasd):
        client = await HostileClient.connect(kasd.port("kubernetes_api"))
        await client.send(client.request(1, extra=[bearer(CI_TOKEN)]))
        assert await client.status(1) == 200
        for i in range(1, 7):
            await client.send(client.request(2 * i + 1, extra=[bearer("ci:1:wrong")]))
            assert await client.status(2 * i + 1) == 401
        await client.send(client.request(15, extra=[bearer(CI_TOKEN)]))
        assert await client.status(15) == 200
        assert not client.closed
        await client.aclose()


async def test_a_malformed_method_starts_no_request(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with running_kasd() as kasd:
        client = await HostileClient.connect(kasd.port("kubernetes_api"))
        head = [(":method", "GE T"), (":scheme", "http"), (":authority", "k"), (":path", "/api")]
        await client.send(client.headers(1, head))
        while not any(isinstance(f, hf.RstStreamFrame) for f in client.frames):
            await client.read()
        (reset,) = [f for f in client.frames if isinstance(f, hf.RstStreamFrame)]
        assert reset.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
        await client.aclose()
    assert _log_lines(caplog, "kasd.access") == []


__all__ = ["HostileClient", "data_frame_header"]


async def test_an_agent_id_int_refuses_is_a_401_and_a_watch_beside_it_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    more = trio.Event()

    async def watch(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await stream.receive_some()
        await stream.accept(ResponseHead(status=200, headers=(("content-type", "application/json"),)).to_metadata())
        await stream.send_all(b'{"type": "ADDED"}\n')
        await more.wait()
        await stream.send_all(b'{"type": "MODIFIED"}\n')
        await stream.send_eof()

    async with running_kasd() as kasd, fake_agent(kasd, watch):
        client = await HostileClient.connect(kasd.port("kubernetes_api"))
        await client.send(client.request(1, "/api/v1/pods?watch=1", extra=[bearer(CI_TOKEN)]))
        assert await client.status(1) == 200
        for stream_id, agent_id in ((3, b"\xb2"), (5, b"7" * 5000)):
            head = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"k"), (b":path", b"/api"),
                    (b"authorization", b"Bearer ci:" + agent_id + b":x")]
            await client.send(client.headers(stream_id, head))  # type: ignore[arg-type]
            assert await client.status(stream_id) == 401
        more.set()
        while not any(isinstance(f, hf.DataFrame) and f.stream_id == 1 and "END_STREAM" in f.flags for f in client.frames):
            assert await client.read(), "connection closed"
        watched = b"".join(bytes(f.data) for f in client.frames if isinstance(f, hf.DataFrame) and f.stream_id == 1)
        assert watched == b'{"type": "ADDED"}\n{"type": "MODIFIED"}\n'
        assert not [f for f in client.frames if isinstance(f, (hf.RstStreamFrame, hf.GoAwayFrame))]
        answers = [bytes(f.data) for f in client.frames if isinstance(f, hf.DataFrame) and f.stream_id in (3, 5)]
        assert b"is not a number" in answers[0] and b"is too long" in answers[1]
        await client.aclose()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_a_request_that_escapes_the_pipeline_is_a_500_and_its_neighbours_go_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # The front end's own net, behind the pipeline's: a bug there still ends one stream only.
    serve = RequestPipeline.serve

    async def buggy(self: RequestPipeline, ex: Any, **kw: Any) -> None:
        if ex.request.target == "/boom":
            raise RuntimeError("bug")
        await serve(self, ex, **kw)

    monkeypatch.setattr(RequestPipeline, "serve", buggy)
    async with running_kasd() as kasd, fake_agent(kasd):
        client = await HostileClient.connect(kasd.port("kubernetes_api"))
        await client.send(client.request(1, extra=[bearer(CI_TOKEN)]),
                          *(client.request(i, "/boom", extra=[bearer(CI_TOKEN)]) for i in (3, 5, 7)))
        assert [await client.status(i) for i in (1, 3, 5, 7)] == [200, 500, 500, 500]
        await client.send(client.request(9, extra=[bearer(CI_TOKEN)]))
        assert await client.status(9) == 200
        assert not [f for f in client.frames if isinstance(f, (hf.RstStreamFrame, hf.GoAwayFrame))]
        await client.aclose()
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1


async def test_a_malformed_request_resets_its_own_stream_and_a_watch_beside_it_goes_on() -> None:
    """RFC 9113, 8.1.1: a request that is malformed (here a ``content-length`` that is not a number,
    two of them, a name in upper case, a connection-specific header, a pseudo-header twice or one a
    request never carries, a body longer or shorter than its ``content-length``) is a stream error. h2 made each a connection error: a GOAWAY that ended
    every stream on the connection, a running watch included."""
    more = trio.Event()

    async def watch(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await stream.receive_some()
        await stream.accept(ResponseHead(status=200, headers=(("content-type", "application/json"),)).to_metadata())
        await stream.send_all(b'{"type": "ADDED"}\n')
        await more.wait()
        await stream.send_all(b'{"type": "MODIFIED"}\n')
        await stream.send_eof()

    malformed = [[(b"content-length", b"\xb2")], [(b"content-length", b"5"), (b"content-length", b"6")],
                 [(b"X-Upper", b"1")], [(b"connection", b"keep-alive")], [(b"te", b"gzip")],
                 [(b":path", b"/again")], [(b":status", b"200")], [(b"transfer-encoding", b"chunked")]]
    async with running_kasd() as kasd, fake_agent(kasd, watch):
        client = await HostileClient.connect(kasd.port("kubernetes_api"))
        await client.send(client.request(1, "/api/v1/pods?watch=1", extra=[bearer(CI_TOKEN)]))
        assert await client.status(1) == 200
        head = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"k"), (b":path", b"/api"),
                (b"authorization", b"Bearer ci:1:x")]
        ids = range(3, 3 + 2 * (len(malformed) + 2), 2)
        for stream_id, extra in zip(ids, malformed, strict=False):
            await client.send(client.headers(stream_id, head + extra))  # type: ignore[arg-type]
        # a body longer, or shorter, than its content-length
        for stream_id, body in zip(ids[-2:], (b"0123456789", b"01"), strict=True):
            await client.send(client.headers(stream_id, [*head, (b"content-length", b"3")], end_stream=False),  # type: ignore[list-item]
                              hf.DataFrame(stream_id, data=body, flags=["END_STREAM"]).serialize())
        while {f.stream_id for f in client.frames if isinstance(f, hf.RstStreamFrame)} != set(ids):
            assert await client.read(), f"connection closed: {client.frames}"
        assert {f.error_code for f in client.frames if isinstance(f, hf.RstStreamFrame)} == {h2.errors.ErrorCodes.PROTOCOL_ERROR}
        more.set()
        while not any(isinstance(f, hf.DataFrame) and f.stream_id == 1 and "END_STREAM" in f.flags for f in client.frames):
            assert await client.read(), "connection closed"
        watched = b"".join(bytes(f.data) for f in client.frames if isinstance(f, hf.DataFrame) and f.stream_id == 1)
        assert watched == b'{"type": "ADDED"}\n{"type": "MODIFIED"}\n'
        assert not [f for f in client.frames if isinstance(f, hf.GoAwayFrame)]
        await client.aclose()


async def test_a_flood_of_malformed_requests_spends_the_reset_budget_as_it_is_decoded() -> None:
    """Each malformed request costs a token of the reset budget when it is decoded, so one read of
    3,000 (30 KB) is decoded only up to the budget, then GOAWAY ENHANCE_YOUR_CALM. (The budget
    refills over a day here, not 30 s: a loaded machine decoding slowly gets no token back meanwhile.)"""
    async with running_kasd(make_config(http2={"reset_budget": 200, "reset_window": 86400})) as kasd:
        client = await HostileClient.connect(kasd.port("kubernetes_api"))
        head = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"k"), (b":path", b"/api"), (b"X-Upper", b"1")]
        await client.send(b"".join(client.headers(sid, head) for sid in range(1, 6001, 2)))  # type: ignore[arg-type]
        goaway = await client.until_closed()
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert client.count(hf.RstStreamFrame) == 200
