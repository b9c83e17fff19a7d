"""``kasctl proxy --token … --listen 127.0.0.1:8001``: a local port that adds the credentials.

kubectl (``--server http://127.0.0.1:8001``), curl and browsers talk plain HTTP/1.1 to it; each
client connection gets one TLS connection to kasd's Kubernetes API proxy, and each request goes
there with the client's ``Authorization`` replaced by ``Bearer <token>`` and ``Host`` by kasd's.
Bodies stream both ways; after a ``101`` (exec, attach, port-forward) bytes are relayed as they
are. Like ``kubectl proxy`` it listens on loopback only unless told otherwise (``--allow-remote``):
anyone who can reach the port acts with the token. And like ``kubectl proxy`` it passes on only
requests whose ``Host`` is an accepted name (``--accept-hosts``), so that a web page cannot reach it
by DNS rebinding; it also refuses a request whose ``Origin`` is another site than itself (WebSocket
handshakes included). ``kasctl.proxyfilter`` holds the rules; a refused request gets ``403`` naming
the reason, and nothing of it reaches kasd (the connection to kasd is made only for a request that
passed).

The token is read from ``--token-file`` or ``$KASCTL_TOKEN`` (``--token`` works, but shows in
``ps``); it is never printed or logged.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import trio

import http11
from http11 import CLOSED, END, NEED_DATA, BodyWriter, RequestParser, ResponseParser
from kasctl.errors import CommandError
from kasctl.kubeconfig import CA_VARIABLE, SERVER_VARIABLE
from kasctl.proxyfilter import (
    DEFAULT_ACCEPT_HOSTS,
    DEFAULT_REJECT_METHODS,
    FilterError,
    RequestFilter,
)
from netio.relay import relay
from wire.ids import InvalidNumber, parse_decimal

TOKEN_VARIABLE = "KASCTL_TOKEN"
MAX_HEAD = 64 * 1024
CHUNK = 64 * 1024
#: seconds to connect (TCP and TLS) to kasd
CONNECT_TIMEOUT = 15.0
#: seconds to close the connection to kasd cleanly (TLS close_notify) when the client's ends
CLOSE_TIMEOUT = 2.0
#: a refused request's body is read and dropped up to this many bytes, for this many seconds
DISCARD_LIMIT = 1024 * 1024
DISCARD_TIMEOUT = 2.0

HELP = """\
Open a local port that adds your kasd credentials, for kubectl, curl and browsers:

  kasctl proxy --token-file ~/.kasd-token --server https://kas.example.com:8154 &
  kubectl --server http://127.0.0.1:8001 get pods
  curl http://127.0.0.1:8001/api/v1/namespaces/default/pods

The token is a whole bearer token: ci:<agent id>:<job token> or pat:<agent id>:<token>. Anyone who
can reach the port uses it: the port is on loopback unless --allow-remote.

Web pages in your browser can send requests to 127.0.0.1 too, so, as kubectl proxy does, only
requests whose Host is localhost, 127.0.0.1 or [::1] (with any port) are passed on; a page that
reaches the port under a name of its own (DNS rebinding) gets 403. A request with an Origin header
(browsers send one on cross-site requests and every WebSocket handshake) must come from this proxy's
own origin, http://<accepted host>:<its port>. Behind another name (with --allow-remote):
  kasctl proxy --allow-remote --listen 0.0.0.0:8001 --accept-hosts '^devbox\\.internal$' ...
"""


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("proxy", help="a local port that adds your kasd credentials (kubectl, curl)",
                                 description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--token", metavar="TOKEN", help=f"ci:… or pat:… (default ${TOKEN_VARIABLE}); "
                                                          "shows in ps: prefer --token-file")
    parser.add_argument("--token-file", type=Path, metavar="FILE", help="read the token from FILE")
    parser.add_argument("--server", metavar="URL", help=f"kasd's Kubernetes API proxy, https://host:8154 "
                                                        f"(default ${SERVER_VARIABLE})")
    parser.add_argument("--certificate-authority", type=Path, metavar="FILE",
                        help=f"CA (PEM) of kasd's certificate (default ${CA_VARIABLE}; else the system's)")
    parser.add_argument("--listen", default="127.0.0.1:8001", metavar="HOST:PORT",
                        help="where to listen (default 127.0.0.1:8001; port 0 picks one)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a --listen address other than loopback (anyone reaching it uses your token)")
    parser.add_argument("--accept-hosts", default=DEFAULT_ACCEPT_HOSTS, metavar="REGEXPS",
                        help="pass on only requests whose Host (without port) matches one of these comma-separated "
                             "regular expressions, as kubectl proxy (default %(default)s); an Origin header must be "
                             "http://<such a host>:<this port>")
    parser.add_argument("--reject-methods", default=DEFAULT_REJECT_METHODS, metavar="REGEXPS",
                        help="refuse requests whose method matches one of these (default %(default)s: none), "
                             "e.g. 'POST,PUT,PATCH,DELETE' for a read-only port")
    parser.set_defaults(run=run)


class Upstream:
    """Where requests go: kasd's proxy URL, its TLS context, the token to add."""

    def __init__(self, server: str, token: str, ca: Path | None) -> None:
        parts = urlsplit(server)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise CommandError(f"--server must be an https:// URL of kasd's Kubernetes API proxy, got {server!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.host_header = parts.netloc.rsplit("@", 1)[-1]
        self.authorization = f"Bearer {token}"
        self.ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            try:
                self.ssl = ssl.create_default_context(cafile=str(ca)) if ca else ssl.create_default_context()
            except (OSError, ssl.SSLError) as exc:
                raise CommandError(f"cannot use --certificate-authority {ca}: {exc}") from None
            self.ssl.set_alpn_protocols(["http/1.1"])

    async def connect(self) -> trio.abc.Stream:
        with trio.fail_after(CONNECT_TIMEOUT):
            stream: trio.abc.Stream = await trio.open_tcp_stream(self.host, self.port)
            if self.ssl is not None:
                tls = trio.SSLStream(stream, self.ssl, server_hostname=self.host, https_compatible=True)
                await tls.do_handshake()
                stream = tls
        return stream

    def request_headers(self, headers: http11.framing.Headers) -> list[tuple[str, str]]:
        kept = [(k, v) for k, v in headers if k not in ("authorization", "host", "proxy-authorization")]
        return [("host", self.host_header), *kept, ("authorization", self.authorization)]


async def _event(parser: RequestParser | ResponseParser, stream: trio.abc.ReceiveStream) -> object:
    """The next event, reading as needed (EOF is fed to the parser)."""
    while True:
        event = parser.next_event()
        if event is not NEED_DATA:
            return event
        data = await stream.receive_some(CHUNK)
        if data:
            parser.feed(data)
        else:
            parser.feed_eof()


async def serve_connection(client: trio.abc.Stream, upstream: Upstream,
                           request_filter: RequestFilter | None = None) -> None:
    """One client connection: its requests, in order, over one connection to kasd (made for the
    first request the filter lets through; a refused request ends the client's connection)."""
    checks = request_filter or RequestFilter.from_flags()
    async with client:
        kasd: list[trio.abc.Stream] = []

        async def connect() -> trio.abc.Stream | None:
            if not kasd:
                try:
                    kasd.append(await upstream.connect())
                except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                    message = f"kasctl proxy: cannot reach kasd at {upstream.host}:{upstream.port}: {exc}"
                    await _answer(client, 502, message.encode())
                    return None
            return kasd[0]

        try:
            await _exchanges(client, connect, upstream, checks)
        except (trio.BrokenResourceError, trio.ClosedResourceError, http11.ProtocolError, http11.FramingError):
            pass  # either side went away or spoke nonsense: the connection ends
        finally:
            for stream in kasd:
                with trio.move_on_after(CLOSE_TIMEOUT, shield=True):
                    await stream.aclose()  # (closes even when the time runs out)


async def _exchanges(client: trio.abc.Stream, connect: Callable[[], Awaitable[trio.abc.Stream | None]],
                     upstream: Upstream, checks: RequestFilter) -> None:
    requests = RequestParser(max_head=MAX_HEAD)
    responses = ResponseParser(max_head=MAX_HEAD)
    while True:
        request = await _event(requests, client)
        if request is CLOSED or not isinstance(request, http11.Request):
            return
        refusal = checks.refusal(request)
        if refusal is not None:  # answered here; nothing of it goes to kasd
            await _answer(client, 403, f"kasctl proxy: refused: {refusal}\n".encode())
            if request.has_body and not request.upgrade:
                await _discard_body(requests, client)
            return
        kasd = await connect()
        if kasd is None:
            return
        await kasd.send_all(http11.encode_request_head(request.method, request.target,
                                                       upstream.request_headers(request.headers)))
        if not request.upgrade:
            body = BodyWriter.for_headers(request.headers)
            while (event := await _event(requests, client)) is not END:
                if isinstance(event, bytes):
                    await kasd.send_all(body.data(event))
            await kasd.send_all(body.end())
        responses.expect(request.method)
        response = await _event(responses, kasd)
        if not isinstance(response, http11.Response):
            return
        await client.send_all(http11.encode_response_head(response.status, list(response.headers)))
        if response.status == 101:  # a byte pipe from now on, both ways: the daemons' one relay
            await relay(client, kasd, early_to_server=bytes(requests.trailing),
                        early_to_client=bytes(responses.trailing), server_receive_error_is_eof=True)
            return
        no_body = request.method == "HEAD" or response.status in (204, 304)
        body = BodyWriter.for_headers(response.headers, no_body=no_body)
        while (event := await _event(responses, kasd)) is not END:
            if isinstance(event, bytes):
                await client.send_all(body.data(event))
        await client.send_all(body.end())
        if request.upgrade or not (request.keep_alive and responses.keep_alive):
            return  # (an upgrade refused: the parsers stopped at it, so the connection ends)
        requests.start_next_cycle()
        responses.start_next_cycle()


async def _discard_body(requests: RequestParser, client: trio.abc.ReceiveStream) -> None:
    """Read a refused request's body (bounded), so that closing the connection does not reset it
    before the client has read the answer (a socket closed with unread bytes sends RST)."""
    left = DISCARD_LIMIT
    with trio.move_on_after(DISCARD_TIMEOUT):
        while left > 0:
            event = await _event(requests, client)
            if not isinstance(event, bytes):
                return  # END, or the client closed
            left -= len(event)


async def _answer(client: trio.abc.SendStream, status: int, message: bytes) -> None:
    head = http11.encode_response_head(status, [("content-type", "text/plain"), ("content-length", str(len(message))),
                                                ("connection", "close")])
    try:
        await client.send_all(head + message)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def _token(args: argparse.Namespace) -> str:
    token: str
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            raise CommandError(f"cannot read --token-file {args.token_file}: {exc.strerror or exc}") from None
    else:
        token = str(args.token or os.environ.get(TOKEN_VARIABLE, "")).strip()
    if not token:
        raise CommandError(f"no token: pass --token-file, --token or set {TOKEN_VARIABLE}")
    if not token.startswith(("ci:", "pat:")) or token.count(":") < 2:
        raise CommandError("the token must be a whole bearer token: ci:<agent id>:<job token> or pat:<agent id>:<token>")
    return token


def _listen_address(text: str, allow_remote: bool) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        number = parse_decimal(port, "port", maximum=65535) if sep else None
    except InvalidNumber:
        number = None
    if number is None:
        raise CommandError(f"--listen must be HOST:PORT, got {text!r}")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not allow_remote:
        raise CommandError(f"--listen {text} is not a loopback address: anyone who reaches it would use your "
                         "token; add --allow-remote if that is what you want")
    return host, number


def run(args: argparse.Namespace) -> int:
    try:
        token = _token(args)
        server = args.server or os.environ.get(SERVER_VARIABLE)
        if not server:
            raise CommandError(f"missing --server: pass kasd's proxy URL or set {SERVER_VARIABLE}")
        ca_value = args.certificate_authority or os.environ.get(CA_VARIABLE)
        upstream = Upstream(server, token, Path(ca_value) if ca_value else None)
        host, port = _listen_address(args.listen, args.allow_remote)
        try:
            checks = RequestFilter.from_flags(args.accept_hosts, args.reject_methods)
        except FilterError as exc:
            raise CommandError(str(exc)) from None
        if args.allow_remote and args.accept_hosts == DEFAULT_ACCEPT_HOSTS:
            print("kasctl proxy: note: only requests to localhost, 127.0.0.1 or [::1] are passed on; name the "
                  "hosts others use with --accept-hosts", file=sys.stderr)
        trio.run(_serve, upstream, checks, host, port)
    except CommandError as exc:
        print(f"kasctl proxy: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"kasctl proxy: cannot listen on {args.listen}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


async def _serve(upstream: Upstream, checks: RequestFilter, host: str, port: int) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()
    print(f"Starting to serve on {bound[0]}:{bound[1]} (to {upstream.host}:{upstream.port})", flush=True)
    with trio.open_signal_receiver(*_STOP) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, lambda c: serve_connection(c, upstream, checks), listeners)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


_STOP = (signal.SIGTERM, signal.SIGINT)

__all__ = ["Upstream", "add_command", "run", "serve_connection"]
