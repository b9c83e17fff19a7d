"""A real WebSocket exec through agentd: kasd's stream carries the upgrade, kubesim runs the command."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio
from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, CloseConnection

from agentd.kubeapi import kubeconfig_target
from kubesim.server import open_kubesim
from tests.agentd.harness import (
    SIM_TOKEN,
    RequestLog,
    agent_config,
    head,
    open_request,
    running_agent,
    start_fake_kasd,
)
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
