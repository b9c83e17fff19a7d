"""A public port serving an ASGI app on kasd's own HTTP/1.1 front end — the proxy port's.

Each accepted connection goes through ``kasd.k8sproxy.http1.Http1Connection`` (``http11``, llhttp),
the code that serves the proxy port, so both ports hold a stranger to the same rules by construction:
a request with both Content-Length and Transfer-Encoding, two or a malformed Content-Length, an
obsolete line folding, a bad chunk size, a bare LF … is ``400`` and the connection closes; a head over
``max_header_bytes`` is ``431`` and the connection closes; a head not in within ``header_timeout``
(from accept, TLS handshake included) is ``408``; an idle keep-alive connection closes after
``idle_timeout``. Nothing here parses HTTP: this module only turns each ``Exchange`` into an ASGI
``http`` scope and the app's ``send`` messages into the answer, so an ASGI app stays what the port
serves (and any ASGI server could serve it elsewhere).

HTTP/1.1 only (no h2c, no ALPN ``h2``); an ``Upgrade`` is answered as a plain request; no
``lifespan`` scope. A request body beyond ``max_body_bytes`` is ``413`` and the connection closes.

A ``Bypass`` takes the requests it names before the app ever sees them (the in-cluster services'
routes, ``kasd.web.services``: the proxy's pipeline, which streams bodies without the cap and
relays upgrades); everything above (framing, head size, clocks) holds for them too.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol
from urllib.parse import unquote

import attrs
import trio

from daemonkit.logs import BurstLimitedLog, UnexpectedErrors, redact_tokens, request_context
from kasd.config import Http2Limits
from kasd.k8sproxy.accesslog import RequestRecord
from kasd.k8sproxy.exchange import ClientGone, ClientRequest, Exchange
from kasd.k8sproxy.frontend import FrontEndContext
from kasd.k8sproxy.http1 import Http1Connection
from kasd.k8sproxy.status import ProxyError
from netio.fastio import fast_stream, peer_host, peer_name, tls_stream
from tunnelhttp.requestid import REQUEST_ID_HEADER, request_id_from

__all__ = ["AsgiApp", "AsgiPort", "Bypass", "PortLimits"]

Scope = dict[str, Any]
Message = dict[str, Any]
AsgiApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

#: how long a closing TLS connection may take to send its close_notify (a client not reading)
_TLS_CLOSE_SECONDS = 1.0
_INTERNAL_ERROR = b'{"message":"500 Internal Server Error"}'


@attrs.frozen(kw_only=True)
class PortLimits:
    """What one connection may cost (``kasd.k8sproxy.frontend.ConnectionLimits``, and a body cap)."""

    #: request line and headers together
    max_header_bytes: int = 16 * 1024
    #: seconds from accept (or, kept alive, from a request's first byte) to a whole head
    header_timeout: float = 30.0
    #: seconds a kept-alive connection may wait for its next request
    idle_timeout: float = 30.0
    #: bytes of request body the app may read
    max_body_bytes: int = 64 * 1024
    #: (HTTP/1.1 only: the front-end context asks for it, nothing reads it)
    http2: Http2Limits = attrs.field(factory=Http2Limits)


class _BodyTooLarge(Exception):
    pass


class Bypass(Protocol):
    """Requests served outside the ASGI app (``kasd.web.services.ServiceDispatch``)."""

    def takes(self, request: ClientRequest) -> bool:
        """Whether ``serve`` answers this request (decided from its head alone)."""
        ...

    async def serve(self, ex: Exchange, *, done: Callable[[RequestRecord], object] | None = None,
                    proven: Callable[[], object] | None = None) -> None: ...


class AsgiPort:
    """``handle_connection`` serves one accepted stream (give it to ``trio.serve_listeners``)."""

    def __init__(self, app: AsgiApp, *, limits: PortLimits = PortLimits(), ssl_context: ssl.SSLContext | None = None,
                 log: logging.Logger, on_rejected: Callable[[int], None] = lambda status: None,
                 unexpected: UnexpectedErrors | None = None, bypass: Bypass | None = None) -> None:
        self.app = app
        #: requests answered outside the app (before it, on their head alone)
        self.bypass = bypass
        self.limits = limits
        self.ssl_context = ssl_context
        self.log = log
        #: an app that fails (a bug): one rate-limited line without the exception's message (which
        #: may quote the request), never a traceback per request
        self.unexpected = unexpected if unexpected is not None else UnexpectedErrors(log)
        self._strangers = BurstLimitedLog(log, interval=10.0)
        # The app checks a job token on every call and tells the front end nothing of it: each
        # connection lives under the head and idle clocks (``limits``) alone.
        self.port = FrontEndContext(limits=limits, serve=self.serve, count_rejected=on_rejected, authorizes=False)

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        stream = fast_stream(stream)
        peer = peer_name(stream)
        head_deadline = trio.current_time() + self.limits.header_timeout
        try:
            if self.ssl_context is not None:
                tls = tls_stream(stream, self.ssl_context, server_side=True, https_compatible=True)
                with trio.move_on_at(head_deadline) as scope:
                    try:
                        await tls.do_handshake()
                    except trio.BrokenResourceError as exc:
                        self._strangers.info((peer_host(peer), "tls"), "TLS handshake failed peer=%s error=%s", peer,
                                             exc.__cause__ or exc)
                        return
                if scope.cancelled_caught:
                    return  # no handshake within the head timeout: nothing to answer
                stream = tls
            await Http1Connection(stream, self.port, initial=b"", head_deadline=head_deadline, peer=peer).run()
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError) as exc:
            self.log.debug("connection ended peer=%s error=%r", peer, exc)
        except Exception:  # one bad connection must never take the listener down
            self.log.exception("connection failed peer=%s", peer)
        finally:
            with trio.move_on_after(_TLS_CLOSE_SECONDS, shield=True):
                await stream.aclose()

    async def serve(self, ex: Exchange, *, refusal: ProxyError | None = None, log_dropped: bool = True,
                    done: Callable[[RequestRecord], object] | None = None,
                    proven: Callable[[], object] | None = None) -> None:
        """One request: the app's answer, or kasd's (``400`` for a target that is not a path, ``413``
        for a body over the cap, ``500`` for an app that failed before answering)."""
        request = ex.request
        if self.bypass is not None and request.target.startswith("/") and self.bypass.takes(request):
            await self.bypass.serve(ex, done=done, proven=proven)  # (its own access line)
            return
        started = trio.current_time()
        path = request.target.split("?", 1)[0]
        request_id = request_id_from(request.headers)
        reply = _Reply(ex, request_id)
        with request_context(request_id):
            try:
                if not request.target.startswith("/"):
                    await reply.complete(400, b'{"message":"400 Bad Request: the request target must be a path"}')
                else:
                    await self._call_app(ex, reply)
            except ClientGone:
                reply.outcome = "client-gone"
            # The path only: the query string may carry a token (``?job_token=``).
            self.log.info("request request_id=%s method=%s path=%s proto=%s peer=%s status=%d duration=%.3f outcome=%s",
                          request_id, request.method[:32], _printable(path[:512]), request.protocol, request.peer,
                          reply.status, trio.current_time() - started, reply.outcome)

    async def _call_app(self, ex: Exchange, reply: _Reply) -> None:
        request = ex.request
        raw_path, _, query = request.target.partition("?")
        host, _, port = request.peer.rpartition(":")
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.protocol.removeprefix("HTTP/"),
            "method": request.method,
            "scheme": "https" if self.ssl_context is not None else "http",
            "path": unquote(raw_path, errors="replace"),
            "raw_path": raw_path.encode("latin-1"),
            "query_string": query.encode("latin-1"),
            "root_path": "",
            "headers": [(name.encode("latin-1"), value.encode("latin-1")) for name, value in request.headers],
            "client": (host.strip("[]"), int(port)) if port.isdigit() else None,
            "server": None,
        }
        body = _Body(ex, self.limits.max_body_bytes)
        try:
            await self.app(scope, body.receive, reply.send)
        except ClientGone:
            raise
        except _BodyTooLarge:
            if reply.started:
                ex.abort()
            else:
                await reply.complete(413, b'{"message":"413 Request Entity Too Large: the body is over %d bytes"}'
                                     % self.limits.max_body_bytes)
            return
        except Exception as exc:
            self.unexpected.report(exc, "the API failed method=%s path=%s", request.method[:32],
                                   _printable(raw_path[:512]))
            if reply.started:
                reply.outcome = "aborted"
                ex.abort()
            else:
                await reply.complete(500, _INTERNAL_ERROR)
            return
        if not reply.finished:
            if reply.started:
                reply.outcome = "aborted"
                ex.abort()  # the app stopped mid-answer: show a truncated body, never a clean end
            else:
                self.log.error("the API returned no answer method=%s path=%s", request.method,
                               _printable(raw_path[:512]))
                await reply.complete(500, _INTERNAL_ERROR)


class _Body:
    """ASGI ``receive``: the request body, then (once it is all in) a wait for the client to leave."""

    def __init__(self, ex: Exchange, limit: int) -> None:
        self.ex = ex
        self.limit = limit
        self.size = 0
        #: the body's last message was given to the app
        self.done = False
        self._empty = not ex.request.has_body and ex.take_empty_body()

    async def receive(self) -> Message:
        if self._empty and not self.done:
            self.done = True
            return {"type": "http.request", "body": b"", "more_body": False}
        if self.done:
            try:
                await self.ex.watch_client()
            except ClientGone:
                return {"type": "http.disconnect"}
            await trio.sleep_forever()  # it sent more (a pipelined request): it is still there
        chunk = await self.ex.receive_body()
        self.size += len(chunk)
        if self.size > self.limit:
            raise _BodyTooLarge
        self.done = not chunk
        return {"type": "http.request", "body": chunk, "more_body": bool(chunk)}


class _Reply:
    """ASGI ``send``: the app's ``http.response.*`` messages as the exchange's answer."""

    def __init__(self, ex: Exchange, request_id: str) -> None:
        self.ex = ex
        #: answered in ``X-Request-Id`` (instead of any the app set)
        self.request_id = request_id
        self.status = 0
        self.outcome = "ok"
        self.headers: list[tuple[str, str]] = []
        #: the head is decided (``http.response.start``), and on the wire once a body part came
        self.started = False
        self._sent = False
        self.finished = False

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start" and not self.started:
            self.started = True
            self.status = int(message["status"])
            self.headers = [(bytes(name).decode("latin-1").lower(), bytes(value).decode("latin-1"))
                            for name, value in message.get("headers", ())]
            self.headers = [*((k, v) for k, v in self.headers if k != REQUEST_ID_HEADER),
                            (REQUEST_ID_HEADER, self.request_id)]
        elif kind == "http.response.body" and self.started and not self.finished:
            body = bytes(message.get("body", b""))
            more = bool(message.get("more_body", False))
            if not self._sent:
                self._sent = True
                if more:
                    await self.ex.respond(self.status, self.headers, body, end=False)
                else:
                    # A whole answer in one: the front end frames it, and closes if the request body
                    # was not all read (the next request could not be found in it).
                    self.finished = True
                    await self.ex.send_error(self.status, _with_length(self.headers, body), body)
                    return
            elif body:
                await self.ex.send(body)
            if not more:
                self.finished = True
                await self.ex.end()
        else:
            raise RuntimeError(f"ASGI message {kind!r} out of order")

    async def complete(self, status: int, body: bytes) -> None:
        """kasd's own answer, instead of the app's."""
        self.started = self._sent = self.finished = True
        self.status = status
        headers = [("content-type", "application/json"), ("cache-control", "no-store"),
                   (REQUEST_ID_HEADER, self.request_id)]
        await self.ex.send_error(status, _with_length(headers, body), body)


def _with_length(headers: Sequence[tuple[str, str]], body: bytes) -> list[tuple[str, str]]:
    if any(name == "content-length" for name, _ in headers):
        return list(headers)
    return [*headers, ("content-length", str(len(body)))]


def _printable(text: str) -> str:
    """A path for a log line: no control characters or spaces (it is the client's)."""
    text = redact_tokens(text)
    return "".join(c if c.isprintable() and c != " " else f"%{ord(c):02X}" for c in text) or "-"
