"""The carriers on real sockets on 127.0.0.1: h2c and TLS (ALPN h2, trustme certificates), and what
they share run over the WebSocket carrier too (``carrier``: the same server takes both)."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import pytest
import trio
import trio.testing
import trustme

from daemonkit.logs import UnexpectedErrors
from wire import h2carrier
from wire.carrier import TunnelRejectedError
from wire.h2carrier import open_h2_session, serve_h2_tunnels, server_ssl_context
from wire.mux import MuxConnection
from wire.session import MuxStream, Session, connect_session, open_session
from wire.wscarrier import open_ws_session

TOKEN = "agent-token-123"


@pytest.fixture(params=["h2", "ws"])
def carrier(request: pytest.FixtureRequest) -> str:
    """Which carrier a test's client dials: HTTP/2, or a WebSocket on the same port and path."""
    return str(request.param)


def open_carrier(carrier: str, url: str, **kwargs: Any) -> AbstractAsyncContextManager[Session]:
    """``open_h2_session(url)``, or ``open_ws_session`` with http(s):// read as ws(s)://."""
    if carrier == "h2":
        return open_h2_session(url, **kwargs)
    return open_ws_session("ws" + url.removeprefix("http"), **kwargs)


class TunnelServer:
    def __init__(self) -> None:
        self.auth_calls: list[tuple[str, dict[str, str]]] = []
        self.sessions: list[tuple[Session, Any]] = []
        self.port = 0

    async def authenticate(self, token: str, headers: dict[str, str]) -> Any:
        self.auth_calls.append((token, headers))
        if token == "forbidden":
            raise TunnelRejectedError(403, "agent 42 is disabled")
        return {"agent_id": 42} if token == TOKEN else None

    async def handler(self, session: Session, principal: Any) -> None:
        self.sessions.append((session, principal))
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    stream = await session.accept_stream()
                except trio.BrokenResourceError:
                    return
                nursery.start_soon(_echo_upper, stream)


async def _echo_upper(stream: MuxStream) -> None:
    while chunk := await stream.receive_some():
        await stream.send_all(chunk.upper())
    await stream.aclose()


async def _start(nursery: trio.Nursery, ssl_context: ssl.SSLContext | None = None, **kwargs: Any) -> TunnelServer:
    server = TunnelServer()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    await nursery.start(
        lambda task_status: serve_h2_tunnels(
            server.handler,
            listeners,
            authenticate=server.authenticate,
            ssl_context=ssl_context,
            task_status=task_status,
            **{"websocket": True, **kwargs},
        )
    )
    server.port = listeners[0].socket.getsockname()[1]
    return server


async def _exchange(session: Session, payload: bytes) -> bytes:
    stream = await session.open_stream({"purpose": "echo"})

    async def send() -> None:
        await stream.send_all(payload)
        await stream.send_eof()

    got = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        while chunk := await stream.receive_some():
            got += chunk
    await stream.aclose()
    return bytes(got)


async def test_h2c_session_round_trip_and_token_reaches_authenticator(nursery: trio.Nursery, carrier: str) -> None:
    server = await _start(nursery)
    url = f"http://127.0.0.1:{server.port}/tunnel"
    async with open_carrier(carrier, url, token=TOKEN, metadata={"agent_id": 42, "pod": "agentd-0"}) as session:
        payload = bytes(range(256)) * 4096  # 1 MiB
        assert await _exchange(session, payload) == payload.upper()
        server_session, principal = server.sessions[0]
        assert principal == {"agent_id": 42}
        assert server_session.peer_metadata == {"agent_id": 42, "pod": "agentd-0"}
    token, headers = server.auth_calls[0]
    assert token == TOKEN
    # The authenticator sees the request head, but the credential only as the token argument.
    assert "authorization" not in headers
    assert headers[":path"] == "/tunnel" if carrier == "h2" else headers["upgrade"] == "websocket"


async def test_tls_with_alpn_h2(nursery: trio.Nursery, carrier: str) -> None:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(server_ctx)
    server = await _start(nursery, server_ssl_context(server_ctx, websocket=True))
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    url = f"https://localhost:{server.port}/tunnel"
    async with open_carrier(carrier, url, token=TOKEN, ssl_context=client_ctx) as session:
        assert await _exchange(session, b"secret payload") == b"SECRET PAYLOAD"
        transport = session.transport
        if carrier == "ws":  # the same port, the same context: ALPN chose HTTP/1.1 for the upgrade
            assert transport.stream.selected_alpn_protocol() == "http/1.1"  # type: ignore[attr-defined]
            return
        assert transport.driver.stream.selected_alpn_protocol() == "h2"  # type: ignore[attr-defined]
        # Both ends announce the tunnel's finite window, stream and connection (kasd's stream's
        # window is this end's send window; the connection windows are the driver's increments).
        conn = transport.driver.conn  # type: ignore[attr-defined]
        assert conn.remote_settings.initial_window_size == h2carrier.TUNNEL_WINDOW
        assert conn.local_settings.initial_window_size == h2carrier.TUNNEL_WINDOW
        assert conn.inbound_flow_control_window <= h2carrier.TUNNEL_WINDOW
        assert conn.outbound_flow_control_window <= h2carrier.TUNNEL_WINDOW


async def test_tls_client_that_does_not_trust_the_server_fails_clearly(nursery: trio.Nursery, carrier: str) -> None:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_ctx)
    server = await _start(nursery, server_ssl_context(server_ctx, websocket=True))
    with pytest.raises(trio.BrokenResourceError) as info:
        async with open_carrier(carrier, f"https://localhost:{server.port}/tunnel", token=TOKEN):
            pass  # pragma: no cover
    assert "CERTIFICATE_VERIFY_FAILED" in repr(info.value.__cause__)


@pytest.mark.parametrize(
    ("path", "token", "status", "message"),
    [
        ("/tunnel", "wrong-token", 401, "invalid token"),
        ("/tunnel", "forbidden", 403, "agent 42 is disabled"),
        ("/elsewhere", TOKEN, 404, "no tunnel endpoint at '/elsewhere'"),
    ],
)
async def test_bad_requests_get_http_status_before_any_session(
    nursery: trio.Nursery, carrier: str, path: str, token: str, status: int, message: str
) -> None:
    server = await _start(nursery)
    with pytest.raises(TunnelRejectedError) as info:
        async with open_carrier(carrier, f"http://127.0.0.1:{server.port}{path}", token=token):
            pass  # pragma: no cover
    assert info.value.status == status
    assert message in info.value.message
    assert server.sessions == []


async def _raw_h2_request(port: int, headers: list[tuple[str, str]]) -> tuple[dict[str, str], bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    conn.send_headers(1, headers, end_stream=True)
    await stream.send_all(conn.data_to_send())
    response: dict[str, str] = {}
    body = b""
    with trio.fail_after(5):
        while True:
            data = await stream.receive_some()
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    response = dict(event.headers)  # type: ignore[arg-type]
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                elif isinstance(event, h2.events.StreamEnded):
                    await stream.aclose()
                    return response, body
            await stream.send_all(conn.data_to_send())
    return response, body


async def test_wrong_method_and_missing_token(nursery: trio.Nursery) -> None:
    server = await _start(nursery)
    base = [(":scheme", "http"), (":authority", "127.0.0.1"), (":path", "/tunnel")]
    head, body = await _raw_h2_request(server.port, [(":method", "GET"), *base, ("authorization", f"Bearer {TOKEN}")])
    assert head[":status"] == "405" and head["allow"] == "POST" and b"takes POST" in body
    head, body = await _raw_h2_request(server.port, [(":method", "POST"), *base])
    assert head[":status"] == "401" and head["www-authenticate"] == "Bearer" and b"missing bearer token" in body
    for tokens in ([TOKEN, "wrong"], ["wrong", TOKEN]):  # which one a proxy in front checked is unknowable
        head, body = await _raw_h2_request(server.port, [(":method", "POST"), *base,
                                                         *(("authorization", f"Bearer {t}") for t in tokens)])
        assert head[":status"] == "400" and b"more than one authorization header" in body
    assert server.sessions == []


async def test_http1_client_is_told_what_the_port_speaks(nursery: trio.Nursery) -> None:
    server = await _start(nursery, websocket=False)  # the private port: HTTP/2 only
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(b"GET /tunnel HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = b""
    with trio.fail_after(5):
        while chunk := await stream.receive_some():
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 505 ")
    assert b"HTTP/2 only" in reply


async def _read_until_closed(stream: trio.abc.Stream) -> bytes:
    data = b""
    try:
        while chunk := await stream.receive_some():
            data += chunk
    except trio.BrokenResourceError:
        pass
    return data


HostileClient = Callable[[int], Awaitable[None]]


async def _garbage(port: int) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 64)
    with trio.fail_after(5):
        await _read_until_closed(stream)  # the server hangs up (after its GOAWAY)


async def _slowloris(port: int) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"PRI * HTTP/2.0\r\n")  # and never finishes the preface
    with trio.fail_after(5):
        await _read_until_closed(stream)  # the handshake timeout closes it


@pytest.mark.parametrize("hostile", [_garbage, _slowloris], ids=["garbage", "slowloris"])
async def test_hostile_clients_are_dropped_while_others_are_served(
        nursery: trio.Nursery, carrier: str, hostile: HostileClient) -> None:
    server = await _start(nursery, handshake_timeout=0.5)
    async with open_carrier(carrier, f"http://127.0.0.1:{server.port}/tunnel", token=TOKEN) as session:
        async with trio.open_nursery() as inner:
            inner.start_soon(hostile, server.port)
            assert await _exchange(session, b"still served") == b"STILL SERVED"
        assert await _exchange(session, b"after") == b"AFTER"


async def test_large_frames_only_once_the_tunnel_is_accepted(nursery: trio.Nursery) -> None:
    """Before its tunnel request is accepted a client may send frames of 16 KiB (the HTTP/2
    default) only; the tunnel then gets 1 MiB frames (fewer frames, less Python per byte)."""
    server = await _start(nursery)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    await stream.send_all(conn.data_to_send())
    while not any(isinstance(e, h2.events.RemoteSettingsChanged) for e in conn.receive_data(await stream.receive_some())):
        pass
    assert conn.max_outbound_frame_size == 16384
    await stream.aclose()

    url = f"http://127.0.0.1:{server.port}/tunnel"
    async with open_h2_session(url, token=TOKEN) as session:
        payload = bytes(range(256)) * 8192  # 2 MiB, in 1 MiB frames
        assert await _exchange(session, payload) == payload.upper()
        assert session.transport.driver.conn.max_outbound_frame_size == 1 << 20  # type: ignore[attr-defined]
        server_session, _ = server.sessions[0]
        assert server_session.transport.driver.max_inbound_frame_size == 1 << 20  # type: ignore[attr-defined]


async def test_a_few_rejected_tunnel_requests_then_goaway(nursery: trio.Nursery) -> None:
    server = await _start(nursery)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    head = [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/tunnel"), ("authorization", "Bearer nope")]
    statuses: list[str] = []
    terminated: list[h2.events.ConnectionTerminated] = []
    with trio.fail_after(5):
        while not terminated:
            if conn.open_outbound_streams == 0 and not terminated:
                conn.send_headers(conn.get_next_available_stream_id(), head, end_stream=True)
            await stream.send_all(conn.data_to_send())
            data = await stream.receive_some()
            assert data, "closed without GOAWAY"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    statuses.append(dict(event.headers)[":status"])  # type: ignore[arg-type]
                elif isinstance(event, h2.events.ConnectionTerminated):
                    terminated.append(event)
    assert statuses == ["401", "401", "401"]
    assert terminated[0].error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert await _read_until_closed(stream) == b""


async def test_a_handler_that_fails_unexpectedly_ends_its_connection_in_one_line(
        nursery: trio.Nursery, carrier: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    failed = trio.Semaphore(0)

    async def broken(self: TunnelServer, session: Session, principal: Any) -> None:
        failed.release()
        raise RuntimeError(f"bug while serving {principal}")

    monkeypatch.setattr(TunnelServer, "handler", broken)
    monkeypatch.setattr(h2carrier, "_unexpected", UnexpectedErrors(h2carrier.log))  # each run reports afresh
    server = await _start(nursery)
    for _ in range(3):
        async with open_carrier(carrier, f"http://127.0.0.1:{server.port}/tunnel", token=TOKEN) as session:
            with trio.fail_after(5):
                await failed.acquire()
                await session.wait_closed()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and not errors[0].exc_info
    assert "RuntimeError" in errors[0].getMessage() and "broken" in errors[0].getMessage()
    assert "agent_id" not in caplog.text  # the exception's message is never written


async def test_a_peer_that_leaves_while_the_handler_touches_the_session_is_one_info_line(
        nursery: trio.Nursery, carrier: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # agentd moving its tunnel to its placement: GOAWAY, then the connection closes, while a task of
    # kasd's handler (a placement NOTICE, say) still uses the session. The nursery wraps what that
    # task raises in an ExceptionGroup: still the peer leaving, not a bug.
    caplog.set_level(logging.INFO)
    ended = trio.Event()
    logged = trio.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "tunnel connection" in record.getMessage():
                logged.set()

    carrier_log = logging.getLogger("wire.h2carrier")
    carrier_log.addHandler(seen := Seen())
    nursery.start_soon(_remove_at_end, carrier_log, seen)

    async def handler(self: TunnelServer, session: Session, principal: Any) -> None:
        try:
            async with trio.open_nursery() as tasks:

                async def touch_after_close() -> None:
                    await session.wait_closed()
                    await session.ping()  # raises: the session is closed

                tasks.start_soon(touch_after_close)
        finally:
            ended.set()

    monkeypatch.setattr(TunnelServer, "handler", handler)
    server = await _start(nursery)
    async with open_carrier(carrier, f"http://127.0.0.1:{server.port}/tunnel", token=TOKEN) as session:
        await session.drain("agentd moves this tunnel to its placement")
    with trio.fail_after(5):
        await ended.wait()
        await logged.wait()  # the carrier's line about the connection, once the handler returned
    # (nor a WARNING from the session when kasd's last write crossed agentd's close: a reset after
    # the peer's GOAWAY with nothing in flight is the peer leaving)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    lines = [r for r in caplog.records if "tunnel connection" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO and not lines[0].exc_info
    assert "ExceptionGroup" not in lines[0].getMessage()


async def _remove_at_end(logger: logging.Logger, handler: logging.Handler) -> None:
    try:
        await trio.sleep_forever()
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("websocket", [True, False], ids=["agent-port", "http2-only"])
async def test_a_preface_that_arrives_in_pieces_is_still_http2(websocket: bool) -> None:
    # TCP may deliver the client's first bytes in pieces ("PRI *", then the rest): the first read
    # is a prefix of the HTTP/2 preface, not an HTTP/1.1 request (whose method it would resemble).
    client, server = trio.testing.memory_stream_pair()
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "127.0.0.1"),
                          (":path", "/tunnel"), ("authorization", f"Bearer {TOKEN}")])
    data = conn.data_to_send()
    accepted: list[Any] = []

    async def accept() -> None:
        accepted.append(await h2carrier._accept_tunnel(server, authenticate=TunnelServer().authenticate,
                                                       path="/tunnel", peer="127.0.0.1:1", websocket=websocket))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept)
            for piece in (data[:5], data[5:]):
                await trio.testing.wait_all_tasks_blocked()  # the server reads each piece on its own
                await client.send_all(piece)
    assert accepted[0] is not None, "an HTTP/2 client was taken for an HTTP/1.1 one"
    transport, principal = accepted[0]
    assert isinstance(transport, h2carrier.H2StreamTransport) and principal == {"agent_id": 42}
    reply = conn.receive_data(await client.receive_some())
    assert any(isinstance(e, h2.events.ResponseReceived) and dict(e.headers)[":status"] == "200" for e in reply)


async def test_strangers_failing_tls_cost_one_log_line_per_source(nursery: trio.Nursery,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Connections whose TLS handshake fails (garbage instead of a ClientHello), repeated: before
    authentication they are a stranger's, and are logged at most once per source per interval."""
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    server = await _start(nursery, server_ssl_context(server_ctx, websocket=True))
    caplog.set_level(logging.INFO, logger="wire.h2carrier")
    with trio.fail_after(10):
        for _ in range(20):
            stream = await trio.open_tcp_stream("127.0.0.1", server.port)
            await stream.send_all(b"\x16\x03\x01\x00\x05hello")  # a TLS record that is no ClientHello
            await _read_until_closed(stream)
            await stream.aclose()
    lines = [r for r in caplog.records if r.name == "wire.h2carrier"]
    assert len(lines) <= 1, [r.getMessage() for r in lines]


def _tasks_below(name: str) -> list[str]:
    """The names of the tasks that run below the task whose coroutine is ``name`` (and that one)."""
    found: list[str] = []

    def walk(task: trio.lowlevel.Task, inside: bool) -> None:
        inside = inside or task.coro.cr_code.co_name == name
        if inside:
            found.append(task.coro.__qualname__)
        for child in task.child_nurseries:
            for sub in child.child_tasks:
                walk(sub, inside)

    walk(trio.lowlevel.current_root_task(), False)
    return sorted(found)


async def test_an_idle_h2_tunnel_end_runs_only_its_session(nursery: trio.Nursery, autojump_clock: trio.abc.Clock) -> None:
    """Either end of an idle HTTP/2 tunnel (kasd holds thousands) runs the session's one task and no
    reader task of the carrier's: the session's reader reads the HTTP/2 connection itself, and its
    wait for bytes ends at each keepalive PING (written, answered) without harm to the tunnel."""
    server = TunnelServer()
    left, right = trio.testing.memory_stream_pair()
    nursery.start_soon(
        lambda: h2carrier.serve_h2_connection(right, server.handler, authenticate=server.authenticate))
    transport = await h2carrier.request_h2_tunnel(left, scheme="http", authority="kasd", path="/tunnel", token=TOKEN)
    up = trio.Event()
    client: list[Session] = []

    async def client_end() -> None:
        async with open_session(transport, client=True) as session:
            client.append(session)
            up.set()
            await trio.sleep_forever()

    nursery.start_soon(client_end)
    with trio.fail_after(10):
        await up.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert server.sessions
        assert _tasks_below("client_end") == [
            "Session.run", "test_an_idle_h2_tunnel_end_runs_only_its_session.<locals>.client_end"]
        for _ in range(3):
            await client[0].ping()  # answered by the server's reader
        await trio.testing.wait_all_tasks_blocked()
    assert _tasks_below("serve_h2_connection") == ["Session.run", "serve_h2_connection"]
    received = client[0].statistics().bytes_received
    await trio.sleep(3 * client[0].keepalive_interval)  # (virtual time) three keepalive PINGs
    assert client[0].statistics().bytes_received > received
    assert not client[0].closed and not server.sessions[0][0].closed
    assert await _exchange(client[0], b"still there") == b"STILL THERE"


class _HostilePeer:
    """A hand-driven HTTP/2 end of a tunnel (either side) that shuts this side's send window
    (SETTINGS INITIAL_WINDOW_SIZE 0, no WINDOW_UPDATE) and floods session PINGs, which the mux does
    not flow-control: the session's reader answers them with PONGs it cannot send, so it stops
    taking what arrives while its send reads the connection (the review's reproduction)."""

    def __init__(self, stream: trio.abc.Stream, *, client: bool) -> None:
        self.stream = stream
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=client, header_encoding="utf-8"))
        self.mux = MuxConnection(client=client)
        self.sent = 0
        self.ready = trio.Event()

    async def write(self) -> None:
        await self.stream.send_all(self.h2.data_to_send())

    async def read(self) -> list[h2.events.Event]:
        return self.h2.receive_data(await self.stream.receive_some())

    async def open_tunnel(self) -> None:
        self.h2.initiate_connection()
        if self.h2.config.client_side:
            self.h2.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "kasd"),
                                     (":path", "/tunnel"), ("authorization", f"Bearer {TOKEN}")])
            await self.write()
            while not any(isinstance(e, h2.events.ResponseReceived) for e in await self.read()):
                pass
        else:
            while not any(isinstance(e, h2.events.RequestReceived) for e in await self.read()):
                pass
            self.h2.send_headers(1, [(":status", "200")])
        self.mux.initiate()  # the HELLO
        self.h2.send_data(1, self.mux.data_to_send())
        await self.write()
        while not any(isinstance(e, h2.events.DataReceived) for e in await self.read()):
            pass  # the other side's HELLO: the session is up
        self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        await self.write()
        self.ready.set()

    async def flood(self, limit: int) -> None:
        """Send PINGs while the window this side announced lets us, up to ``limit`` bytes, reading
        what it sends meanwhile (a WINDOW_UPDATE would let us on); return once it stays shut."""
        self.mux.ping(0.0)
        ping = self.mux.data_to_send()
        blob = ping * (self.h2.max_outbound_frame_size // len(ping) + 1)
        while self.sent < limit:
            room = min(self.h2.local_flow_control_window(1), self.h2.max_outbound_frame_size, limit - self.sent)
            if room > 0:
                self.h2.send_data(1, blob[:room])
                self.sent += room
                await self.write()
                continue
            with trio.move_on_after(5):
                self.h2.receive_data(await self.stream.receive_some())
                await self.write()
                continue
            return


@pytest.mark.parametrize("end", ["client", "server"])
async def test_a_peer_that_shuts_our_window_and_floods_pings_gets_no_more_than_the_tunnel_window_held(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock, end: str
) -> None:
    """Either end (agentd's, kasd's agent port; the peer sessions use the same two) never holds
    more than ``TUNNEL_WINDOW`` of what the peer sent and the session did not take: the HTTP/2
    receive window is finite and acknowledged only as the session consumes. Before, the send that
    waits for the peer's window read on and queued whatever arrived (6 MB per virtual second)."""
    ours, theirs = trio.testing.memory_stream_pair()
    hostile = _HostilePeer(theirs, client=end == "server")
    server = TunnelServer()
    sessions: list[Session] = []
    with trio.fail_after(120):
        if end == "client":
            nursery.start_soon(hostile.open_tunnel)
            transport = await h2carrier.request_h2_tunnel(ours, scheme="http", authority="kasd", path="/tunnel",
                                                          token=TOKEN)
            sessions.append(await connect_session(nursery, transport, client=True, keepalive_interval=5,
                                                  keepalive_timeout=15))
        else:
            nursery.start_soon(lambda: h2carrier.serve_h2_connection(
                ours, server.handler, authenticate=server.authenticate,
                session_kwargs={"keepalive_interval": 5, "keepalive_timeout": 15}))
            await hostile.open_tunnel()
        await hostile.ready.wait()
        await hostile.flood(3 * h2carrier.TUNNEL_WINDOW)
        if end == "server":
            sessions.append(server.sessions[0][0])
        (session,) = sessions
        await trio.testing.wait_all_tasks_blocked()  # this side read all it will
        tunnel = session.transport
        assert isinstance(tunnel, h2carrier.H2StreamTransport)
        held = tunnel.h2s.buffered_bytes
        assert 0 < held <= h2carrier.TUNNEL_WINDOW
        assert hostile.sent < 2 * h2carrier.TUNNEL_WINDOW  # the flood stopped at the window
        assert hostile.h2.local_flow_control_window(1) == 0
        # …and the session still ends at the keepalive timeout, as it did
        await session.wait_closed()
        assert "keepalive timeout" in str(session.close_reason)


async def test_streams_moving_more_than_the_tunnel_window_both_ways_at_once_keep_moving(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window is given back as the session takes the bytes, whoever reads the connection (the
    session's reader, or a send waiting for the window): streams moving many windows' worth both
    ways at once never stall (a small window, so every send waits on it many times)."""
    monkeypatch.setattr(h2carrier, "TUNNEL_WINDOW", 256 * 1024)
    server = TunnelServer()
    left, right = trio.testing.memory_stream_pair()
    nursery.start_soon(lambda: h2carrier.serve_h2_connection(right, server.handler, authenticate=server.authenticate))
    transport = await h2carrier.request_h2_tunnel(left, scheme="http", authority="kasd", path="/tunnel", token=TOKEN)
    assert transport.driver.conn.local_settings.initial_window_size == 256 * 1024
    payloads = [bytes([97 + i]) * (1 << 20) for i in range(4)]
    with trio.fail_after(60):
        async with open_session(transport, client=True) as session:
            got: list[bytes] = [b""] * len(payloads)

            async def one(i: int) -> None:
                got[i] = await _exchange(session, payloads[i])

            async with trio.open_nursery() as streams:
                for i in range(len(payloads)):
                    streams.start_soon(one, i)
    assert got == [p.upper() for p in payloads]
