#!/usr/bin/env python3
"""Environments, live, at size: what kasd spends on discovery, shared watches and SSE viewers.

    python bench/environments.py            # 50 environments × 200 objects, 20 viewers (~6 minutes on 2 cores)
    python bench/environments.py --quick    # 10 environments, fewer runs and changes (~2 minutes, noisier)
    python bench/environments.py --envs 20 --objects 100 --viewers 5 --changes 30   # any size

Real processes on 127.0.0.1 (``kasctl.stack``: kubesim, kasd with its API port and SQLite store,
agentd). The bench makes, straight through kubesim's admin kubeconfig (fast, no tunnel),
``--envs`` environments of ``--objects`` objects each, carrying GitLab's labels
``app.gitlab.com/project_id=1`` and ``app.gitlab.com/environment_slug=<slug>`` (per environment
5 % Deployments of one replica, 5 % Services, the rest ConfigMaps; each in a namespace of its own),
plus one environment ``big`` of ``--big`` (1,000) objects. Then a CI job per environment (a job
token naming it) writes one more object through kasd's proxy, so kasd's recorder stores the
environment ↔ agent ↔ namespace association, as in production. Everything after that goes
through kasd's API port with the demo user's personal token (``PRIVATE-TOKEN``), as the dashboard
and ``kasctl env status`` do.

Figures (each section prints its own; ratios are against a baseline measured in the same run):

discovery   ``GET /api/kasd/v1/environments/:id/resources`` of ``big`` (every listable kind in its
            namespace by label selector, the unlabelled dependents, the graph built and sent),
            p50/p99 over ``--runs`` runs, and of a 200-object environment; baseline: one labelled
            LIST of big's ConfigMaps through the same proxy and tunnel (what ``kubectl get``
            costs), so the ratio is what discovery adds over one list of most of the same objects.
            Also kasd's CPU seconds per discovery.
listing     what the dashboard's environments page does: the project's list, then
            ``GET /api/kasd/v1/environments/:id`` (the health badge) for each environment, four at
            a time: the wall time for all of them, and kasd's CPU (each is a discovery of its own
            unless someone watches that environment: ``kasd_environment_snapshots_total``).
viewers     ``--viewers`` SSE viewers (``…/resources/watch``) on one environment plus one slow
            viewer (a client that sends its request and never reads): kasd's RSS and CPU before,
            with them, and after the slow one has been dropped (kasd's metric
            ``kasd_environment_viewers``: once its socket is full, one write waits
            ``kasd.web.streams.WRITE_TIMEOUT_SECONDS`` and kasd cuts it off); kasd's memory stays
            bounded meanwhile (its state is the view's objects, one pending event at most).
            Also a one-off ``GET …/resources`` of the watched environment (answered by its live
            view, no discovery) against one of an environment nobody watches (a discovery).
latency     ``--changes`` changes in kubesim (a labelled ConfigMap created, then deleted, in
            turn, straight at kubesim): the time from sending the change to each viewer's first
            ``graph`` event that shows it, p50/p99 over every viewer and change. The SSE stream
            coalesces updates for 0.2 s (``kasd.web.streams.COALESCE_SECONDS``): that is the floor.
spread      one viewer on each of the ``--envs`` environments: RSS, CPU while idle (watches held,
            nothing changing), and the same latency over changes spread across them.
watches     from kasd's metrics: watch sets (one per environment and viewer identity, shared by
            its viewers), viewers, upstream WATCH requests opened and discoveries run.

Noise: the machine's cores are shared with the bench's own client and with kubesim and agentd;
figures from one run are indicative, not precise; compare ratios, not absolute times, across
machines.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import ssl
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import h11
import trio
import yaml
from wire_throughput import describe_machine

from kasctl.stack import AGENT_ID, CONFIG_PROJECT, Stack

PROJECT_ID = 1  # the demo project (group/demo), whose jobs the demo agent lets in as the job
PROJECT_LABEL = "app.gitlab.com/project_id"
SLUG_LABEL = "app.gitlab.com/environment_slug"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.1f} ms"


# --------------------------------------------------------------------------- /proc


class ProcessFigures:
    """RSS and CPU seconds of one process, from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


# --------------------------------------------------------------------------- HTTP


class Client:
    """One keep-alive HTTP/1.1 connection (h11 over TLS) that can send any method."""

    def __init__(self, host: str, port: int, ctx: ssl.SSLContext, headers: Sequence[tuple[str, str]]) -> None:
        self.host, self.port, self.ctx, self.headers = host, port, ctx, list(headers)
        self.stream: trio.SSLStream[trio.SocketStream] | None = None
        self.conn = h11.Connection(h11.CLIENT)

    async def request(self, method: str, target: str, body: Any = None, *,
                      content_type: str = "application/json") -> tuple[int, bytes]:
        if self.stream is None:
            self.stream = await trio.open_ssl_over_tcp_stream(self.host, self.port, ssl_context=self.ctx,
                                                              https_compatible=True)
            self.conn = h11.Connection(h11.CLIENT)
        data = b"" if body is None else json.dumps(body).encode()
        headers = [("host", self.host), ("content-length", str(len(data))), *self.headers]
        if body is not None:
            headers.append(("content-type", content_type))
        conn = self.conn
        await self.stream.send_all(conn.send(h11.Request(method=method, target=target, headers=headers))
                                   + conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))
        status, out = 0, bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                chunk = await self.stream.receive_some(1 << 18)
                conn.receive_data(bytes(chunk))
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                out += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("connection closed")
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            await self.stream.aclose()
            self.stream = None
        else:
            conn.start_next_cycle()
        return status, bytes(out)

    async def ok(self, method: str, target: str, body: Any = None, *, accept: Sequence[int] = (200, 201)) -> bytes:
        status, out = await self.request(method, target, body)
        if status not in accept:
            raise RuntimeError(f"{method} {target} answered {status}: {out[:300]!r}")
        return out

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()


def people(count: int) -> list[dict[str, Any]]:
    """``count`` viewers for the stack's directory: Developers of the demo project, whom its
    agent's ``user_access`` lets see its environments' objects."""
    return [{"username": f"viewer-{n}", "memberships": {CONFIG_PROJECT: "developer"}} for n in range(count)]


class Ends:
    """Where the bench reaches: kubesim (admin), kasd's proxy (a CI job) and kasd's API port (a user)."""

    def __init__(self, stack: Stack) -> None:
        cluster = yaml.safe_load((stack.dir / "cluster.kubeconfig").read_text())["clusters"][0]["cluster"]
        self.sim_ctx = ssl.create_default_context()
        self.sim_ctx.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        self.sim_ctx.check_hostname = False
        self.sim = _host_port(cluster["server"])
        self.sim_token = stack.cluster_token
        self.kasd_ctx = ssl.create_default_context()
        self.kasd_ctx.load_verify_locations(cadata=stack.ca.cert_pem.bytes().decode())
        self.api = _host_port("https://" + stack.addresses["api"])
        self.proxy = _host_port("https://" + stack.addresses["kubernetes_api"])
        self.user_token = stack.personal_token
        self._auth = stack.auth
        self._people = 0
        self.job_token = stack.job_token  # the demo CI job's (no environment): kubectl-style requests
        self.metrics_url = f"http://{stack.addresses['observability']}/metrics"

    def person(self) -> str:
        """The personal token of one more of the bench's people (``viewer-<n>``, Developers of the
        demo project: ``people(n)``): each viewer is someone else, as kasd caps the live streams
        one person holds open (``WebSettings.max_streams_per_user``)."""
        token = self._auth.personal_token(f"viewer-{self._people}")
        self._people += 1
        return token

    def kubesim(self) -> Client:
        return Client(*self.sim, self.sim_ctx, [("authorization", f"Bearer {self.sim_token}")])

    def user(self) -> Client:
        return Client(*self.api, self.kasd_ctx, [("private-token", self.user_token), ("accept", "application/json")])

    def job(self, token: str) -> Client:
        return Client(*self.proxy, self.kasd_ctx, [("authorization", f"Bearer ci:{AGENT_ID}:{token}")])

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("kasd_environment"):
                    name, value = line.rsplit(" ", 1)
                    out[name] = float(value)
        return out


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("https://").rstrip("/").rsplit(":", 1)
    return host, int(port)


# --------------------------------------------------------------------------- the cluster's objects


def labels(slug: str) -> dict[str, str]:
    return {PROJECT_LABEL: str(PROJECT_ID), SLUG_LABEL: slug}


def env_objects(slug: str, count: int) -> list[tuple[str, dict[str, Any]]]:
    """``count`` labelled objects of one environment: (collection path, body)."""
    ns = slug
    workloads = max(1, count // 20)
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(workloads):
        name = f"web-{i}"
        out.append((f"/apis/apps/v1/namespaces/{ns}/deployments", {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": labels(slug)},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}}))
        out.append((f"/api/v1/namespaces/{ns}/services", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels(slug)},
            "spec": {"selector": {"app": name}, "ports": [{"port": 80}]}}))
    for i in range(count - 2 * workloads):
        out.append((f"/api/v1/namespaces/{ns}/configmaps", {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"settings-{i}", "labels": labels(slug)},
            "data": {"key": f"value {i}"}}))
    return out


async def create_all(ends: Ends, items: list[tuple[str, dict[str, Any]]], concurrency: int = 6) -> None:
    queue = list(reversed(items))

    async def worker() -> None:
        client = ends.kubesim()
        try:
            while queue:
                path, body = queue.pop()
                await client.ok("POST", path, body, accept=(201, 200, 409))
        finally:
            await client.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)


async def seed(stack: Stack, ends: Ends, slugs: list[str], big: str, per_env: int, big_count: int) -> dict[str, int]:
    """Make the objects (at kubesim), then record each environment through a CI job; their ids."""
    began = time.perf_counter()
    await create_all(ends, [("/api/v1/namespaces", {"metadata": {"name": s}}) for s in [*slugs, big]])
    # one object of each environment is written by its CI job, through kasd (the recorder's trigger)
    items = [o for s in slugs for o in env_objects(s, per_env)[:-1]] + env_objects(big, big_count)[:-1]
    await create_all(ends, items)
    made = time.perf_counter() - began
    print(f"  {len(items)} objects and {len(slugs) + 1} namespaces created at kubesim in {made:.1f} s "
          f"({len(items) / made:.0f} objects/s)", flush=True)
    for index, slug in enumerate([*slugs, big]):
        token = stack.auth.job_token(CONFIG_PROJECT, job_id=1000 + index, pipeline_id=1000 + index, user="demo",
                                     environment=slug, environment_tier="production" if slug == big else "development")
        path, body = env_objects(slug, big_count if slug == big else per_env)[-1]
        job = ends.job(token)
        await job.ok("POST", path, body)
        await job.aclose()
    user = ends.user()
    ids: dict[str, int] = {}
    deadline = time.monotonic() + 30
    while len(ids) < len(slugs) + 1:
        if time.monotonic() > deadline:
            raise RuntimeError(f"kasd recorded only {len(ids)} of {len(slugs) + 1} environments")
        ids = {}
        for page in (1, 2, 3, 4):
            listed = json.loads(await user.ok(
                "GET", f"/api/v4/projects/{quote(CONFIG_PROJECT, safe='')}/environments?per_page=100&page={page}"))
            ids.update({e["slug"]: e["id"] for e in listed})
            if len(listed) < 100:
                break
        await trio.sleep(0.1)
    await user.aclose()
    print(f"  {len(ids)} environments recorded in kasd's store by their CI jobs "
          f"({time.perf_counter() - began:.1f} s in all)", flush=True)
    return ids


async def settle(ends: Ends, env_id: int, seconds: float = 60.0) -> dict[str, Any]:
    """Wait until the environment's health is Healthy (its Deployments rolled out); its graph."""
    user = ends.user()
    deadline = time.monotonic() + seconds
    try:
        while True:
            graph = json.loads(await user.ok("GET", f"/api/kasd/v1/environments/{env_id}/resources"))["graph"]
            if graph["health"]["status"] == "Healthy" or time.monotonic() > deadline:
                return dict(graph)
            await trio.sleep(0.5)
    finally:
        await user.aclose()


# --------------------------------------------------------------------------- SSE viewers


class Viewer:
    """One SSE client: records the time of each ``graph`` event and the node ids it showed."""

    def __init__(self, ends: Ends, env_id: int) -> None:
        self.ends, self.env_id = ends, env_id
        self.token = ends.person()
        self.events: list[tuple[float, frozenset[str]]] = []
        self.changed = trio.Event()
        self.ended: str | None = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        host, port = self.ends.api
        stream = await trio.open_ssl_over_tcp_stream(host, port, ssl_context=self.ends.kasd_ctx, https_compatible=True)
        conn = h11.Connection(h11.CLIENT)
        target = f"/api/kasd/v1/environments/{self.env_id}/resources/watch"
        await stream.send_all(conn.send(h11.Request(method="GET", target=target, headers=[
            ("host", host), ("private-token", self.token), ("accept", "text/event-stream")]))
            + conn.send(h11.EndOfMessage()))
        buffer = b""
        started = False
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(bytes(await stream.receive_some(1 << 18)))
                    continue
                if isinstance(event, h11.Response):
                    if event.status_code != 200:
                        raise RuntimeError(f"watch of environment {self.env_id} answered {event.status_code}")
                    continue
                if isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    self.ended = self.ended or "the stream ended"
                    return
                if not isinstance(event, h11.Data):
                    continue
                buffer += event.data
                while b"\n\n" in buffer:
                    block, buffer = buffer.split(b"\n\n", 1)
                    if not started:
                        started = True
                        task_status.started()
                    self._block(block)
        finally:
            self.changed.set()
            await stream.aclose()

    def _block(self, block: bytes) -> None:
        name, data = "", b""
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                data += line[6:]
        if name == "graph":
            ids = frozenset(n["id"] for n in json.loads(data)["nodes"])
            self.events.append((time.perf_counter(), ids))
            self.changed.set()
            self.changed = trio.Event()
        elif name == "end":
            self.ended = json.loads(data).get("message", "end")

    async def first_event_showing(self, after: float, present: str, want: bool) -> float:
        """The time of the first graph event after ``after`` in which ``present`` is (or is not)."""
        while True:
            for at, ids in self.events:
                if at >= after and (present in ids) == want:
                    return at
            if self.ended is not None:
                raise RuntimeError(f"viewer of environment {self.env_id} ended: {self.ended}")
            await self.changed.wait()


async def connect(nursery: trio.Nursery, viewers: list[Viewer], *, within: float) -> None:
    """Start ``viewers`` in ``nursery`` and wait (at most ``within`` seconds) for each one's first graph."""
    for viewer in viewers:
        await nursery.start(viewer.run)
    with trio.fail_after(within):
        for viewer in viewers:
            while not viewer.events:
                await viewer.changed.wait()


class SlowViewer:
    """Sends its watch request and never reads another byte (a small receive buffer, so the kernel
    holds little for it): kasd must drop it, not buffer for it."""

    def __init__(self, ends: Ends, env_id: int) -> None:
        self.ends, self.env_id = ends, env_id
        self.token = ends.person()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        host, port = self.ends.api
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await sock.connect((host, port))
        stream = trio.SSLStream(trio.SocketStream(sock), self.ends.kasd_ctx, server_hostname=host,
                                https_compatible=True)
        await stream.do_handshake()
        conn = h11.Connection(h11.CLIENT)
        await stream.send_all(conn.send(h11.Request(
            method="GET", target=f"/api/kasd/v1/environments/{self.env_id}/resources/watch",
            headers=[("host", host), ("private-token", self.token)])) + conn.send(h11.EndOfMessage()))
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)


# --------------------------------------------------------------------------- sections


def figures_line(label: str, kasd: ProcessFigures, cpu_before: float, seconds: float, rss_before: float) -> str:
    cpu = kasd.cpu() - cpu_before
    rss = kasd.rss_mib()
    return (f"  {label:<44} kasd RSS {rss:7.1f} MiB ({rss - rss_before:+6.1f})   CPU {cpu:6.2f} s "
            f"over {seconds:5.1f} s ({100 * cpu / max(seconds, 1e-9):5.1f} % of a core)")


async def bench_discovery(ends: Ends, kasd: ProcessFigures, ids: dict[str, int], big: str, small: str,
                          runs: int) -> None:
    user = ends.user()
    big_id = ids[big]
    took: dict[str, list[float]] = {"big": [], "small": [], "list": []}
    nodes: dict[str, int] = {}
    size = 0
    cpu: dict[str, float] = {"big": 0.0, "small": 0.0}
    selector = quote(f"{PROJECT_LABEL}={PROJECT_ID},{SLUG_LABEL}={big}", safe="")
    baseline_target = f"/api/v1/namespaces/{big}/configmaps?labelSelector={selector}"
    for _ in range(runs):  # alternated, so noise hits each alike
        for label, env_id in (("big", big_id), ("small", ids[small])):
            before, c0 = time.perf_counter(), kasd.cpu()
            body = await user.ok("GET", f"/api/kasd/v1/environments/{env_id}/resources")
            took[label].append(time.perf_counter() - before)
            cpu[label] += kasd.cpu() - c0
            nodes[label] = len(json.loads(body)["graph"]["nodes"])
            size = len(body) if label == "big" else size
        before = time.perf_counter()
        await ends_list(ends, baseline_target)
        took["list"].append(time.perf_counter() - before)
    await user.aclose()
    print(f"discovery, {runs} runs each, alternated (GET /api/kasd/v1/environments/:id/resources):")
    for label, name in (("big", big), ("small", small)):
        print(f"  {name:<8} {nodes[label]:5d} objects in the graph: p50 {ms(pct(took[label], 50))}  "
              f"p99 {ms(pct(took[label], 99))}   kasd CPU {cpu[label] / runs * 1e3:6.1f} ms per discovery"
              + (f"   answer {size / 1024:.0f} KiB" if label == "big" else ""))
    base = pct(took["list"], 50)
    print(f"  baseline: one labelled LIST of {big}'s ConfigMaps through kasd's proxy: p50 {ms(base)}  "
          f"p99 {ms(pct(took['list'], 99))}")
    print(f"  discovery of {big} / baseline (p50): {pct(took['big'], 50) / base:.1f}×", flush=True)


async def ends_list(ends: Ends, target: str) -> None:
    client = ends.job(ends.job_token)  # a plain kubectl-style list through kasd's proxy
    try:
        await client.ok("GET", target)
    finally:
        await client.aclose()


async def bench_listing(ends: Ends, kasd: ProcessFigures, ids: dict[str, int], runs: int) -> None:
    took: list[float] = []
    cpu = 0.0
    for _ in range(runs):
        before, c0 = time.perf_counter(), kasd.cpu()
        user = ends.user()
        listed = json.loads(await user.ok(
            "GET", f"/api/v4/projects/{quote(CONFIG_PROJECT, safe='')}/environments?per_page=100"))
        await user.aclose()
        queue = [e["id"] for e in listed]

        async def worker(queue: list[int]) -> None:
            client = ends.user()
            while queue:
                await client.ok("GET", f"/api/kasd/v1/environments/{queue.pop()}")
            await client.aclose()

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(worker, queue)
        took.append(time.perf_counter() - before)
        cpu += kasd.cpu() - c0
    print(f"listing: the dashboard's environments page (the list, then GET /api/kasd/v1/environments/:id for "
          f"each of {len(ids)}, four at a time), {runs} runs:")
    print(f"  p50 {ms(pct(took, 50))}  max {ms(max(took))}   kasd CPU {cpu / runs:.2f} s per page "
          f"({cpu / runs / len(ids) * 1e3:.1f} ms per environment)", flush=True)


async def changes_latency(ends: Ends, viewers: Sequence[Viewer], envs: Sequence[tuple[str, int]], changes: int,
                          ) -> list[float]:
    """``changes`` ConfigMaps created then deleted in turn (round-robin over ``envs``); each
    viewer's delay until its graph shows the change."""
    sim = ends.kubesim()
    latencies: list[float] = []
    missed: list[str] = []
    try:
        for i in range(changes):
            slug, env_id = envs[i % len(envs)]
            name = f"bench-change-{i // (2 * len(envs))}"
            ident = f"/ConfigMap/{slug}/{name}"
            create = (i // len(envs)) % 2 == 0
            watching = [v for v in viewers if v.env_id == env_id]
            began = time.perf_counter()
            if create:
                await sim.ok("POST", f"/api/v1/namespaces/{slug}/configmaps", {
                    "metadata": {"name": name, "labels": labels(slug)}, "data": {"n": str(i)}})
            else:
                await sim.ok("DELETE", f"/api/v1/namespaces/{slug}/configmaps/{name}")
            with trio.move_on_after(30) as late:
                for viewer in watching:
                    latencies.append(await viewer.first_event_showing(began, ident, create) - began)
            if late.cancelled_caught:
                missed.append(ident)
    finally:
        await sim.aclose()
    if missed:
        print(f"  MISSED: {len(missed)} changes not shown to every viewer within 30 s, e.g. {missed[:3]}")
    return latencies


async def bench_viewers(ends: Ends, kasd: ProcessFigures, ids: dict[str, int], slug: str, count: int,
                        changes: int, slow_wait: float) -> None:
    env_id = ids[slug]
    rss0, cpu0, t0 = kasd.rss_mib(), kasd.cpu(), time.perf_counter()
    print(f"viewers: {count} SSE viewers on environment {slug} and one slow viewer (never reads):")
    print(figures_line("before", kasd, kasd.cpu(), 0.0, rss0))
    viewers = [Viewer(ends, env_id) for _ in range(count)]
    async with trio.open_nursery() as nursery:
        await connect(nursery, viewers, within=60)
        print(figures_line(f"{count} viewers connected, first graph each", kasd, cpu0, time.perf_counter() - t0, rss0))
        slow = SlowViewer(ends, env_id)
        await nursery.start(slow.run)
        slow_since, dropped_at = time.perf_counter(), [0.0]

        async def until_dropped() -> None:  # kasd's viewers gauge falls back to the readers' count
            # (another process's figure: polled, no event to wait on): first kasd counts it, then not
            for joined in (True, False):
                while ((await trio.to_thread.run_sync(ends.metrics)).get("kasd_environment_viewers", 0)  # noqa: ASYNC110
                       > count) != joined:
                    await trio.sleep(0.2)
            dropped_at[0] = time.perf_counter()

        nursery.start_soon(until_dropped)
        await trio.sleep(1.0)
        stats = ends.metrics()
        print(f"  kasd's metrics: {_watch_stats(stats)}")
        # a one-off read of the watched environment (the dashboard opening it, `kasctl env status`)
        # vs one of an environment nobody watches
        other = next(i for s, i in ids.items() if s not in (slug, "big"))
        reads: dict[str, list[float]] = {"watched": [], "unwatched": []}
        user = ends.user()
        for _ in range(5):
            for label, target in (("watched", env_id), ("unwatched", other)):
                began = time.perf_counter()
                await user.ok("GET", f"/api/kasd/v1/environments/{target}/resources")
                reads[label].append(time.perf_counter() - began)
        await user.aclose()
        print(f"  GET …/resources, 5 each: of the watched environment p50 {ms(pct(reads['watched'], 50))}, of an "
              f"unwatched one p50 {ms(pct(reads['unwatched'], 50))} ({_snapshot_stats(ends.metrics())})")
        cpu1, t1 = kasd.cpu(), time.perf_counter()
        latencies = await changes_latency(ends, viewers, [(slug, env_id)], changes)
        seconds = time.perf_counter() - t1
        print(figures_line(f"after {changes} changes", kasd, cpu1, seconds, rss0))
        print(f"  update latency (kubesim change → graph event at each of {count} viewers), {len(latencies)} samples:"
              f" p50 {ms(pct(latencies, 50))}  p99 {ms(pct(latencies, 99))}  max {ms(max(latencies))}")
        print(f"    (kasd CPU per change: {(kasd.cpu() - cpu1) / changes * 1e3:.1f} ms, for {count} viewers)")
        # keep changing until kasd drops the slow viewer: its socket fills, then one write waits
        # kasd.web.streams.WRITE_TIMEOUT_SECONDS and kasd cuts it off
        extra, t_slow = 0, time.perf_counter()
        sim = ends.kubesim()
        while not dropped_at[0] and time.perf_counter() - t_slow < slow_wait:
            name = f"bench-slow-{extra}"
            await sim.ok("POST", f"/api/v1/namespaces/{slug}/configmaps",
                         {"metadata": {"name": name, "labels": labels(slug)}})
            await sim.ok("DELETE", f"/api/v1/namespaces/{slug}/configmaps/{name}")
            extra += 2
            await trio.sleep(0.5)
        await sim.aclose()
        stats = ends.metrics()
        if dropped_at[0]:
            print(f"  slow viewer: dropped {dropped_at[0] - slow_since:.0f} s after it connected "
                  f"({changes + extra} changes made by the end of this step; {_watch_stats(stats)})")
        else:
            print(f"  slow viewer: NOT dropped {time.perf_counter() - slow_since:.0f} s after it connected "
                  f"({_watch_stats(stats)})")
        rss_dropped = kasd.rss_mib()
        await _more_changes(ends, slug, 60)
        print(f"  kasd RSS when the slow viewer was dropped {rss_dropped:.1f} MiB, after 60 more changes "
              f"{kasd.rss_mib():.1f} MiB")
        nursery.cancel_scope.cancel()
    await trio.sleep(1.0)
    print(figures_line("all viewers gone", kasd, cpu0, time.perf_counter() - t0, rss0))
    print(f"  kasd's metrics: {_watch_stats(ends.metrics())}", flush=True)


async def _more_changes(ends: Ends, slug: str, count: int) -> None:
    sim = ends.kubesim()
    for i in range(count // 2):
        name = f"bench-more-{i}"
        await sim.ok("POST", f"/api/v1/namespaces/{slug}/configmaps", {"metadata": {"name": name, "labels": labels(slug)}})
        await sim.ok("DELETE", f"/api/v1/namespaces/{slug}/configmaps/{name}")
        await trio.sleep(0.05)
    await sim.aclose()


def _snapshot_stats(stats: dict[str, float]) -> str:
    def get(how: str) -> int:
        return int(stats.get(f'kasd_environment_snapshots_total{{answered_by="{how}"}}', 0))

    return (f"one-off reads answered by a discovery {get('discovery')}, by a shared one {get('shared')}, "
            f"by a live view {get('view')}")


def _watch_stats(stats: dict[str, float]) -> str:
    def get(name: str) -> int:
        return int(stats.get(name, 0))

    return (f"watch sets {get('kasd_environment_watch_sets')}, viewers {get('kasd_environment_viewers')}, "
            f"upstream watches opened {get('kasd_environment_watches_opened_total')}, "
            f"discoveries {get('kasd_environment_discoveries_total')}, "
            f"viewers dropped {get('kasd_environment_viewers_dropped_total')}")


async def bench_spread(ends: Ends, kasd: ProcessFigures, ids: dict[str, int], slugs: list[str], changes: int,
                       idle: float) -> None:
    print(f"spread: one viewer on each of {len(slugs)} environments:")
    rss0, cpu0, t0 = kasd.rss_mib(), kasd.cpu(), time.perf_counter()
    before = ends.metrics()
    viewers = [Viewer(ends, ids[s]) for s in slugs]
    async with trio.open_nursery() as nursery:
        await connect(nursery, viewers, within=120)
        print(figures_line(f"{len(slugs)} viewers connected, first graph each", kasd, cpu0,
                           time.perf_counter() - t0, rss0))
        await trio.sleep(2.0)
        stats = ends.metrics()
        opened = stats.get("kasd_environment_watches_opened_total", 0) - before.get(
            "kasd_environment_watches_opened_total", 0)
        print(f"  kasd's metrics: {_watch_stats(stats)}")
        print(f"  upstream watches opened for these {len(slugs)} environments: {opened:.0f} "
              f"({opened / len(slugs):.1f} per environment: per kind and namespace, shared by its viewers)")
        cpu1, t1 = kasd.cpu(), time.perf_counter()
        await trio.sleep(idle)
        print(figures_line(f"idle {idle:.0f} s, {len(slugs)} watch sets held", kasd, cpu1, time.perf_counter() - t1,
                           rss0))
        cpu2, t2 = kasd.cpu(), time.perf_counter()
        latencies = await changes_latency(ends, viewers, [(s, ids[s]) for s in slugs], changes)
        print(figures_line(f"after {changes} changes across them", kasd, cpu2, time.perf_counter() - t2, rss0))
        print(f"  update latency, one viewer each, {len(latencies)} samples: p50 {ms(pct(latencies, 50))}  "
              f"p99 {ms(pct(latencies, 99))}  max {ms(max(latencies))}")
        nursery.cancel_scope.cancel()
    await trio.sleep(1.0)
    print(f"  all gone: {_watch_stats(ends.metrics())}; kasd RSS {kasd.rss_mib():.1f} MiB", flush=True)


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 environments, fewer runs and changes (noisier)")
    parser.add_argument("--envs", type=int, help="environments (default 50; --quick 10)")
    parser.add_argument("--objects", type=int, default=200, help="labelled objects per environment (default 200)")
    parser.add_argument("--big", type=int, default=1000, help="objects of the environment timed for discovery (default 1000)")
    parser.add_argument("--viewers", type=int, default=20, help="SSE viewers on one environment (default 20)")
    parser.add_argument("--runs", type=int, help="discovery runs (default 20; --quick 6)")
    parser.add_argument("--changes", type=int, help="changes timed for update latency (default 100; --quick 20)")
    parser.add_argument("--idle", type=float, help="seconds the spread viewers idle for the CPU figure (default 20; --quick 5)")
    parser.add_argument("--slow-wait", type=float, default=120.0,
                        help="seconds to keep changing the environment until kasd drops the slow viewer (default 120)")
    parser.add_argument("--only", choices=["discovery", "listing", "viewers", "spread"], action="append",
                        help="run only these sections (repeatable; the seeding always runs)")
    args = parser.parse_args()
    envs = args.envs or (10 if args.quick else 50)
    runs = args.runs or (6 if args.quick else 20)
    changes = args.changes or (20 if args.quick else 100)
    idle = args.idle or (5.0 if args.quick else 20.0)
    only = set(args.only or ["discovery", "listing", "viewers", "spread"])
    slugs = [f"env-{i:02d}" for i in range(envs)]
    big = "big"

    print(f"machine: {describe_machine()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{envs} environments × {args.objects} objects, one of {args.big}; {args.viewers} viewers", flush=True)
    stack = Stack(Path(tempfile.mkdtemp(prefix="bench-environments-")),
                  extra_users=people(args.viewers + envs + 1))
    stack.start()
    try:
        assert stack.kasd is not None and stack.kasd.proc is not None
        kasd = ProcessFigures(stack.kasd.proc.pid)
        ends = Ends(stack)
        rss_start = kasd.rss_mib()
        print(f"kasd at start: RSS {rss_start:.1f} MiB, CPU {kasd.cpu():.2f} s")
        ids = trio.run(seed, stack, ends, slugs, big, args.objects, args.big)
        # let every Deployment roll out (kubesim's pods become Ready) before timing anything
        graph = trio.run(settle, ends, ids[slugs[0]])
        graph_big = trio.run(settle, ends, ids[big])
        print(f"  {slugs[0]}: {len(graph['nodes'])} objects in its graph ({graph['health']['status']}); "
              f"{big}: {len(graph_big['nodes'])} ({graph_big['health']['status']})")
        print(f"kasd after seeding: RSS {kasd.rss_mib():.1f} MiB, CPU {kasd.cpu():.2f} s", flush=True)
        if "discovery" in only:
            trio.run(bench_discovery, ends, kasd, ids, big, slugs[0], runs)
        if "listing" in only:
            trio.run(bench_listing, ends, kasd, {s: ids[s] for s in [*slugs, big]}, max(2, runs // 5))
        if "viewers" in only:
            trio.run(bench_viewers, ends, kasd, ids, slugs[0], args.viewers, changes, args.slow_wait)
        if "spread" in only:
            trio.run(bench_spread, ends, kasd, ids, slugs, max(changes, len(slugs)), idle)
        print(f"kasd at the end: RSS {kasd.rss_mib():.1f} MiB, CPU {kasd.cpu():.2f} s")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
