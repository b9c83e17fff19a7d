"""`kubectl port-forward` against kubesim with real kubectl, over WebSocket and over SPDY.

kubectl's default (1.31+) tunnels SPDY through a WebSocket (`SPDY/3.1+portforward.k8s.io`);
`KUBECTL_PORT_FORWARD_WEBSOCKETS=false` makes it speak SPDY/3.1 straight over the upgraded
connection. Each test runs both, with every kubectl found (1.32 and 1.37): an HTTP GET of nginx's
page, 16 MiB each way through the echo port, two ports at once, `svc/` and `deploy/` targets, and a
refused port that leaves the forward working.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

from tests.kubesim.kubectl_harness import ServerThread, kubectl

pytestmark = [pytest.mark.timeout(120), pytest.mark.routes]

TRANSPORTS = {"websocket": {}, "spdy": {"KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"}}
FORWARDING = re.compile(r"^Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)$", re.M)
MIB = 1024 * 1024


@pytest.fixture(params=sorted(TRANSPORTS))
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@attrs.define
class Forward:
    """A running `kubectl port-forward`: local port by remote port, and what it printed."""

    ports: dict[int, int] = attrs.Factory(dict)
    stdout: bytearray = attrs.Factory(bytearray)
    stderr: bytearray = attrs.Factory(bytearray)
    closed: int = 0  # how many of stdout and stderr kubectl closed (2: it exited)
    changed: trio.Event = attrs.Factory(trio.Event)

    @property
    def ended(self) -> bool:
        return self.closed == 2

    async def collect(self, stream: trio.abc.ReceiveStream, into: bytearray) -> None:
        while chunk := await stream.receive_some():
            into += chunk
            self.changed.set()
        self.closed += 1
        self.changed.set()

    async def wait_for(self, done: Callable[[], bool], *, until_exit: bool = False) -> None:
        """Wait (at most 15 s) until `done()` holds, re-checking whenever kubectl writes."""
        with trio.fail_after(15):
            while not done():
                if self.ended and not until_exit:
                    raise AssertionError(f"kubectl port-forward ended:\n{self.stdout.decode()}\n"
                                         f"{self.stderr.decode()}")
                self.changed = trio.Event()
                await self.changed.wait()

    async def wait_stderr(self, pattern: str) -> str:
        await self.wait_for(lambda: re.search(pattern, self.stderr.decode(errors="replace")) is not None)
        found = re.search(pattern, self.stderr.decode(errors="replace"))
        assert found is not None
        return found.group(0)


@asynccontextmanager
async def port_forward(kubectl_bin: str, server: ServerThread, transport: str, *args: str) -> AsyncIterator[Forward]:
    env = {**server.env(), **TRANSPORTS[transport]}
    if not TRANSPORTS[transport]:
        env.pop("KUBECTL_PORT_FORWARD_WEBSOCKETS", None)
    process = await trio.lowlevel.open_process(
        [kubectl_bin, "port-forward", "--address", "127.0.0.1", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert process.stdout is not None and process.stderr is not None
    forward = Forward()
    wanted = len([a for a in args if ":" in a])
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(forward.collect, process.stdout, forward.stdout)
            nursery.start_soon(forward.collect, process.stderr, forward.stderr)
            await forward.wait_for(lambda: len(FORWARDING.findall(forward.stdout.decode())) >= wanted)
            forward.ports = {int(remote): int(local) for local, remote in FORWARDING.findall(forward.stdout.decode())}
            yield forward
            nursery.cancel_scope.cancel()
    finally:
        process.kill()
        with trio.move_on_after(5, shield=True):
            await process.wait()


async def http_get(port: int, path: str = "/") -> tuple[str, dict[str, str], bytes]:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\nConnection: close\r\n\r\n".encode())
            answer = bytearray()
            while chunk := await stream.receive_some(65536):
                answer += chunk
    head, _, body = bytes(answer).partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines)}
    return status, headers, body


async def echo_through(port: int, size: int) -> None:
    """`size` bytes out and the same bytes back through the echo port, checked by hash."""
    payload = os.urandom(MIB)
    sent, received = hashlib.sha256(), hashlib.sha256()
    count = 0
    with trio.fail_after(90):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream, trio.open_nursery() as nursery:
            async def write() -> None:
                for i in range(size // MIB):
                    chunk = payload[i:] + payload[:i]  # each MiB differs
                    sent.update(chunk)
                    await stream.send_all(chunk)
                await stream.send_eof()

            nursery.start_soon(write)
            while chunk := await stream.receive_some(65536):
                received.update(chunk)
                count += len(chunk)
    assert count == size
    assert received.hexdigest() == sent.hexdigest()


async def _run(kubectl_bin: str, server: ServerThread, *args: str) -> str:
    return (await kubectl(kubectl_bin, server, *args)).stdout


async def _wait_running(kubectl_bin: str, server: ServerThread, namespace: str, selector: str) -> None:
    await _run(kubectl_bin, server, "wait", "-n", namespace, "--for=jsonpath={.status.phase}=Running",
               "pod", "-l", selector, "--timeout=10s")


_ROWS = itertools.count()


@pytest.fixture(scope="module")
def _webs() -> dict[tuple[str, str, str], str]:
    """The namespaces `web` made in this module, by (route, kubectl, transport)."""
    return {}


@pytest.fixture
async def web(kube_server: ServerThread, kubectl_bin: str, request: pytest.FixtureRequest,
              _webs: dict[tuple[str, str, str], str]) -> str:
    """A namespace with pod `web` (nginx), pod `bb` (busybox sleeping), and deployment+service
    `site` (nginx, service port 8080 → target port 80).

    Made once per route, kubectl and transport and shared by the tests of that row: a test only
    forwards to these pods (one that makes or deletes a pod makes its own, under a name no other
    test of the row uses), so it sees what it would see in a namespace of its own, and the
    port-forward requests kubesim records in the namespace are all of the row's transport (what
    `_assert_transport` checks). Seven kubectl calls per test were a third of the module's time."""
    transport = getattr(request.node, "callspec", None) and request.node.callspec.params.get("transport")
    key = (kube_server.route, kubectl_bin, str(transport or "websocket"))
    if key in _webs:
        return _webs[key]
    namespace = f"pf-{key[0]}-{key[2]}-{next(_ROWS)}"  # a number of its own: no two rows share one
    await trio.to_thread.run_sync(kube_server.make_namespace, namespace)
    await _run(kubectl_bin, kube_server, "run", "web", "-n", namespace, "--image=nginx", "--port=80",
               "--labels=app=web")
    await _run(kubectl_bin, kube_server, "run", "bb", "-n", namespace, "--image=busybox", "--labels=app=bb",
               "--", "sleep", "3600")
    await _run(kubectl_bin, kube_server, "create", "deployment", "site", "-n", namespace, "--image=nginx",
               "--port=80")
    await _run(kubectl_bin, kube_server, "expose", "deployment", "site", "-n", namespace, "--port=8080",
               "--target-port=80")
    for selector in ("app=web", "app=bb", "app=site"):
        await _wait_running(kubectl_bin, kube_server, namespace, selector)
    _webs[key] = namespace
    return namespace


async def test_http_get_of_nginx_through_port_forward(kube_server: ServerThread, kubectl_bin: str,
                                                      transport: str, web: str) -> None:
    async with port_forward(kubectl_bin, kube_server, transport, "-n", web, "pod/web", ":80") as forward:
        status, headers, body = await http_get(forward.ports[80])
        assert status == "HTTP/1.1 200 OK"
        assert headers["server"].startswith("nginx/")
        assert headers["content-type"] == "text/html"
        assert int(headers["content-length"]) == len(body)
        assert b"<title>Welcome to nginx!</title>" in body
        status, _, body = await http_get(forward.ports[80], "/nope")
        assert status == "HTTP/1.1 404 Not Found"
        await forward.wait_for(lambda: f"Handling connection for {forward.ports[80]}" in forward.stdout.decode())
    await _assert_transport(kube_server, transport, web, "web")


async def test_16_mib_each_way_through_the_echo_port(kube_server: ServerThread, kubectl_bin: str,
                                                     transport: str, web: str) -> None:
    async with port_forward(kubectl_bin, kube_server, transport, "-n", web, "pod/bb", ":7") as forward:
        await echo_through(forward.ports[7], 16 * MIB)


async def test_two_ports_at_once(kube_server: ServerThread, kubectl_bin: str, transport: str, web: str) -> None:
    async with port_forward(kubectl_bin, kube_server, transport, "-n", web, "pod/web", ":80", ":7") as forward:
        assert sorted(forward.ports) == [7, 80]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(echo_through, forward.ports[7], 2 * MIB)
            status, _, body = await http_get(forward.ports[80])
        assert status == "HTTP/1.1 200 OK" and b"Welcome to nginx!" in body


@pytest.mark.parametrize(("target", "remote"), [("svc/site", "8080"), ("deploy/site", "80"),
                                                ("deployment/site", "80")])
async def test_service_and_deployment_targets(kube_server: ServerThread, kubectl_bin: str, transport: str,
                                              web: str, target: str, remote: str) -> None:
    async with port_forward(kubectl_bin, kube_server, transport, "-n", web, target, f":{remote}") as forward:
        # kubectl resolves a service port to the pod's target port itself.
        assert list(forward.ports) == [80]
        status, _, body = await http_get(forward.ports[80])
        assert status == "HTTP/1.1 200 OK" and b"Welcome to nginx!" in body


async def test_a_refused_port_is_reported_as_kubectl_reports_it(kube_server: ServerThread, kubectl_bin: str,
                                                                 transport: str, web: str) -> None:
    """Nothing listens on 81 in a busybox pod: the kubelet's message comes back on the error
    stream and kubectl prints it. client-go then closes the whole connection (since 1.29:
    `pf.streamConn.Close()` after an error), so kubectl ends with `lost connection to pod`; the
    other port worked until then, and a new port-forward works again."""
    async with port_forward(kubectl_bin, kube_server, transport, "-n", web, "pod/bb", ":81", ":7") as forward:
        await echo_through(forward.ports[7], MIB)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", forward.ports[81])
            async with stream:
                try:
                    assert await stream.receive_some(100) == b""  # kubectl closes it
                except trio.BrokenResourceError:
                    pass  # or resets it, as kubectl exits
        await forward.wait_stderr(r"error forwarding port 81 to pod [0-9a-f]{64}, uid : failed to execute "
                                  r"portforward in network namespace \\?\"/var/run/netns/cni-[0-9a-f-]{36}\\?\": "
                                  r"failed to connect to localhost:81 inside namespace \\?\"[0-9a-f]{64}\\?\", "
                                  r"IPv4: dial tcp4 127\.0\.0\.1:81: connect: connection refused IPv6 dial tcp6: "
                                  r"address localhost: no suitable address found")
        # 1.32 prints "an error occurred forwarding L -> 81: <message>", 1.37 a structured line.
        assert re.search(r"an error occurred forwarding \d+ -> 81: error forwarding port 81|"
                         r'"An error occurred forwarding" err="error forwarding port 81 .*remotePort=81',
                         forward.stderr.decode())
        await forward.wait_for(lambda: forward.ended, until_exit=True)
        assert forward.stderr.decode().rstrip().endswith("error: lost connection to pod")
    async with port_forward(kubectl_bin, kube_server, transport, "-n", web, "pod/bb", ":7") as forward:
        await echo_through(forward.ports[7], MIB)


async def _assert_transport(server: ServerThread, transport: str, namespace: str, pod: str) -> None:
    """The port-forward request kubesim saw used the transport the test meant."""
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}/portforward"

    def seen() -> list[Any]:
        assert server.sim is not None
        return [r for r in server.sim.requests if r.path == path]

    requests = await server.acall(seen)
    # client-go upgrades a WebSocket with GET and asks for SPDY with POST.
    methods = {r.method for r in requests}
    assert methods == ({"GET"} if transport == "websocket" else {"POST"}), requests


@pytest.fixture(scope="module")
def no_tunnel_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """A kubesim answering WebSocket port-forwards as an API server without the tunnel does."""
    server = ServerThread(tmp_path_factory.mktemp("kubesim-no-tunnel"), port_forward_websocket=False).start()
    try:
        yield server
    finally:
        server.stop()


async def test_kubectl_falls_back_to_spdy_when_the_websocket_is_refused(no_tunnel_server: ServerThread,
                                                                         kubectl_bin: str) -> None:
    namespace = f"fallback-{abs(hash(kubectl_bin)) % 10**6}"
    await trio.to_thread.run_sync(no_tunnel_server.make_namespace, namespace)
    await _run(kubectl_bin, no_tunnel_server, "run", "bb", "-n", namespace, "--image=busybox", "--labels=app=bb",
               "--", "sleep", "3600")
    await _wait_running(kubectl_bin, no_tunnel_server, namespace, "app=bb")
    async with port_forward(kubectl_bin, no_tunnel_server, "websocket", "-n", namespace, "pod/bb", ":7") as forward:
        await echo_through(forward.ports[7], 4 * MIB)
    path = f"/api/v1/namespaces/{namespace}/pods/bb/portforward"

    def methods() -> list[str]:
        assert no_tunnel_server.sim is not None
        return [r.method for r in no_tunnel_server.sim.requests if r.path == path]

    # The WebSocket (GET) was refused, then SPDY (POST) carried the forward.
    assert await no_tunnel_server.acall(methods) == ["GET", "POST"]


async def test_busybox_httpd_listens_as_main_process_and_under_exec(kube_server: ServerThread, kubectl_bin: str,
                                                                    web: str) -> None:
    """`httpd -f -p PORT` listens in its pod whether it is the container's command or exec'd, and
    serves the container's files (written here with exec, as `kubectl cp` would)."""
    await _run(kubectl_bin, kube_server, "run", "files", "-n", web, "--image=busybox", "--labels=app=files",
               "--", "httpd", "-f", "-p", "8000", "-h", "/")
    await _wait_running(kubectl_bin, kube_server, web, "app=files")
    await _run(kubectl_bin, kube_server, "exec", "-n", web, "files", "--", "sh", "-c", "echo hello > /index.html")
    env = kube_server.env()
    exec_process = await trio.lowlevel.open_process(
        [kubectl_bin, "exec", "-n", web, "files", "--", "httpd", "-f", "-p", "8001"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def ports() -> list[int]:
            assert kube_server.sim is not None
            network = kube_server.sim.controllers.network
            return next((p for (ns, name, _), p in network.statistics().items() if (ns, name) == (web, "files")), [])

        for _ in range(100):  # polling a condition, bounded: the exec'd httpd starts listening
            if await kube_server.acall(ports) == [8000, 8001]:
                break
            await trio.sleep(0.05)
        assert await kube_server.acall(ports) == [8000, 8001]
        async with port_forward(kubectl_bin, kube_server, "websocket", "-n", web, "pod/files", ":8000",
                                ":8001") as forward:
            for remote in (8000, 8001):
                status, headers, body = await http_get(forward.ports[remote], "/index.html")
                assert status == "HTTP/1.1 200 OK" and body == b"hello\n"
                status, headers, body = await http_get(forward.ports[remote], "/missing.html")
                assert status == "HTTP/1.1 404 Not Found"
                assert headers["connection"] == "close"
                assert b"<BODY><H1>404 Not Found</H1>\nThe requested URL was not found\n" in body
    finally:
        exec_process.kill()
        with trio.move_on_after(5, shield=True):
            await exec_process.wait()
    for _ in range(100):  # the exec ended: its httpd stops listening (the container's goes on)
        if await kube_server.acall(ports) == [8000]:
            break
        await trio.sleep(0.05)
    assert await kube_server.acall(ports) == [8000]


async def test_a_deleted_pod_breaks_the_forward(kube_server: ServerThread, kubectl_bin: str, transport: str,
                                                web: str) -> None:
    """Deleting the pod ends its forwarded connections; the next one finds no sandbox (the
    kubelet's containerd message) and kubectl gives up, as against a real cluster."""
    await _run(kubectl_bin, kube_server, "run", "gone", "-n", web, "--image=busybox", "--labels=app=gone",
               "--", "sleep", "3600")
    await _wait_running(kubectl_bin, kube_server, web, "app=gone")
    async with port_forward(kubectl_bin, kube_server, transport, "-n", web, "pod/gone", ":7") as forward:
        with trio.fail_after(20):
            stream = await trio.open_tcp_stream("127.0.0.1", forward.ports[7])
            async with stream:
                await stream.send_all(b"before\n")
                assert await stream.receive_some(100) == b"before\n"
                await _run(kubectl_bin, kube_server, "delete", "pod", "gone", "-n", web, "--wait=false")
                try:
                    assert await stream.receive_some(100) == b""  # the connection broke
                except trio.BrokenResourceError:
                    pass
            stream = await trio.open_tcp_stream("127.0.0.1", forward.ports[7])
            async with stream:
                try:
                    assert await stream.receive_some(100) == b""
                except trio.BrokenResourceError:
                    pass
        await forward.wait_stderr(r'error forwarding port 7 to pod [0-9a-f]{64}, uid : failed to find sandbox '
                                  r'\\?"[0-9a-f]{64}\\?" in store: not found')
        await forward.wait_for(lambda: forward.ended, until_exit=True)
        assert forward.stderr.decode().rstrip().endswith("error: lost connection to pod")
