"""hypercorn serving `Upgrade: SPDY/3.1` as a raw byte stream — a fence around hypercorn internals.

kubectl's SPDY transport (exec, attach, port-forward with WebSockets off) sends a plain HTTP/1.1
request with `Connection: Upgrade` / `Upgrade: SPDY/3.1`, expects `101 Switching Protocols`, and
then speaks SPDY on the bare connection. hypercorn turns only WebSocket upgrades into a byte
passthrough, and ASGI has no message for a raw upgrade, so this module adds one, on kubesim's
own connections only (`serve`; nothing here changes hypercorn for other servers in the process):

* A request whose `Connection` has the `upgrade` token, whose `Upgrade` is `SPDY/3.1` and which
  has no body reaches the app as an ordinary `http` scope carrying the extension
  `spdy_session.RAW_UPGRADE_EXTENSION`. The app authenticates and checks it like any request,
  and may answer with a normal `http.response.*` (a 4xx Status): the connection stays
  keep-alive for the next request.
* Or it sends `{"type": RAW_ACCEPT, "headers": [...]}`: the server writes `101` with
  `Connection: Upgrade`, `Upgrade: SPDY/3.1` and those headers, and from then on passes bytes
  through: `{"type": RAW_RECEIVE, "bytes": ...}` in (then `http.disconnect` at EOF),
  `{"type": RAW_SEND, "bytes": ...}` out, `{"type": RAW_CLOSE}` (or the app returning) closes
  the connection. Received bytes wait in a bounded queue (`INBOUND_CHUNKS` reads of at most
  64 KiB); when it is full hypercorn stops reading the socket, so TCP pushes back.
* It works on any request of a keep-alive connection, not only the first (agentd's upstream
  pool reuses keep-alive connections for upgrades).

What it relies on (checked against hypercorn 0.18.0; `kubesim/pyproject.toml` pins `<0.19`;
tests/kubesim/test_spdy_serve.py::test_hypercorn_internals_hyperraw_relies_on names each):

1. `hypercorn.trio.tcp_server.TCPServer.run` builds its `ProtocolWrapper` and assigns it to
   `self.protocol` before using it; `ProtocolWrapper.protocol` is the `H11Protocol` for a
   connection that did not negotiate h2, and its constructor arguments are the wrapper's
   attributes of the same names (`state` passed as `connection_state`).
2. `H11Protocol._create_stream(request)` makes `self.stream` for each `h11.Request`, and
   `H11Protocol.stream_send` turns a `Response` below 200 into an `h11.InformationalResponse`,
   `Data` into raw bytes, `StreamClosed` into recycling or closing the connection.
3. `H11WSConnection(h11_connection)` is the byte passthrough hypercorn uses after a WebSocket
   101: put in `H11Protocol.connection`, it hands the reader every byte (h11's unparsed
   `trailing_data` first); setting `H11Protocol.can_read` resumes a reader that h11 paused on
   the pending upgrade.
4. `TCPServer.run` serves one connection and closes it, raising what went wrong (an error raised
   out of it ends the listener's `serve_listeners`: `RawUpgradeTCPServer.run` keeps it to that
   connection).
5. `hypercorn.trio.run.worker_serve`'s order (lifespan, sockets, listeners, `serve_listeners`
   with a `TCPServer` factory, graceful deadline): `serve` repeats it with kubesim's
   `TCPServer`, TCP only (no QUIC, no multiprocess workers).

The switch: `serve_kubesim(spdy=False)` or `KUBESIM_SPDY=0` in the environment serves with
hypercorn's own `serve` instead; SPDY upgrades then get a 400 Status saying so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import unquote

import h11
import trio
from hypercorn.config import Config
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.events import (
    Body,
    Data,
    EndBody,
    Request,
    Response,
    StreamClosed,
)
from hypercorn.protocol.events import (
    Event as StreamEvent,
)
from hypercorn.protocol.h11 import STREAM_ID, H11Protocol, H11WSConnection
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState, LifespanState
from hypercorn.utils import (
    ShutdownError,
    build_and_validate_headers,
    raise_shutdown,
    repr_socket_addr,
    wrap_app,
)

from kubesim.spdy_session import (
    RAW_ACCEPT,
    RAW_CLOSE,
    RAW_RECEIVE,
    RAW_SEND,
    RAW_UPGRADE_EXTENSION,
)

log = logging.getLogger(__name__)

#: The upgrade token served raw (compared case-insensitively, as Go's client compares it).
UPGRADE_TOKEN = "SPDY/3.1"
#: Socket reads (at most 64 KiB each) queued for the app before hypercorn stops reading.
INBOUND_CHUNKS = 4


def enabled_by_environment() -> bool:
    """False when `KUBESIM_SPDY` is `0`, `false`, `off` or `no` (the switch that turns it off)."""
    return os.environ.get("KUBESIM_SPDY", "1").strip().lower() not in ("0", "false", "off", "no")


def is_raw_upgrade(request: h11.Request) -> bool:
    """Whether `request` asks for the SPDY upgrade this module serves raw."""
    connection = upgrade = ""
    has_body = False
    for name, value in request.headers:
        if name == b"connection":
            connection += "," + value.decode("latin-1")
        elif name == b"upgrade":
            upgrade = value.decode("latin-1").strip()
        elif name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            has_body = True
    tokens = {token.strip().lower() for token in connection.split(",")}
    return "upgrade" in tokens and upgrade.lower() == UPGRADE_TOKEN.lower() and not has_body


class _RawUpgradeStream:
    """One raw-upgrade request: an `http` scope until the app accepts, then bytes both ways."""

    def __init__(self, protocol: RawUpgradeH11Protocol) -> None:
        self._protocol = protocol
        self._state = "request"  # → "response" (an HTTP answer) | "raw" → "done"
        self._request_delivered = False
        self._inbound_send, self._inbound = trio.open_memory_channel[bytes](INBOUND_CHUNKS)
        self._disconnected = trio.Event()
        self.closed = False

    async def handle(self, event: StreamEvent) -> None:
        if isinstance(event, Request):
            self._protocol.task_group.spawn(self._run_app, self._scope(event))
        elif isinstance(event, Data):
            if self._state == "raw" and not self.closed:
                try:
                    await self._inbound_send.send(bytes(event.data))
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    pass  # closed meanwhile: the bytes have nobody to go to
        elif isinstance(event, StreamClosed):
            self.closed = True
            self._inbound_send.close()
            self._disconnected.set()
        # Body/EndBody: a raw upgrade has no body (is_raw_upgrade), EndBody carries nothing.

    def _scope(self, event: Request) -> dict[str, Any]:
        path, _, query = event.raw_path.partition(b"?")
        return {
            "type": "http",
            "http_version": event.http_version,
            "asgi": {"spec_version": "2.1", "version": "3.0"},
            "method": event.method,
            "scheme": "https" if self._protocol.ssl else "http",
            "path": unquote(path.decode("ascii")),
            "raw_path": path,
            "query_string": query,
            "root_path": self._protocol.config.root_path,
            "headers": event.headers,
            "client": self._protocol.client,
            "server": self._protocol.server,
            "state": event.state.copy(),
            "extensions": {RAW_UPGRADE_EXTENSION: {}},
        }

    async def _run_app(self, scope: dict[str, Any]) -> None:
        try:
            await self._protocol.app(
                scope,  # type: ignore[arg-type]  # an http scope plus the raw-upgrade messages
                self._receive,  # type: ignore[arg-type]
                self._app_send,  # type: ignore[arg-type]
                trio.to_thread.run_sync,
                trio.from_thread.run,
            )
        except Exception:
            log.exception("error in the app serving a raw upgrade")
        finally:
            with trio.CancelScope(shield=True):
                await self._app_send(None)

    async def _receive(self) -> dict[str, Any]:
        if not self._request_delivered:
            self._request_delivered = True
            await trio.lowlevel.checkpoint()
            return {"type": "http.request", "body": b"", "more_body": False}
        if self._state == "raw":
            try:
                data = await self._inbound.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return {"type": "http.disconnect"}
            return {"type": RAW_RECEIVE, "bytes": data}
        await self._disconnected.wait()
        return {"type": "http.disconnect"}

    async def _send(self, event: StreamEvent) -> None:
        await self._protocol.stream_send(event)

    async def _app_send(self, message: dict[str, Any] | None) -> None:
        if message is None:  # the app returned
            if self.closed or self._state == "done":
                return
            if self._state == "request":
                await self._send(Response(stream_id=STREAM_ID, status_code=500, headers=[
                    (b"content-length", b"0"), (b"connection", b"close")]))
                await self._send(EndBody(stream_id=STREAM_ID))
            self._state = "done"
            await self._send(StreamClosed(stream_id=STREAM_ID))
            return
        kind = message["type"]
        if kind == "http.response.start" and self._state == "request":
            self._state = "response"
            headers = build_and_validate_headers(message.get("headers", []))
            await self._send(Response(stream_id=STREAM_ID, headers=headers,
                                      status_code=int(message["status"])))
        elif kind == "http.response.body" and self._state == "response":
            if message.get("body"):
                await self._send(Body(stream_id=STREAM_ID, data=bytes(message["body"])))
            if not message.get("more_body", False):
                self._state = "done"
                await self._send(EndBody(stream_id=STREAM_ID))
                await self._send(StreamClosed(stream_id=STREAM_ID))
        elif kind == RAW_ACCEPT and self._state == "request":
            await self._switch(build_and_validate_headers(message.get("headers", [])))
        elif kind == RAW_SEND and self._state == "raw":
            if self.closed:
                raise trio.ClosedResourceError("the connection is closed")
            await self._send(Data(stream_id=STREAM_ID, data=bytes(message["bytes"])))
        elif kind == RAW_CLOSE and self._state == "raw":
            self._state = "done"
            if not self.closed:
                await self._send(StreamClosed(stream_id=STREAM_ID))
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} in state {self._state}")

    async def _switch(self, headers: list[tuple[bytes, bytes]]) -> None:
        if self.closed:
            raise trio.ClosedResourceError("the client went away before the upgrade")
        await self._send(Response(stream_id=STREAM_ID, status_code=101, headers=[
            (b"connection", b"Upgrade"), (b"upgrade", UPGRADE_TOKEN.encode()), *headers]))
        # h11 has switched protocols: from now on the reader hands over every byte, starting
        # with what h11 read past the request, and resumes if h11 had paused it.
        protocol = self._protocol
        assert isinstance(protocol.connection, h11.Connection)
        protocol.connection = H11WSConnection(protocol.connection)
        self._state = "raw"
        await protocol.can_read.set()


class RawUpgradeH11Protocol(H11Protocol):
    """hypercorn's HTTP/1.1 protocol, plus SPDY upgrades served raw (see the module)."""

    async def _create_stream(self, request: h11.Request) -> None:
        if not is_raw_upgrade(request):
            await super()._create_stream(request)
            return
        stream = _RawUpgradeStream(self)
        self.stream = stream  # type: ignore[assignment]
        if self.config.h11_pass_raw_headers:
            headers = request.headers.raw_items()
        else:
            headers = list(request.headers)
        await stream.handle(Request(
            stream_id=STREAM_ID,
            headers=headers,
            http_version=request.http_version.decode(),
            method=request.method.decode("ascii").upper(),
            raw_path=request.target,
            state=self.connection_state,
        ))
        self.keep_alive_requests += 1
        await self.context.mark_request()


class RawUpgradeTCPServer(TCPServer):
    """hypercorn's Trio connection handler, speaking `RawUpgradeH11Protocol` for HTTP/1.1; a
    connection whose handling fails ends alone (see `run`)."""

    async def run(self) -> None:
        # An error in one connection ends that connection, not the server, as a real API server
        # goes on serving its other clients: hypercorn 0.18's HTTP/2 protocol looks a DATA frame's
        # stream up in its table without a check, so a client that sends a request's body after
        # the answer came (kubectl's body after a refusal at the headers, an impersonation refused)
        # raised KeyError out of here, through `trio.serve_listeners`, and stopped kubesim for
        # every client. (Cancellation is a BaseException: it passes.)
        try:
            await super().run()
        except Exception as exc:
            log.warning("connection ended by an error in its handling: %r", exc)

    @property
    def protocol(self) -> ProtocolWrapper:
        return self._raw_protocol

    @protocol.setter
    def protocol(self, wrapper: ProtocolWrapper) -> None:
        if type(wrapper.protocol) is H11Protocol:
            wrapper.protocol = RawUpgradeH11Protocol(
                wrapper.app, wrapper.config, wrapper.context, wrapper.task_group, wrapper.state,
                wrapper.ssl, wrapper.client, wrapper.server, wrapper.send)
        self._raw_protocol = wrapper


async def serve(
    app: Callable[..., Awaitable[None]],
    config: Config,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """`hypercorn.trio.serve` for TCP listeners, with `RawUpgradeTCPServer` per connection."""
    wrapped = wrap_app(app, config.wsgi_max_body_size, None)
    config.set_statsd_logger_class(StatsdLogger)
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as server_nursery:
            sockets = config.create_sockets()
            listeners: list[trio.SSLListener[trio.SocketStream] | trio.SocketListener] = []
            binds = []
            ssl_context = config.create_ssl_context()
            for sock in sockets.secure_sockets:
                assert ssl_context is not None  # secure sockets exist only with TLS configured
                sock.listen(config.backlog)
                listeners.append(trio.SSLListener(
                    trio.SocketListener(trio.socket.from_stdlib_socket(sock)), ssl_context,
                    https_compatible=True))
                binds.append(f"https://{repr_socket_addr(sock.family, sock.getsockname())}")
            for sock in sockets.insecure_sockets:
                sock.listen(config.backlog)
                listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
                binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
            task_status.started(binds)
            try:
                async with trio.open_nursery(strict_exception_groups=True) as nursery:
                    nursery.start_soon(raise_shutdown, shutdown_trigger)
                    nursery.start_soon(raise_shutdown, context.terminate.wait)
                    nursery.start_soon(partial(
                        trio.serve_listeners,
                        partial(RawUpgradeTCPServer, wrapped, config, context,
                                ConnectionState(lifespan_state.copy())),
                        listeners, handler_nursery=server_nursery))
                    await trio.sleep_forever()
            except BaseExceptionGroup as error:
                _, others = error.split((ShutdownError, KeyboardInterrupt))
                if others is not None:
                    raise others from None
            finally:
                await context.terminated.set()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


__all__ = ["RawUpgradeH11Protocol", "RawUpgradeTCPServer", "enabled_by_environment",
           "is_raw_upgrade", "serve"]
