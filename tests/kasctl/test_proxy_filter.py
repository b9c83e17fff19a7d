"""kasctl proxy passes on with the token only what a page in the user's browser cannot forge its way
into: Host an accepted name (DNS rebinding refused), Origin this proxy's own, a path target — in
process, over memory streams, with a fake kasd that records whether anything reached it."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import http11
from http11 import END, NEED_DATA, RequestParser
from kasctl.proxy import Upstream, serve_connection
from kasctl.proxyfilter import RequestFilter

pytestmark = pytest.mark.timeout(10)

TOKEN = "ci:1:s3cret-job-token"


class FakeKasd(Upstream):
    """kasd's proxy port as a memory stream: records each request that reaches it, answers 200 (or
    101 to an upgrade) with ``ok``."""

    def __init__(self, nursery: trio.Nursery) -> None:
        super().__init__("http://kasd.test:8154", TOKEN, None)
        self.nursery = nursery
        self.connects = 0
        self.received: list[http11.Request] = []

    async def connect(self) -> trio.abc.Stream:
        self.connects += 1
        ours, theirs = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self._serve, theirs)
        return ours

    async def _serve(self, stream: trio.abc.Stream) -> None:
        async with stream:
            await self._answer(stream)

    async def _answer(self, stream: trio.abc.Stream) -> None:
        parser = RequestParser(max_head=64 * 1024)
        while True:
            event = parser.next_event()
            if event is NEED_DATA:
                data = await stream.receive_some(65536)
                if not data:
                    return
                parser.feed(data)
                continue
            if isinstance(event, http11.Request):
                self.received.append(event)
                if event.upgrade:
                    await stream.send_all(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n"
                                          b"connection: upgrade\r\n\r\n")
                    return
            elif event is END:
                await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                parser.start_next_cycle()


async def exchange(upstream: FakeKasd, head: str, checks: RequestFilter | None = None) -> bytes:
    """Send one request head through a proxy connection; what the client gets back (until the proxy
    closes, or the first answer's end)."""
    client, proxy_side = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, proxy_side, upstream, checks)
        await client.send_all(head.encode("latin-1"))
        answer = b""
        while not ((answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok"))
                   or (answer.startswith(b"HTTP/1.1 101") and answer.endswith(b"\r\n\r\n"))):
            data = await client.receive_some(65536)
            if not data:
                break
            answer += data
        await client.aclose()
    return answer


def request(host: str, *extra: str, method: str = "GET", target: str = "/api/v1/namespaces/default/secrets") -> str:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", *extra, "", ""]
    return "\r\n".join(lines)


async def test_a_page_under_another_name_is_refused_and_nothing_reaches_kasd(nursery: trio.Nursery) -> None:
    # DNS rebinding: attacker.example now resolves to 127.0.0.1; the page is same-origin with it, so
    # the browser sends Host and Origin of attacker.example — a list of Secrets and a create
    kasd = FakeKasd(nursery)
    listed = await exchange(kasd, request("attacker.example:8001", "Origin: http://attacker.example:8001"))
    created = await exchange(kasd, request("attacker.example:8001", "Origin: http://attacker.example:8001",
                                           "Content-Type: application/json", "Content-Length: 2",
                                           method="POST", target="/api/v1/namespaces/default/configmaps") + "{}")
    for answer in (listed, created):
        assert answer.startswith(b"HTTP/1.1 403 ")
        assert b"Host 'attacker.example' is not accepted (--accept-hosts)" in answer and b"DNS rebinding" in answer
    assert kasd.connects == 0 and kasd.received == []
    # variations: no port, upper case, a trailing dot, a suffix, userinfo, two Hosts, none, an
    # absolute URI naming another host, CONNECT
    for head in (request("attacker.example"), request("LOCALHOST.attacker.example:8001"),
                 request("localhost.:8001"), request("127.0.0.1.nip.io:8001"), request("user@localhost:8001"),
                 request("localhost:8001", "Host: attacker.example"), "GET / HTTP/1.1\r\n\r\n",
                 request("localhost:8001", target="http://attacker.example/api"),
                 request("localhost:8001", method="CONNECT", target="attacker.example:443")):
        answer = await exchange(kasd, head)
        assert answer.startswith(b"HTTP/1.1 403 "), head
    assert kasd.connects == 0


async def test_localhost_and_loopback_addresses_go_through_with_the_token(nursery: trio.Nursery) -> None:
    kasd = FakeKasd(nursery)
    for host in ("localhost:8001", "127.0.0.1:8001", "[::1]:8001", "LocalHost:8001", "127.0.0.1"):
        answer = await exchange(kasd, request(host, "Authorization: Bearer ci:1:other"))
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok"), host
    assert len(kasd.received) == 5
    for forwarded in kasd.received:
        assert ("authorization", f"Bearer {TOKEN}") in forwarded.headers
        assert ("host", "kasd.test:8154") in forwarded.headers
    # a same-origin page (a service proxied under /api/v1/…/proxy/) may POST and open WebSockets
    same = await exchange(kasd, request("localhost:8001", "Origin: http://localhost:8001", "Content-Length: 0",
                                        method="POST"))
    assert same.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("origin", [
    "http://attacker.example", "http://attacker.example:8001", "https://localhost:8001", "http://localhost:3000",
    "http://localhost", "null", "http://localhost:8001/path", "http://user@localhost:8001", "not a url",
    "http://127.0.0.1.attacker.example:8001",
])
async def test_a_foreign_origin_is_refused_websocket_handshakes_included(nursery: trio.Nursery, origin: str) -> None:
    # a cross-site page may send simple requests and open WebSockets (exec) to 127.0.0.1 directly:
    # Host is then right, Origin is not
    kasd = FakeKasd(nursery)
    for head in (request("localhost:8001", f"Origin: {origin}"),
                 request("127.0.0.1:8001", f"Origin: {origin}", "Connection: Upgrade", "Upgrade: websocket",
                         "Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                         "Sec-WebSocket-Protocol: v5.channel.k8s.io",
                         target="/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=1")):
        answer = await exchange(kasd, head)
        assert answer.startswith(b"HTTP/1.1 403 ") and b"Origin" in answer and b"another site" in answer
    assert kasd.connects == 0
    # the same WebSocket handshake from the proxy's own origin goes through
    upgraded = await exchange(kasd, request("127.0.0.1:8001", "Origin: http://127.0.0.1:8001", "Connection: Upgrade",
                                            "Upgrade: websocket", target="/api/v1/namespaces/default/pods/p/exec"))
    assert upgraded.startswith(b"HTTP/1.1 101 ")


async def test_accept_hosts_and_reject_methods_are_honoured(nursery: trio.Nursery) -> None:
    kasd = FakeKasd(nursery)
    checks = RequestFilter.from_flags(r"^devbox\.internal$,^10\.", "POST,DELETE")
    assert (await exchange(kasd, request("devbox.internal:8001"), checks)).startswith(b"HTTP/1.1 200 ")
    assert (await exchange(kasd, request("10.1.2.3:8001", "Origin: http://10.1.2.3:8001"), checks)).startswith(
        b"HTTP/1.1 200 ")
    refused = [await exchange(kasd, head, checks) for head in (
        request("localhost:8001"),  # no longer in the list
        request("devbox.internal.evil:8001", "Origin: http://devbox.internal.evil:8001"),
        request("devbox.internal:8001", "Origin: http://localhost:8001"),
        request("devbox.internal:8001", method="DELETE"),
    )]
    assert all(a.startswith(b"HTTP/1.1 403 ") for a in refused)
    assert b"method 'DELETE' is refused (--reject-methods)" in refused[-1]
    assert len(kasd.received) == 2


def test_bad_expressions_name_the_flag() -> None:
    from kasctl.proxyfilter import FilterError
    with pytest.raises(FilterError, match=r"--accept-hosts: '\^\(' is not a regular expression"):
        RequestFilter.from_flags("^(")


async def test_each_request_on_a_connection_is_checked(nursery: trio.Nursery) -> None:
    # a good request, then one under another name on the same connection (pipelined): the second
    # is refused, its body read and dropped (so closing does not reset the 403), and never forwarded
    kasd = FakeKasd(nursery)
    client, proxy_side = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as inner:
        inner.start_soon(serve_connection, proxy_side, kasd, None)
        await client.send_all((request("localhost:8001")
                               + request("attacker.example:8001", "Content-Length: 5", method="POST")
                               + "hello").encode())
        answer = b""
        while data := await client.receive_some(65536):
            answer += data
    assert answer.startswith(b"HTTP/1.1 200 ") and b"\r\n\r\nokHTTP/1.1 403 " in answer
    assert len(kasd.received) == 1 and kasd.connects == 1
