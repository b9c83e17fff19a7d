"""Events end to end with real processes: two kasd replicas sharing a real redis-server, agentd (one
tunnel, on its home replica) configured with a webhook to an in-cluster target (a tiny HTTP server
on loopback that records what it got), kubesim. Events are POSTed to the replica that does not hold
the tunnel (a hop). The replica holding the tunnel is killed (-9) while events flow, and agentd is
restarted while events queue: the target gets every event once, in the order posted."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kasctl.restclient import rest_call
from kasctl.stack import Stack
from tests.cluster.conftest import metric, replicated_stack

pytestmark = pytest.mark.timeout(180)

#: seconds every event may take to arrive after a failure (a lease lapses in 5 s, agentd redials)
ARRIVAL = 60.0


class Target:
    """The in-cluster webhook target: records each event's id, in arrival order."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.changed = threading.Condition()
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with target.changed:
                    target.ids.append(body["id"])
                    target.changed.notify_all()
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, ids: list[str], timeout: float = ARRIVAL) -> list[str]:
        """What arrived once every one of ``ids`` did (or at the timeout)."""
        with self.changed:
            self.changed.wait_for(lambda: set(ids) <= set(self.ids), timeout=timeout)
            return list(self.ids)


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    found = Target()
    try:
        yield found
    finally:
        found.server.shutdown()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, target: Target) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("events")
    secret = workdir / "hook-secret"
    secret.write_text("s3cret-for-the-hook")
    running = replicated_stack(workdir, replicas=2, agentd_connections=1, agentd_settings={"events": {
        "retry_for": 5, "handlers": [{"type": "push", "webhook": {"url": target.url, "secret_file": str(secret)}}]}})
    try:
        yield running
    finally:
        running.stop()


def holder_of_the_tunnel(stack: Stack) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for replica in range(stack.replicas):
            if stack.kasds[replica] is not None and metric(stack, replica, "kasd_agent_sessions ") > 0:
                return replica
        time.sleep(0.1)  # (a process elsewhere: nothing to wait on but its metrics)
    raise AssertionError("no replica holds agentd's tunnel")


def post(stack: Stack, replica: int, event_id: str) -> dict[str, Any]:
    return rest_call(f"https://{stack.replica_addresses[replica]['api']}", "/api/v4/agents/1/events",
                     stack.personal_token, Path(stack.ca_file).read_bytes(), method="POST",
                     body={"type": "push", "payload": {"ref": "main", "n": event_id}, "id": event_id},
                     token_header="PRIVATE-TOKEN")


def ended(stack: Stack, replica: int, event_id: str) -> dict[str, Any]:
    """The event's status once it ended (as ``kasctl notify --wait`` polls it)."""
    deadline = time.monotonic() + 10
    while True:
        status = rest_call(f"https://{stack.replica_addresses[replica]['api']}", f"/api/v4/agents/1/events/{event_id}",
                           stack.personal_token, Path(stack.ca_file).read_bytes(), token_header="PRIVATE-TOKEN")
        if status["state"] not in ("queued", "delivering") or time.monotonic() > deadline:
            return status
        time.sleep(0.05)  # (another process's record: nothing here to wait on)


def test_killing_the_replica_holding_the_tunnel_while_events_flow_loses_none_and_repeats_none(
        stack: Stack, target: Target) -> None:
    holder = holder_of_the_tunnel(stack)
    other = 1 - holder
    ids = [f"flow-{n}" for n in range(20)]
    for n, event_id in enumerate(ids):
        assert post(stack, other, event_id)["state"] in ("queued", "delivering", "delivered")
        if n == 6:
            process = stack.kasds[holder]
            assert process is not None
            process.kill()  # -9: its lease, its tunnel and what it was delivering go with it
    arrived = [i for i in target.wait_for(ids) if i.startswith("flow-")]
    assert arrived == ids  # every one, once, in order
    status = ended(stack, other, ids[-1])  # (the target may hear of it before kasd records agentd's answer)
    assert status["state"] == "delivered" and status["outcome"] in ("done", "duplicate")
    stack.start_kasd(replica=holder)


def test_events_posted_while_agentd_restarts_wait_and_arrive_once_in_order(stack: Stack, target: Target) -> None:
    agentd = stack.agentds[0]
    assert agentd is not None
    agentd.stop()
    ids = [f"queued-{n}" for n in range(10)]
    for event_id in ids:
        assert post(stack, 0, event_id)["state"] in ("queued", "delivering")
    stack.start_agentd(index=0)
    arrived = [i for i in target.wait_for(ids) if i.startswith("queued-")]
    assert arrived == ids
