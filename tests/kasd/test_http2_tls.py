"""The proxy over TLS: HTTP/2 (ALPN h2) with a tiny h2 client, HTTP/1.1 (ALPN http/1.1), and h2c."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest
import trio
import trustme

from tests.kasd.helpers import (
    CI_TOKEN,
    H1Client,
    bearer,
    fake_agent,
    first_chunk_then_reset,
    make_config,
    running_kasd,
)
from wire.session import StreamResetError

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[trustme.CA, dict[str, str]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "kasd.crt", tmp_path / "kasd.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(cert_path), append=True)
    cert.private_key_pem.write_to_path(str(key_path))
    return ca, {"cert": str(cert_path), "key": str(key_path)}


class H2Client:
    """Just enough HTTP/2 for a test: one connection, requests answered in full or streamed."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.events: list[h2.events.Event] = []
        self.window_changed = trio.Event()
        self._send_lock = trio.StrictFIFOLock()

    async def flush(self) -> None:
        async with self._send_lock:
            if data := self.conn.data_to_send():
                await self.stream.send_all(data)

    async def request(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes = b"") -> int:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(
            sid,
            [(":method", method), (":scheme", "https"), (":authority", "kasd.test"), (":path", path), *headers],
            end_stream=not body,
        )
        # Small bodies only (within the initial 64 KiB window), in frames the default size allows.
        for offset in range(0, len(body), 16384):
            self.conn.send_data(sid, body[offset : offset + 16384], end_stream=offset + 16384 >= len(body))
        await self.flush()
        return sid

    async def next_event(self, sid: int) -> h2.events.Event:
        while True:
            for i, event in enumerate(self.events):
                if getattr(event, "stream_id", None) == sid:
                    return self.events.pop(i)
            data = await self.stream.receive_some(65536)
            assert data, "connection closed"
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                if isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
                    self.window_changed.set()
                    continue
                self.events.append(event)
            await self.flush()

    async def response(self, sid: int) -> tuple[dict[str, str], bytes]:
        headers: dict[str, str] = {}
        body = b""
        while True:
            event = await self.next_event(sid)
            if isinstance(event, h2.events.ResponseReceived):
                headers = dict(event.headers)
            elif isinstance(event, h2.events.DataReceived):
                body += event.data
            elif isinstance(event, h2.events.StreamEnded):
                return headers, body
            elif isinstance(event, h2.events.StreamReset):
                raise AssertionError(f"stream reset {event.error_code}")


async def _tls_connect(port: int, ca: trustme.CA, alpn: list[str]) -> trio.SSLStream[trio.SocketStream]:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    ctx.set_alpn_protocols(alpn)
    tcp = await trio.open_tcp_stream("127.0.0.1", port)
    tls = trio.SSLStream(tcp, ctx, server_hostname="127.0.0.1")
    await tls.do_handshake()
    return tls


async def test_http2_over_tls(tls_files: tuple[trustme.CA, dict[str, str]]) -> None:
    ca, files = tls_files
    config = make_config(tls=files)
    async with running_kasd(config) as kasd, fake_agent(kasd) as agent:
        tls = await _tls_connect(kasd.port("kubernetes_api"), ca, ["h2", "http/1.1"])
        assert tls.selected_alpn_protocol() == "h2"
        client = H2Client(tls)
        await client.flush()
        # Two requests on one connection, concurrently in flight.
        sid1 = await client.request("GET", "/api/v1/pods", [bearer(CI_TOKEN), ("cookie", "a=b")])
        sid2 = await client.request("POST", "/api/v1/namespaces", [bearer(CI_TOKEN)], b"x" * 60_000)
        headers1, body1 = await client.response(sid1)
        _, body2 = await client.response(sid2)
        assert headers1[":status"] == "200" and "x-request-id" in headers1
        assert json.loads(body1)["target"] == "/api/v1/pods"
        assert json.loads(body2)["body_bytes"] == 60_000
        assert all(k != "cookie" and k != "authorization" for h in agent.heads for k, _ in h.headers)
        # An error is a Status, over HTTP/2 too.
        sid3 = await client.request("GET", "/api", [bearer("ci:1:nope")])
        headers3, body3 = await client.response(sid3)
        assert headers3[":status"] == "401"
        assert json.loads(body3)["message"] == "bad token: CI job token malformed"
        await tls.aclose()


async def test_http2_client_reset_cancels_upstream(tls_files: tuple[trustme.CA, dict[str, str]]) -> None:
    ca, files = tls_files
    reset_seen = trio.Event()

    async def endless(stream, head, session) -> None:  # type: ignore[no-untyped-def]
        from tests.kasd.helpers import accept
        from tunnelhttp.head import ResponseHead

        await accept(stream, ResponseHead(status=200, headers=()))
        try:
            while True:
                await stream.send_all(b"event\n")
                await trio.sleep(0.01)  # pacing, not synchronisation
        except StreamResetError:
            reset_seen.set()

    async with running_kasd(make_config(tls=files)) as kasd, fake_agent(kasd, endless) as agent:
        tls = await _tls_connect(kasd.port("kubernetes_api"), ca, ["h2"])
        client = H2Client(tls)
        sid = await client.request("GET", "/api/v1/pods?watch=1", [bearer(CI_TOKEN)])
        while not isinstance(await client.next_event(sid), h2.events.DataReceived):
            pass
        client.conn.reset_stream(sid)
        await client.flush()
        await reset_seen.wait()
        assert agent.session.statistics().open_streams == 0
        await tls.aclose()


async def test_http11_over_tls(tls_files: tuple[trustme.CA, dict[str, str]]) -> None:
    ca, files = tls_files
    async with running_kasd(make_config(tls=files)) as kasd, fake_agent(kasd):
        tls = await _tls_connect(kasd.port("kubernetes_api"), ca, ["http/1.1"])
        assert tls.selected_alpn_protocol() == "http/1.1"
        client = H1Client(tls)
        await client.request("GET", "/version", [bearer(CI_TOKEN)])
        assert (await client.response()).status_code == 200
        assert json.loads(await client.body())["target"] == "/version"
        await tls.aclose()


async def test_h2c_prior_knowledge_on_plain_port() -> None:
    async with running_kasd() as kasd, fake_agent(kasd):
        tcp = await trio.open_tcp_stream("127.0.0.1", kasd.port("kubernetes_api"))
        client = H2Client(tcp)
        sid = await client.request("GET", "/apis", [bearer(CI_TOKEN)])
        headers, body = await client.response(sid)
        assert headers[":status"] == "200"
        assert json.loads(body)["target"] == "/apis"
        await tcp.aclose()


async def test_http2_large_bodies_respect_flow_control_both_ways() -> None:
    """3 MiB up and 3 MiB down on h2c: far beyond every initial window, so both sides must wait for
    WINDOW_UPDATEs (kasd acknowledges request data only as the tunnel takes it)."""
    import hashlib

    from tests.kasd.helpers import accept
    from tunnelhttp.head import ResponseHead

    size = 3 * 1024 * 1024
    up = bytes(range(256)) * (size // 256)

    async def mirror(stream, head, session) -> None:  # type: ignore[no-untyped-def]
        digest = hashlib.sha256()
        while chunk := await stream.receive_some():
            digest.update(chunk)
        await accept(stream, ResponseHead(status=200, headers=(("x-upload-sha256", digest.hexdigest()),)))
        for offset in range(0, size, 65536):
            await stream.send_all(up[offset : offset + 65536])
        await stream.send_eof()

    async with running_kasd() as kasd, fake_agent(kasd, mirror):
        tcp = await trio.open_tcp_stream("127.0.0.1", kasd.port("kubernetes_api"))
        client = H2Client(tcp)
        sid = client.conn.get_next_available_stream_id()
        client.conn.send_headers(
            sid,
            [(":method", "PUT"), (":scheme", "http"), (":authority", "k"), (":path", "/big"), bearer(CI_TOKEN)],
        )
        await client.flush()

        async def upload() -> None:
            view = memoryview(up)
            while view:
                window = min(client.conn.local_flow_control_window(sid), client.conn.max_outbound_frame_size)
                if window <= 0:
                    await client.window_changed.wait()
                    client.window_changed = trio.Event()
                    continue
                client.conn.send_data(sid, view[:window].tobytes())
                view = view[window:]
                await client.flush()
            client.conn.end_stream(sid)
            await client.flush()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(upload)
            headers, body = await client.response(sid)
        assert headers[":status"] == "200"
        assert headers["x-upload-sha256"] == hashlib.sha256(up).hexdigest()
        assert body == up
        await tcp.aclose()


async def test_websocket_style_upgrade_over_tls(tls_files: tuple[trustme.CA, dict[str, str]]) -> None:
    """kubectl's default exec: a GET with Upgrade: websocket over TLS (ALPN http/1.1)."""
    from tests.kasd.helpers import accept
    from tunnelhttp.head import ResponseHead

    async def ws(stream, head, session) -> None:  # type: ignore[no-untyped-def]
        assert head.method == "GET" and ("upgrade", "websocket") in head.headers
        await accept(
            stream,
            ResponseHead(
                status=101,
                headers=(("connection", "Upgrade"), ("upgrade", "websocket"), ("sec-websocket-accept", "abc"), ("sec-websocket-protocol", "v5.channel.k8s.io")),
            ),
        )
        data = await stream.receive_some()
        await stream.send_all(b"echo:" + data)
        await stream.send_eof()

    ca, files = tls_files
    async with running_kasd(make_config(tls=files)) as kasd, fake_agent(kasd, ws):
        tls = await _tls_connect(kasd.port("kubernetes_api"), ca, ["http/1.1"])
        client = H1Client(tls)
        await client.request(
            "GET",
            "/api/v1/namespaces/default/pods/web/exec?command=date",
            [
                bearer(CI_TOKEN),
                ("connection", "Upgrade"),
                ("upgrade", "websocket"),
                ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ("sec-websocket-version", "13"),
                ("sec-websocket-protocol", "v5.channel.k8s.io"),
            ],
            body=None,
        )
        response = await client.response()
        assert response.status_code == 101
        assert (b"sec-websocket-accept", b"abc") in response.headers
        await tls.send_all(b"frame")
        got = b""
        while len(got) < len(b"echo:frame"):
            got += await tls.receive_some(100)
        assert got == b"echo:frame"
        # The agent finished: TLS cannot half-close, so kasd closes the connection.
        with trio.fail_after(5):
            try:
                assert await tls.receive_some(100) == b""
            except trio.BrokenResourceError:
                pass
        await tls.aclose()


async def test_an_agent_stream_that_breaks_mid_response_resets_the_http2_stream() -> None:
    # Too late for a Status: RST_STREAM tells the client its body is truncated; the connection lives on.
    more = trio.Event()
    async with running_kasd() as kasd, fake_agent(kasd, first_chunk_then_reset(more)):
        tcp = await trio.open_tcp_stream("127.0.0.1", kasd.port("kubernetes_api"))
        client = H2Client(tcp)
        sid = await client.request("GET", "/api/v1/pods?watch=1", [bearer(CI_TOKEN)])
        assert isinstance(await client.next_event(sid), h2.events.ResponseReceived)
        first = await client.next_event(sid)
        assert isinstance(first, h2.events.DataReceived) and first.data == b'{"type": "ADDED"}\n'
        more.set()
        event = await client.next_event(sid)
        while isinstance(event, h2.events.DataReceived):
            event = await client.next_event(sid)
        assert isinstance(event, h2.events.StreamReset)
        # The connection lives on: the next request gets its answer (which breaks the same way).
        again = await client.request("GET", "/api/v1/pods?watch=1", [bearer(CI_TOKEN)])
        response = await client.next_event(again)
        assert isinstance(response, h2.events.ResponseReceived) and dict(response.headers)[":status"] == "200"
        await tcp.aclose()


async def test_an_oversize_frame_over_tls_gets_goaway_before_its_body(tls_files: tuple[trustme.CA, dict[str, str]]) -> None:
    """The pre-authentication frame budget holds over TLS too: a DATA frame announcing 16 MiB gets
    GOAWAY FRAME_SIZE_ERROR from its 9-byte header, and the connection is closed."""
    import h2.errors
    import hyperframe.frame as hf

    from tests.kasd.test_hostile_h2 import OPENING, HostileClient, data_frame_header

    ca, files = tls_files
    async with running_kasd(make_config(tls=files)) as kasd:
        tls = await _tls_connect(kasd.port("kubernetes_api"), ca, ["h2"])
        client = HostileClient(tls, scheme="https")
        await client.send(OPENING, client.request(1, end_stream=False), data_frame_header(1, (1 << 24) - 1), b"x" * 10)
        with trio.fail_after(5):
            goaway = await client.until_closed()
        assert isinstance(goaway, hf.GoAwayFrame) and goaway.error_code == h2.errors.ErrorCodes.FRAME_SIZE_ERROR


async def test_failed_tls_handshakes_are_logged_in_bursts(
    tls_files: tuple[trustme.CA, dict[str, str]], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stranger writes one plain-text line per connection to the TLS proxy port: kasd logs the
    failed handshakes once per 10 s per source, not once each (2,000 connections were 2,000 lines)."""
    import logging

    from daemonkit.logs import BurstLimitedLog
    from kasd.k8sproxy import server as proxy_server

    monkeypatch.setattr(proxy_server, "_strangers", BurstLimitedLog(proxy_server.log), raising=False)
    caplog.set_level(logging.INFO)
    _, files = tls_files
    async with running_kasd(make_config(tls=files)) as kasd:
        for _ in range(20):
            stream = await trio.open_tcp_stream("127.0.0.1", kasd.port("kubernetes_api"))
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            with trio.fail_after(5):
                while await stream.receive_some():
                    pass
            await stream.aclose()
    failed = [r for r in caplog.records if r.name == "kasd.k8sproxy" and "TLS handshake failed" in r.getMessage()]
    assert 1 <= len(failed) <= 2, [r.getMessage() for r in failed]
