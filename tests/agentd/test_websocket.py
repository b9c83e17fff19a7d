"""A real WebSocket exec through agentd: kasd's stream carries the upgrade, kubesim runs the command."""

from __future__ import annotations

import base64
import functools
import json
import os
import ssl
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
import trustme
from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, CloseConnection

import netio.relay
from agentd.kubeapi import KubeTarget, kubeconfig_target
from kubesim.server import open_kubesim
from tests.agentd.harness import (
    SIM_TOKEN,
    RequestLog,
    agent_config,
    head,
    open_request,
    read_http_head,
    running_agent,
    start_fake_kasd,
)
from tests.agentd.test_tunnels import write_kubeconfig
from tests.trusted import TRUSTED
from tunnelhttp.head import TunnelCode

pytestmark = pytest.mark.timeout(20)

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0", "namespace": "default"},
       "spec": {"containers": [{"name": "app", "image": "busybox"}]}}


async def wait_running(store: Any, name: str) -> None:
    kind = store.kind("", "pods")
    watch = store.watch(kind, "default", resource_version=None)
    initial, channel = watch.__enter__()
    try:
        def running(obj: dict[str, Any]) -> bool:
            return obj["metadata"]["name"] == name and (obj.get("status") or {}).get("phase") == "Running"

        if any(running(e.object) for e in initial):
            return
        async for event in channel:
            if running(event.object):
                return
    finally:
        watch.__exit__(None, None, None)


async def test_exec_over_websocket(nursery: trio.Nursery, tmp_path: Path) -> None:
    async with open_kubesim(objects=TRUSTED, token=SIM_TOKEN, controller_tick=0.05) as sim:
        store = sim.store
        store.create(store.kind("", "pods"), "default", POD)
        with trio.fail_after(10):
            await wait_running(store, "web-0")
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        kasd = await start_fake_kasd(nursery)
        config = agent_config(tmp_path, kasd.url)
        async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)) as agent:
            requests = RequestLog(agent)
            session = await kasd.session()
            key = base64.b64encode(os.urandom(16)).decode()
            request = head("GET", "/api/v1/namespaces/default/pods/web-0/exec?command=echo&command=hi&stdout=true",
                           headers=(("connection", "Upgrade"), ("upgrade", "websocket"),
                                    ("sec-websocket-version", "13"), ("sec-websocket-key", key),
                                    ("sec-websocket-protocol", "v5.channel.k8s.io")))
            stream, response = await open_request(session, request, eof=False)
            assert response.status == 101, response
            assert ("sec-websocket-protocol", "v5.channel.k8s.io") in response.headers
            ws = Connection(ConnectionType.CLIENT)
            frames: dict[int, bytes] = {}
            closed = False
            while not closed:
                data = await stream.receive_some()
                if not data:
                    break
                ws.receive_data(data)
                for event in ws.events():
                    if isinstance(event, BytesMessage):
                        channel, payload = event.data[0], bytes(event.data[1:])
                        frames[channel] = frames.get(channel, b"") + payload
                    elif isinstance(event, CloseConnection):
                        await stream.send_all(ws.send(event.response()))
                        closed = True
            assert frames.get(1) == b"hi\n"
            assert json.loads(frames[3])["status"] == "Success"
            while await stream.receive_some():  # until kubesim's end of the pipe arrives
                pass
            # The client hangs up: kasd resets the stream rather than half-closing it.
            await stream.reset(TunnelCode.CLIENT_GONE, "client went away")
            with trio.fail_after(5):
                await requests.first.wait()
        # kubesim ended the exec and closed its side: what broke after that is the pipe winding down.
        assert requests.outcomes() == [(101, "ok")]
        assert any(r.path.endswith("/exec") and r.bearer_token == SIM_TOKEN
                   and r.impersonate.get("impersonate-user") == "alice" for r in sim.requests)


async def test_kasds_half_close_closes_a_tls_api_servers_upgraded_connection_within_the_grace(
        nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kasd passes its client's end on as a half-close; TLS cannot carry one to the API server, which
    would then hold the exec open forever: agentd closes that connection once the grace is over."""
    grace = 0.5
    monkeypatch.setattr(netio.relay, "CLIENT_END_GRACE", grace)
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    upgraded = trio.Event()
    closed: list[float] = []
    closed_event = trio.Event()

    async def api_server(tcp: trio.SocketStream) -> None:
        tls = trio.SSLStream(tcp, server_context, server_side=True)
        try:
            assert await read_http_head(tls) is not None
            await tls.send_all(b"HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\r\n")
            upgraded.set()
            while await tls.receive_some(65536):  # an exec that never ends by itself
                pass
        except trio.BrokenResourceError:
            pass
        closed.append(trio.current_time())
        closed_event.set()

    listeners = await nursery.start(functools.partial(trio.serve_tcp, api_server, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    target = KubeTarget(scheme="https", host="127.0.0.1", port=port, ssl_context=client_context)
    write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}")
    kasd = await start_fake_kasd(nursery)
    config = agent_config(tmp_path, kasd.url)
    async with running_agent(nursery, config, target) as agent:
        requests = RequestLog(agent)
        session = await kasd.session()
        request = head("GET", "/api/v1/namespaces/default/pods/web-0/exec?command=sh&stdin=true",
                       headers=(("connection", "Upgrade"), ("upgrade", "websocket")))
        with trio.fail_after(10):
            stream, response = await open_request(session, request, eof=False)
            assert response.status == 101
            await upgraded.wait()
            await stream.send_all(b"\x81\x00")
            await stream.send_eof()  # kasd's client went away
            ended_at = trio.current_time()
            await closed_event.wait()
            assert await stream.receive_some() == b""  # and agentd's side of the stream ends too
            await requests.first.wait()
        assert closed[0] - ended_at < grace + 1.0
        assert requests.outcomes() == [(101, "client-gone")]
        assert agent.proxy.active == 0


async def test_a_small_answer_whose_body_comes_after_its_head_reaches_kasd_with_it(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """An answer of known, small length goes to kasd as one: its head with its body and end (kasd
    relays such an answer in one write to its client; a head alone sends it down its long-answer path)."""
    accepted: list[bool] = []
    seen_at_head_only: list[bool] = []

    async def api_server(tcp: trio.SocketStream) -> None:
        assert await read_http_head(tcp) is not None
        await tcp.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked()  # agentd has read the head and done what it does
        seen_at_head_only.append(bool(accepted))
        await tcp.send_all(b"{}")
        await tcp.receive_some(65536)  # until agentd closes or sends another request

    listeners = await nursery.start(functools.partial(trio.serve_tcp, api_server, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    kasd = await start_fake_kasd(nursery)
    config = agent_config(tmp_path, kasd.url)
    async with running_agent(nursery, config, KubeTarget(scheme="http", host="127.0.0.1", port=port)):
        session = await kasd.session()
        with trio.fail_after(10):
            stream, response = await open_request(session, head("GET", "/api/v1/namespaces/default"))
            accepted.append(True)
            assert stream.receive_nowait(65536) == b"{}"  # here with the head
            assert await stream.receive_some() == b""
        assert response.status == 200
        assert seen_at_head_only == [False]
