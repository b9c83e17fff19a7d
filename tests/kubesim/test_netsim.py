"""What listens in a simulated pod: in-process connections, nginx, busybox httpd, the echo port."""

from __future__ import annotations

import errno
from typing import Any

import h11
import pytest
import trio
import trio.testing

from kubesim import httpservers, netsim
from kubesim.shell import CapturedIO, run_command

pytestmark = pytest.mark.timeout(30)


# -- connections ---------------------------------------------------------------------------------


async def test_a_connection_carries_bytes_both_ways_and_half_closes() -> None:
    a, b = netsim.socket_pair()
    await a.send_all(b"ping")
    assert await b.receive_some(100) == b"ping"
    await b.send_all(b"pong")
    await b.send_eof()
    assert await a.receive_some(100) == b"pong"
    assert await a.receive_some(100) == b""  # EOF, and a can still write
    await a.send_all(b"more")
    assert await b.receive_some(2) == b"mo"
    assert await b.receive_some(100) == b"re"


async def test_a_full_buffer_makes_the_writer_wait() -> None:
    a, b = netsim.socket_pair(limit=10)
    done = trio.Event()

    async def write() -> None:
        await a.send_all(b"x" * 25)
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()
        received = b""
        while len(received) < 25:
            received += await b.receive_some(7)
        await done.wait()
    assert received == b"x" * 25


async def test_closing_resets_the_peer() -> None:
    a, b = netsim.socket_pair()
    await a.send_all(b"unread")
    await b.aclose()
    with pytest.raises(trio.BrokenResourceError):
        await a.send_all(b"more")
    assert await a.receive_some(10) == b""
    with pytest.raises(trio.ClosedResourceError):
        await b.receive_some(10)


# -- who listens ---------------------------------------------------------------------------------


def _pod(image: str = "nginx:1.27", *, running: bool = True, ports: list[int] | None = None,
         name: str = "web") -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": image}
    if ports:
        container["ports"] = [{"containerPort": p} for p in ports]
    state = {"running": {}} if running else {"waiting": {"reason": "ContainerCreating"}}
    return {"metadata": {"namespace": "default", "name": name, "uid": "u-1"},
            "spec": {"containers": [container]},
            "status": {"phase": "Running" if running else "Pending",
                       "containerStatuses": [{"name": "c", "state": state}]}}


class _Ctl:
    """`netsim.Containers`, what the network reads of the kubelet: which containers run a process
    of their own, and their filesystems (none here: nginx serves its image's own pages)."""

    def __init__(self) -> None:
        self.processes: dict[tuple[str, str, str], object] = {}

    def filesystem(self, namespace: str, pod: str, container: str) -> None:
        return None


@pytest.mark.parametrize("image", ["nginx", "nginx:1.27", "docker.io/library/nginx@sha256:abc",
                                   "nginxinc/nginx-unprivileged:stable", "bitnami/nginx"])
def test_images_named_like_nginx(image: str) -> None:
    assert httpservers.is_nginx_image(image)


@pytest.mark.parametrize("image", ["busybox", "mynginxapp", "nginxdemo/hello", "redis:nginx"])
def test_images_not_named_like_nginx(image: str) -> None:
    assert not httpservers.is_nginx_image(image)


def test_what_listens_where() -> None:
    network, ctl = netsim.Network(), _Ctl()
    nginx = _pod(ports=[8080])
    assert network.listener(ctl, nginx, 80) is not None
    assert network.listener(ctl, nginx, 8080) is not None
    assert network.listener(ctl, nginx, netsim.ECHO_PORT) is netsim.serve_echo
    assert network.listener(ctl, nginx, 81) is None
    busybox = _pod("busybox")
    assert network.listener(ctl, busybox, 80) is None
    assert network.listener(ctl, busybox, netsim.ECHO_PORT) is netsim.serve_echo
    assert network.listener(ctl, _pod(running=False), netsim.ECHO_PORT) is None
    # nginx's image running a command of its own (`-- sleep 3600`) runs no nginx.
    ctl.processes[("default", "web", "c")] = object()
    assert network.listener(ctl, nginx, 80) is None


async def test_connecting_where_nothing_listens_is_refused() -> None:
    network = netsim.Network()
    async with trio.open_nursery() as nursery:
        with pytest.raises(ConnectionRefusedError) as caught:
            await network.connect(_Ctl(), _pod("busybox"), 81, nursery)
    assert caught.value.errno == errno.ECONNREFUSED


async def test_the_echo_port_echoes_a_mebibyte_and_the_end() -> None:
    network = netsim.Network()
    payload = bytes(range(256)) * 4096
    async with trio.open_nursery() as nursery:
        client = await network.connect(_Ctl(), _pod("busybox"), netsim.ECHO_PORT, nursery)

        async def write() -> None:
            for start in range(0, len(payload), 10_000):
                await client.send_all(payload[start:start + 10_000])
            await client.send_eof()

        nursery.start_soon(write)
        echoed = bytearray()
        while chunk := await client.receive_some(65536):
            echoed += chunk
    assert bytes(echoed) == payload


def test_a_port_is_listened_on_once_and_freed_after() -> None:
    network = netsim.Network()
    ports = network.ports("default", "web", "u-1")
    with ports.listen(8000, netsim.serve_echo):
        assert network.statistics() == {("default", "web", "u-1"): [8000]}
        with pytest.raises(OSError) as caught, ports.listen(8000, netsim.serve_echo):
            pass
        assert caught.value.errno == errno.EADDRINUSE
    assert network.statistics() == {}


# -- HTTP ----------------------------------------------------------------------------------------


async def _exchange(handler: netsim.Handler, request: bytes, *, responses: int = 1,
                    eof: bool = False) -> list[tuple[h11.Response, bytes]]:
    """Send raw request bytes to a server and parse `responses` responses with an h11 client."""
    client, server = netsim.socket_pair()
    out: list[tuple[h11.Response, bytes]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler, server)

        async def write() -> None:
            try:
                for start in range(0, len(request), 50_000):
                    await client.send_all(request[start:start + 50_000])
                if eof:
                    await client.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the server closed first (413) or we are done reading

        nursery.start_soon(write)
        conn = h11.Connection(h11.CLIENT)
        # h11 only parses responses to requests it sent: tell it what we sent, in order.
        sent = h11.Connection(h11.SERVER)
        sent.receive_data(request)
        for _ in range(responses):
            event = sent.next_event()
            assert isinstance(event, h11.Request)
            # Only the method matters to h11's parsing of the answer (HEAD has no body).
            conn.send(h11.Request(method=event.method, target=event.target, headers=[("Host", "x")]))
            while True:
                body_event = sent.next_event()
                if isinstance(body_event, h11.EndOfMessage) or body_event is h11.NEED_DATA:
                    break
            conn.send(h11.EndOfMessage())
            response, body = None, bytearray()
            while True:
                ev = conn.next_event()
                if ev is h11.NEED_DATA:
                    conn.receive_data(await client.receive_some(65536))
                elif isinstance(ev, h11.Response):
                    response = ev
                elif isinstance(ev, h11.Data):
                    body += ev.data
                elif isinstance(ev, h11.EndOfMessage):
                    break
                else:
                    raise AssertionError(ev)
            assert response is not None
            out.append((response, bytes(body)))
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                break
            conn.start_next_cycle()
            sent.send(h11.Response(status_code=204, headers=[]))
            sent.send(h11.EndOfMessage())
            sent.start_next_cycle()
        await client.aclose()
    return out


def _headers(response: h11.Response) -> dict[str, str]:
    return {name.decode(): value.decode() for name, value in response.headers}


async def test_nginx_answers_its_welcome_page_with_nginx_headers() -> None:
    [(response, body)] = await _exchange(httpservers.serve_nginx, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert response.status_code == 200
    assert body == httpservers.NGINX_INDEX
    headers = _headers(response)
    assert [name for name, _ in response.headers.raw_items()] == [
        b"Server", b"Date", b"Content-Type", b"Content-Length", b"Last-Modified", b"Connection", b"ETag",
        b"Accept-Ranges"]
    assert headers["server"] == "nginx/1.27.3"
    assert headers["content-type"] == "text/html"
    assert headers["content-length"] == "615" == str(len(body))
    assert headers["connection"] == "keep-alive"


async def test_nginx_keeps_the_connection_for_requests_with_bodies_of_any_size() -> None:
    big = b"b" * 700_000
    chunked_body = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (b"a" * 70_000, b"c" * 3)) + b"0\r\n\r\n"
    request = (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big)
               + b"POST /index.html HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked_body
               + b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n"
               + b"GET /missing HTTP/1.1\r\nHost: x\r\n\r\n"
               + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    answers = await _exchange(httpservers.serve_nginx, request, responses=5)
    assert [r.status_code for r, _ in answers] == [200, 405, 200, 404, 200]
    assert answers[0][1] == answers[4][1] == httpservers.NGINX_INDEX
    assert answers[2][1] == b"" and _headers(answers[2][0])["content-length"] == "615"
    assert b"<center><h1>404 Not Found</h1></center>" in answers[3][1]
    assert b"<hr><center>nginx/1.27.3</center>" in answers[1][1]


async def test_nginx_refuses_a_body_over_a_mebibyte_and_closes() -> None:
    size = httpservers.NGINX_MAX_BODY + 1
    request = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size + b"z" * size
    [(response, body)] = await _exchange(httpservers.serve_nginx, request, responses=2, eof=True)
    assert response.status_code == 413
    assert _headers(response)["connection"] == "close"
    assert b"413 Request Entity Too Large" in body


async def test_nginx_answers_garbage_with_400() -> None:
    client, server = netsim.socket_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(httpservers.serve_nginx, server)
        await client.send_all(b"\x16\x03\x01 not http\r\n\r\n")
        await client.send_eof()
        answer = b""
        while chunk := await client.receive_some(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\nServer: nginx/1.27.3\r\n")


async def test_nginx_serves_the_container_files_when_there_are_some() -> None:
    files = httpservers.StaticFiles({"/usr/share/nginx/html/index.html": b"mine",
                                     "/usr/share/nginx/html/app/index.html": b"app"})
    answers = await _exchange(lambda s: httpservers.serve_nginx(s, files),
                              b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /app HTTP/1.1\r\nHost: h:8080\r\n\r\n"
                              b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n", responses=3)
    assert answers[0][1] == b"mine"
    assert answers[1][0].status_code == 301
    assert _headers(answers[1][0])["location"] == "http://h:8080/app/"
    assert answers[2][0].status_code in (400, 404)


async def test_busybox_httpd_serves_files_one_request_a_connection() -> None:
    files = httpservers.StaticFiles({"/www/index.html": b"<h1>hi</h1>\n", "/www/d/a.txt": b"text"})

    def serve(stream: trio.abc.HalfCloseableStream) -> Any:
        return httpservers.serve_httpd(stream, files, "/www")

    [(response, body)] = await _exchange(serve, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", responses=1)
    assert (response.status_code, body) == (200, b"<h1>hi</h1>\n")
    headers = _headers(response)
    assert headers["connection"] == "close" and headers["content-type"] == "text/html"
    assert headers["content-length"] == "12"
    [(response, body)] = await _exchange(serve, b"GET /d HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (response.status_code, _headers(response)["location"]) == (302, "/d/")
    [(response, body)] = await _exchange(serve, b"GET /d/a.txt HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (body, _headers(response)["content-type"]) == (b"text", "text/plain")
    [(response, body)] = await _exchange(serve, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
    assert response.status_code == 404
    assert b"<BODY><H1>404 Not Found</H1>\nThe requested URL was not found\n" in body
    [(response, body)] = await _exchange(serve, b"DELETE / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert response.status_code == 501


async def test_the_httpd_command_listens_while_it_runs() -> None:
    network = netsim.Network()
    ports = network.ports("default", "web", "u-1")
    io = CapturedIO()
    async with trio.open_nursery() as nursery:
        token = netsim.current_ports.set(ports)
        try:
            nursery.start_soon(run_command, ["httpd", "-f", "-p", "8000", "-h", "/tmp"], io, {})
        finally:
            netsim.current_ports.reset(token)
        await trio.testing.wait_all_tasks_blocked()
        assert network.statistics() == {("default", "web", "u-1"): [8000]}
        second = CapturedIO()
        token = netsim.current_ports.set(ports)
        try:
            assert await run_command(["httpd", "-p", "8000"], second, {}) == 1
        finally:
            netsim.current_ports.reset(token)
        assert second.stderr == b"httpd: bind: Address already in use\n"
        nursery.cancel_scope.cancel()
    assert network.statistics() == {}


async def test_httpd_refuses_a_home_that_is_not_there() -> None:
    io = CapturedIO()
    assert await run_command(["httpd", "-f", "-p", "8000", "-h", "/www"], io, {}) == 1
    assert io.stderr == b"httpd: can't change directory to '/www': No such file or directory\n"


# -- in a running kubesim ------------------------------------------------------------------------


async def _running_pod(sim: Any, name: str, container: dict[str, Any]) -> dict[str, Any]:
    kind = sim.store.kind("", "pods")
    sim.store.create(kind, "default", {"metadata": {"name": name}, "spec": {"containers": [container]}})

    def running() -> dict[str, Any] | None:
        pod = sim.store.find(kind, "default", name)
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
        return pod if statuses and "running" in (statuses[0].get("state") or {}) else None

    with trio.fail_after(5):
        pod: dict[str, Any] = await sim.store.wait_for(running)
    return pod


async def test_a_pods_httpd_and_nginx_answer_through_the_kubelets_network() -> None:
    from kubesim.server import open_kubesim

    async with open_kubesim(token=None) as sim:
        ctl = sim.controllers
        server = await _running_pod(sim, "files", {"name": "c", "image": "busybox",
                                                    "command": ["httpd", "-f", "-p", "8000", "-h", "/"]})
        nginx = await _running_pod(sim, "web", {"name": "c", "image": "nginx:1.27"})
        with trio.fail_after(5):
            while ("default", "files", server["metadata"]["uid"]) not in ctl.network.statistics():
                await trio.testing.wait_all_tasks_blocked()
        assert ctl.network.statistics()[("default", "files", server["metadata"]["uid"])] == [8000]
        assert ctl.network.listener(ctl, server, 8000) is not None
        assert ctl.network.listener(ctl, server, 80) is None  # busybox runs no nginx
        [(response, body)] = await _exchange(
            lambda s: _connect_and_relay(ctl, nginx, 80, s), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert response.status_code == 200 and body == httpservers.NGINX_INDEX
        # The pod goes: its httpd stops, and its port with it.
        sim.store.delete(sim.store.kind("", "pods"), "default", "files")
        with trio.fail_after(5):
            while ctl.network.statistics():
                await trio.testing.wait_all_tasks_blocked()


async def _connect_and_relay(ctl: Any, pod: dict[str, Any], port: int, stream: trio.abc.HalfCloseableStream) -> None:
    """Serve `stream` with whatever answers `port` in `pod` (what port-forward does, without SPDY)."""
    async with trio.open_nursery() as nursery:
        far = await ctl.network.connect(ctl, pod, port, nursery)

        async def pump(source: trio.abc.HalfCloseableStream, sink: trio.abc.HalfCloseableStream) -> None:
            while data := await source.receive_some(65536):
                await sink.send_all(data)
            await sink.send_eof()

        nursery.start_soon(pump, stream, far)
        await pump(far, stream)
        nursery.cancel_scope.cancel()
