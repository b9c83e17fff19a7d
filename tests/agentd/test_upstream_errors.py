"""What kasd (and so the client) is told when the API server fails agentd: one that cannot be reached
is refused with UPSTREAM_UNREACHABLE and a message naming why."""

from __future__ import annotations

import functools
import ssl
from pathlib import Path

import pytest
import trio
import trustme

from agentd.kubeapi import KubeTarget, kubeconfig_target
from agentd.upstream import UpstreamPool, UpstreamUnreachable
from tests.agentd.harness import (
    FakeKasd,
    agent_config,
    head,
    open_request,
    read_http_head,
    running_agent,
    start_fake_kasd,
)
from tests.agentd.test_tunnels import write_kubeconfig
from tunnelhttp.head import TunnelCode
from wire.session import StreamRefusedError

pytestmark = pytest.mark.timeout(20)

BOUND = 0.5  # the response-head bound these tests configure


class HungApiServer:
    """Reads each request head and never answers; says when agentd closed a connection on it."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.connections = 0
        self.closed = 0
        self._changed = trio.Event()

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        read = await read_http_head(stream)
        if read is not None:
            self.heads.append(read[0])
            self._notify()
            try:
                while await stream.receive_some(65536):  # the body, then EOF when agentd gives up
                    pass
            except trio.BrokenResourceError:
                pass
        self.closed += 1
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_closed(self, count: int) -> None:
        while self.closed < count:
            await self._changed.wait()


async def _serve(nursery: trio.Nursery, handler: object) -> int:
    listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return int(listeners[0].socket.getsockname()[1])


async def _kasd_for_api(nursery: trio.Nursery, tmp_path: Path, server: str) -> FakeKasd:
    write_kubeconfig(tmp_path / "kubeconfig", server)
    return await start_fake_kasd(nursery)


# --------------------------------------------------------------------------- unreachable: say why


async def _refusal(nursery: trio.Nursery, tmp_path: Path, server: str, *,
                   target: KubeTarget | None = None) -> StreamRefusedError:
    kasd = await _kasd_for_api(nursery, tmp_path, server)
    config = agent_config(tmp_path, kasd.url)
    async with running_agent(nursery, config, target or kubeconfig_target(config.kubeconfig)):
        session = await kasd.session()
        with pytest.raises(StreamRefusedError) as info, trio.fail_after(10):
            await open_request(session, head("GET", "/api/v1/pods"))
    assert info.value.code == TunnelCode.UPSTREAM_UNREACHABLE
    return info.value


async def test_connection_refused_is_named(nursery: trio.Nursery, tmp_path: Path) -> None:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    refusal = await _refusal(nursery, tmp_path, f"http://127.0.0.1:{port}")
    assert refusal.message == f"cannot reach http://127.0.0.1:{port}: Connection refused"


async def test_a_name_that_does_not_resolve_is_named(nursery: trio.Nursery, tmp_path: Path) -> None:
    refusal = await _refusal(nursery, tmp_path, "https://kube-api.invalid:6443")
    assert refusal.message.startswith("cannot reach https://kube-api.invalid:6443: cannot resolve kube-api.invalid (")


async def test_a_tls_failure_is_named(nursery: trio.Nursery, tmp_path: Path) -> None:
    # An API server whose certificate agentd does not trust
    other_ca, our_ca = trustme.CA(), trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    other_ca.issue_cert("127.0.0.1").configure_cert(server_context)

    async def tls_server(stream: trio.SocketStream) -> None:
        tls = trio.SSLStream(stream, server_context, server_side=True)
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError:
            pass

    port = await _serve(nursery, tls_server)
    client_context = ssl.create_default_context()
    our_ca.configure_trust(client_context)
    target = KubeTarget(scheme="https", host="127.0.0.1", port=port, ssl_context=client_context)
    refusal = await _refusal(nursery, tmp_path, f"https://127.0.0.1:{port}", target=target)
    assert refusal.message == (f"cannot reach https://127.0.0.1:{port}: TLS error: [SSL: CERTIFICATE_VERIFY_FAILED] "
                               "certificate verify failed: unable to get local issuer certificate")
    assert "_ssl.c" not in refusal.message


async def test_a_connect_that_times_out_is_named() -> None:
    # An API server that takes the TCP connection and never answers the TLS handshake
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, silent)
        target = KubeTarget(scheme="https", host="127.0.0.1", port=port, ssl_context=ssl.create_default_context())
        pool = UpstreamPool(target, connect_timeout=0.3)
        with pytest.raises(UpstreamUnreachable) as info, trio.fail_after(5):
            async with pool.request(head("GET", "/api"), None):
                pass
        assert str(info.value) == f"cannot reach https://127.0.0.1:{port}: connect timed out after 0.3s"
        nursery.cancel_scope.cancel()
