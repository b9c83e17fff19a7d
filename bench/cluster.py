#!/usr/bin/env python3
"""kasd among replicas: what the hop, the pub/sub notice, a failover and an idle agent cost.

    python bench/cluster.py              # every section, ~4 minutes
    python bench/cluster.py --quick      # smaller counts, noisier figures (~1 minute)
    python bench/cluster.py --only idle  # one section: hop, notice, failover, idle, agents, watches

Real processes on 127.0.0.1: redis-server, kasd replicas, agentd, kubesim (kasctl's Stack).

hop       a small GET through the replica that holds the agent's tunnel vs. through another
          (one kasd-to-kasd hop), concurrency 1 and 64, rounds alternated so noise hits both
          alike; prints p50/p99 of each and the added p50/p99 (target: ≤ 0.5 ms p50 at c1)
notice    a request waits on replica B for an agent with no tunnel; a (lightweight) agent session
          then connects to replica A: the time from its handshake to the request's answer
          (Redis pub/sub, no polling; target ≤ 10 ms p99; GitLab's kas polls every 50 ms)
failover  kill -9 of the replica holding agentd's one tunnel, then a GET through a survivor:
          the time from the kill to its answer, over N kills (target ≤ 1 s p99)
idle      one kasd process holding N idle agent sessions, opened from a separate process with
          lightweight sessions (the real mux and HTTP/2 carrier, no kubectl): kasd's RSS per
          session and its CPU per idle session per minute (keepalives) (target: 10,000 agents at
          ≤ 32 KiB each and < 1 % of a core)
agents    req/s of a small GET at concurrency 64 through the tunnel with 1, 100 and 1,000 agents
          connected (``--agents``): n - 1 more agents in kasd's directory, each with its own token,
          held connected from a separate process with the real carrier and mux (kasd authenticates
          and registers each); the demo's agentd serves the requests; against direct in the same run
watches   1,000 concurrent watches (``--watches``) of a namespace's ConfigMaps straight at kubesim,
          then through kasd and agentd: the latency from a write to each watcher reading its event
          (p50/p99, tunnel ÷ direct) and kasd's and agentd's RSS per watch
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import resource
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio
import yaml
from httpload import run_load
from wire_throughput import describe_machine

from kasctl.stack import Stack

SMALL = "/api/v1/namespaces/default/configmaps/bench-small"
SECTIONS = ["hop", "notice", "failover", "idle", "agents", "watches"]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:7.2f} ms"


def _ctx(stack: Stack) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(cadata=stack.ca.cert_pem.bytes().decode())
    return ctx


def _metric(stack: Stack, replica: int, name: str) -> float:
    url = f"http://{stack.replica_addresses[replica]['observability']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _holder(stack: Stack) -> int:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        held = [_metric(stack, i, "kasd_agent_sessions") for i in range(stack.replicas)]
        if sum(held) == 1:
            return held.index(1)
        time.sleep(0.05)
    raise RuntimeError(f"agentd's tunnel did not settle on one replica: {held}")


def _seed(stack: Stack) -> None:
    cluster = yaml.safe_load((stack.dir / "cluster.kubeconfig").read_text())["clusters"][0]["cluster"]
    ctx = ssl.create_default_context()
    import base64

    ctx.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    ctx.check_hostname = False
    request = urllib.request.Request(
        cluster["server"] + "/api/v1/namespaces/default/configmaps", method="POST",
        data=json.dumps({"metadata": {"name": "bench-small"}, "data": {"greeting": "hello"}}).encode(),
        headers={"Authorization": f"Bearer {stack.cluster_token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, context=ctx, timeout=30) as response:
        response.read()


# --------------------------------------------------------------------------- hop


def bench_hop(quick: bool) -> None:
    n1, n64, rounds = (300, 1500, 2) if quick else (1000, 6400, 4)
    stack = Stack(Path(tempfile.mkdtemp(prefix="bench-cluster-")), replicas=2, agentd_connections=1)
    stack.start()
    try:
        _seed(stack)
        holder = _holder(stack)
        other = 1 - holder
        ctx = _ctx(stack)
        headers = [("authorization", f"Bearer {stack.ci_token}"), ("accept", "application/json")]
        print(f"hop: tunnel on kasd-{holder + 1}; GET {SMALL} through it (same) and through kasd-{other + 1} (hop)")
        for concurrency, count in ((1, n1), (64, n64)):
            got: dict[str, list[float]] = {"same": [], "hop": []}
            for _ in range(rounds):
                for label, replica in (("same", holder), ("hop", other)):
                    host, port = stack.replica_addresses[replica]["kubernetes_api"].rsplit(":", 1)
                    result = trio.run(lambda h=host, p=port, c=concurrency, n=count: run_load(
                        h, int(p), SMALL, concurrency=c, requests=n // rounds, headers=headers, ssl_context=ctx))
                    got[label] += list(result.latencies)
            same, hop = got["same"], got["hop"]
            print(f"  concurrency {concurrency:>2}: same p50 {ms(pct(same, 50))} p99 {ms(pct(same, 99))} | "
                  f"hop p50 {ms(pct(hop, 50))} p99 {ms(pct(hop, 99))} | "
                  f"added p50 {(pct(hop, 50) - pct(same, 50)) * 1e3:+.2f} ms, p99 {(pct(hop, 99) - pct(same, 99)) * 1e3:+.2f} ms"
                  f"{'  (target ≤ 0.5 ms p50)' if concurrency == 1 else ''}", flush=True)
        forwarded = _metric(stack, other, 'kasd_forwarded_requests_total{direction="out"}')
        print(f"  forwarded by kasd-{other + 1}: {forwarded:.0f}")
    finally:
        stack.stop()


# --------------------------------------------------------------------------- notice


async def _notice_once(stack: Stack, a: int, b: int, ctx: ssl.SSLContext) -> tuple[float, float]:
    """A request waiting on replica b; a fake agent session connecting to replica a: the seconds
    from the session's handshake to the request's answer, and those of the same request asked again
    on the same connection (the tunnel up: the request and the hop alone)."""
    from httpload import Connection, _checked

    from tunnelhttp.head import ResponseHead
    from wire.h2carrier import open_h2_session

    answered = trio.Event()
    t_answer = 0.0
    host, port = stack.replica_addresses[b]["kubernetes_api"].rsplit(":", 1)
    headers = [("authorization", f"Bearer {stack.ci_token}")]
    conn = await Connection.open(host, int(port), ssl_context=ctx)  # TLS before the wait, not in it

    async def ask() -> None:
        nonlocal t_answer
        await _checked(conn, SMALL, headers)
        t_answer = time.perf_counter()
        answered.set()

    async def serve(session: object) -> None:
        while True:
            stream = await session.accept_stream()  # type: ignore[attr-defined]
            await stream.accept(ResponseHead(status=200, headers=(("content-length", "2"),)).to_metadata())
            await stream.send_all(b"{}")
            await stream.send_eof()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        await trio.sleep(0.3)  # the request is in, waiting inside kasd b (no tunnel anywhere)
        url = f"http://{stack.replica_addresses[a]['agent']}/tunnel"
        async with open_h2_session(url, token=stack.agent_token, metadata={"agent_id": 1, "pod_name": "bench"}) as session:
            t_up = time.perf_counter()
            nursery.start_soon(serve, session)
            await answered.wait()
            t_again = time.perf_counter()
            await _checked(conn, SMALL, headers)
            again = time.perf_counter() - t_again
            nursery.cancel_scope.cancel()
    await conn.aclose()
    return t_answer - t_up, again


def bench_notice(quick: bool) -> None:
    count = 20 if quick else 60
    stack = Stack(Path(tempfile.mkdtemp(prefix="bench-cluster-")), replicas=2, agent_wait_timeout=10.0)
    stack.start()
    try:
        for process in stack.agentds:
            assert process is not None and process.stop() == 0  # no real agent: the bench plays it
        ctx = _ctx(stack)
        took, hop = [], []
        for _ in range(count):
            waited, alone = trio.run(_notice_once, stack, 0, 1, ctx)
            took.append(waited)
            hop.append(alone)
            time.sleep(0.2)  # the session's goodbye reaches the other replica before the next round
        print(f"notice: agent connects to kasd-1 while a request waits on kasd-2, {count} times:")
        print(f"  handshake → answer: p50 {ms(pct(took, 50))} p99 {ms(pct(took, 99))} max {ms(max(took))}"
              f"  (target ≤ 10 ms p99, GitLab polls every 50 ms)")
        print(f"  of which the request itself (the same GET again on that connection, tunnel up): p50 {ms(pct(hop, 50))} p99 {ms(pct(hop, 99))};"
              f" the notice alone ≈ p50 {ms(pct(took, 50) - pct(hop, 50))}", flush=True)
    finally:
        stack.stop()


# --------------------------------------------------------------------------- failover


async def _get_once(host: str, port: int, headers: list[tuple[str, str]], ctx: ssl.SSLContext) -> None:
    """One GET on a fresh connection (a client arriving after the kill); raises unless 200."""
    from httpload import Connection, _checked

    conn = await Connection.open(host, port, ssl_context=ctx)
    try:
        await _checked(conn, SMALL, headers)
    finally:
        await conn.aclose()


def bench_failover(quick: bool) -> None:
    kills = 5 if quick else 20
    stack = Stack(Path(tempfile.mkdtemp(prefix="bench-cluster-")), replicas=3, agentd_connections=1,
                  agent_wait_timeout=10.0, heartbeat_interval=1.0)
    stack.start()
    try:
        _seed(stack)
        ctx = _ctx(stack)
        headers = [("authorization", f"Bearer {stack.ci_token}")]
        took = []
        for _ in range(kills):
            holder = _holder(stack)
            survivor = (holder + 1) % 3
            host, port = stack.replica_addresses[survivor]["kubernetes_api"].rsplit(":", 1)
            process = stack.kasds[holder]
            assert process is not None and process.proc is not None
            os.kill(process.proc.pid, signal.SIGKILL)
            started = time.perf_counter()
            process.proc.wait()
            while True:
                try:
                    trio.run(_get_once, host, int(port), headers, ctx)
                    break
                except Exception:
                    if time.perf_counter() - started > 30:
                        raise
            took.append(time.perf_counter() - started)
            stack.start_kasd(replica=holder)  # back, same ports, before the next kill
        print(f"failover: kill -9 of the replica holding the tunnel, then a GET through a survivor, {kills} times:")
        print(f"  kill → answer: p50 {ms(pct(took, 50))} p99 {ms(pct(took, 99))} max {ms(max(took))}  (target ≤ 1 s p99)",
              flush=True)
    finally:
        stack.stop()


# --------------------------------------------------------------------------- idle


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_DRIVER = r'''
import sys, trio
from wire.h2carrier import open_h2_session
url, n, token_prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
first = int(sys.argv[4]) if len(sys.argv) > 4 else 1  # the first agent's id; token i is agent first + i's
async def one(i, ready, stop):
    async with open_h2_session(url, token=f"{token_prefix}{i}", metadata={"agent_id": first + i, "pod_name": f"idle-{i}"}):
        ready()
        await stop.wait()
async def main():
    stop = trio.Event()
    up = 0
    def ready():
        nonlocal up
        up += 1
    async with trio.open_nursery() as nursery:
        limit = trio.CapacityLimiter(64)
        async def start(i):
            async with limit:
                nursery.start_soon(one, i, ready, stop)
                await trio.sleep(0.002)
        for i in range(n):
            await start(i)
        while up < n:
            await trio.sleep(0.1)
        print("UP", up, flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        stop.set()
trio.run(main)
'''


def bench_idle(quick: bool, sessions: int | None) -> None:
    n = sessions or (2000 if quick else 10_000)
    window = 20.0 if quick else 60.0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * n + 1024)), hard))
    work = Path(tempfile.mkdtemp(prefix="bench-idle-"))
    agents = [{"id": i + 1, "name": f"a{i + 1}", "config_project": f"g/p{i + 1}",
               "token_sha256": hashlib.sha256(f"idle-token-{i}".encode()).hexdigest()} for i in range(n)]
    config = {
        "listeners": {"agent": {"address": "127.0.0.1:0", "max_connections": n + 100,
                                "max_connections_per_source": n + 100},
                      "observability": {"address": "127.0.0.1:0"}, "kubernetes_api": {"address": "127.0.0.1:0"}},
        "agents": agents,
    }
    (work / "kasd.yaml").write_text(yaml.safe_dump(config))
    ready = work / "ready.json"
    with open(work / "kasd.log", "wb") as log:
        kasd = subprocess.Popen([sys.executable, "-m", "kasd", "--config", str(work / "kasd.yaml"),
                                 "--ready-file", str(ready), "--log-level", "warning"], stderr=log)
    driver = None
    try:
        while not ready.exists() or not ready.read_text().strip():
            time.sleep(0.05)
            if kasd.poll() is not None:
                raise RuntimeError((work / "kasd.log").read_text()[-2000:])
        addresses = json.loads(ready.read_text())
        time.sleep(1.0)
        base_rss = _rss_kib(kasd.pid)
        started = time.perf_counter()
        driver = subprocess.Popen([sys.executable, "-c", _DRIVER, f"http://{addresses['agent']}/tunnel", str(n), "idle-token-"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  cwd=Path(__file__).resolve().parent.parent)
        assert driver.stdout is not None
        line = driver.stdout.readline()
        if not line.startswith("UP"):
            raise RuntimeError(f"driver: {line!r}")
        opened = time.perf_counter() - started
        time.sleep(2.0)  # the last handshakes settle
        rss = _rss_kib(kasd.pid)
        cpu0, t0 = _cpu_seconds(kasd.pid), time.perf_counter()
        time.sleep(window)
        cpu = (_cpu_seconds(kasd.pid) - cpu0) / (time.perf_counter() - t0)
        per = (rss - base_rss) / n
        print(f"idle: {n} agent sessions on one kasd (opened in {opened:.1f} s from a separate process):")
        print(f"  RSS {base_rss / 1024:.0f} MiB → {rss / 1024:.0f} MiB: {per:.1f} KiB per session (target ≤ 32 KiB)")
        print(f"  CPU over {window:.0f} s idle: {cpu * 100:.2f} % of a core in all, "
              f"{cpu * 100 / n * 60:.5f} core-% per session per minute (target: all < 1 % of a core)", flush=True)
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        kasd.send_signal(signal.SIGTERM)
        try:
            kasd.wait(30)
        except subprocess.TimeoutExpired:
            kasd.kill()


# --------------------------------------------------------------------------- agents

#: the many-agents sections' extra agents' ids: from here up (the demo's are 1 and 2)
FIRST_EXTRA_AGENT = 1001


def _extra_agents(n: int) -> list[dict[str, object]]:
    """kasd's directory entries of ``n`` more agents, each with a token of its own (``extra-token-i``), their
    config projects the demo's offline one (no config.yaml of theirs there: no ci_access)."""
    return [{"id": FIRST_EXTRA_AGENT + i, "name": f"extra{i}", "config_project": "group/offline",
             "token_sha256": hashlib.sha256(f"extra-token-{i}".encode()).hexdigest()} for i in range(n)]


class AgentSessions:
    """``n`` agent sessions held open from a separate process (the real HTTP/2 carrier and mux, one per
    agent id with its own token; kasd authenticates and registers each), until ``close()``."""

    def __init__(self, agent_url: str, n: int) -> None:
        self.n = n
        self.process: subprocess.Popen[str] | None = None
        if n == 0:
            return
        self.process = subprocess.Popen(
            [sys.executable, "-c", _DRIVER, agent_url, str(n), "extra-token-", str(FIRST_EXTRA_AGENT)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("UP"):
            raise RuntimeError(f"agent sessions driver: {line!r}")

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _raise_fd_limit(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n)), hard))


def scaling_stack(agents: int, watches: int) -> Stack:
    """The stack of the agents and watches sections (one for both when both run): ``agents - 1``
    more agents in kasd's directory and its listeners' limits raised for them and for ``watches``."""
    _raise_fd_limit(4 * max(agents, watches) + 1024)
    many = {"max_connections": agents + 100, "max_connections_per_source": agents + 100}
    big = {"max_connections": watches + 100, "max_connections_per_source": watches + 100,
           "max_requests_per_principal": watches + 100}  # fmt: skip
    stack = Stack(Path(tempfile.mkdtemp(prefix="bench-scaling-")), extra_agents=_extra_agents(agents - 1),
                  listener_settings={"agent": many, "kubernetes_api": big})
    stack.start()
    try:
        _seed(stack)
    except BaseException:
        stack.stop()
        raise
    return stack


def bench_agents(stack: Stack, quick: bool, counts: list[int], requests: int | None) -> None:
    """req/s at concurrency 64 through the tunnel while 1, 100, 1,000 agents are connected to kasd
    (the demo's agentd serves the requests; the others hold idle sessions), against direct."""
    requests = requests or (600 if quick else 4000)
    ctx = _ctx(stack)
    host, port = stack.addresses["kubernetes_api"].rsplit(":", 1)
    headers = [("authorization", f"Bearer {stack.ci_token}"), ("accept", "application/json")]
    cluster = yaml.safe_load((stack.dir / "cluster.kubeconfig").read_text())["clusters"][0]["cluster"]
    sim_host, sim_port = cluster["server"].removeprefix("https://").rsplit(":", 1)
    sim_ctx = ssl.create_default_context()
    sim_ctx.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    sim_ctx.check_hostname = False
    sim_headers = [("authorization", f"Bearer {stack.cluster_token}"), ("accept", "application/json")]

    def load(h: str, p: int, hs: list[tuple[str, str]], c: ssl.SSLContext) -> float:
        return trio.run(lambda: run_load(h, p, SMALL, concurrency=64, requests=requests, headers=hs, ssl_context=c)).rps

    print(f"agents: small GET at concurrency 64 through the tunnel, {requests} requests, with n agents connected:")
    direct = load(sim_host, int(sim_port), sim_headers, sim_ctx)
    print(f"  direct (no tunnel)   {direct:8.0f} req/s", flush=True)
    figures: dict[int, float] = {}
    for n in sorted(counts):
        sessions = AgentSessions(f"http://{stack.addresses['agent']}/tunnel", n - 1)
        try:
            connected = _metric(stack, 0, "kasd_agent_sessions")
            figures[n] = load(host, int(port), headers, ctx)
            print(f"  {n:>5} agents ({connected:.0f} sessions) {figures[n]:8.0f} req/s   {figures[n] / direct:.2f} × direct",
                  flush=True)  # fmt: skip
        finally:
            sessions.close()
    one = figures[min(figures)]
    print("  ratio to the fewest agents: " + "  ".join(f"{n}: {rps / one:.2f}" for n, rps in figures.items()))


# --------------------------------------------------------------------------- watches


class Watchers:
    """``n`` watches of one namespace's ConfigMaps, one HTTP/1.1 keep-alive connection each, in one trio
    task group; each event's latency is the time from the write (its ``data.t``, this process's
    ``perf_counter``) to the watcher reading it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.up = 0
        self.all_up = trio.Event()
        self.latencies: list[float] = []
        self.seen: dict[str, int] = {}
        self.all_seen: dict[str, trio.Event] = {}

    async def watch(self, host: str, port: int, ctx: ssl.SSLContext, headers: list[tuple[str, str]], path: str) -> None:
        import h11

        stream = await trio.open_ssl_over_tcp_stream(host, port, ssl_context=ctx, https_compatible=True)
        conn = h11.Connection(h11.CLIENT)
        await stream.send_all(conn.send(h11.Request(method="GET", target=path, headers=[("host", host), *headers]))
                              + conn.send(h11.EndOfMessage()))  # fmt: skip
        buffered = b""
        async with stream:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        raise ConnectionError("the watch ended")
                    conn.receive_data(bytes(data))
                elif isinstance(event, h11.Response):
                    if event.status_code != 200:
                        raise RuntimeError(f"watch answered {event.status_code}")
                    self.up += 1
                    if self.up == self.n:
                        self.all_up.set()
                elif isinstance(event, h11.Data):
                    now = time.perf_counter()
                    buffered += bytes(event.data)
                    *lines, buffered = buffered.split(b"\n")
                    for line in lines:
                        if line.strip():
                            self._saw(json.loads(line), now)
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    raise ConnectionError("the watch ended")

    def _saw(self, event: dict[str, object], now: float) -> None:
        obj = event.get("object")
        if event.get("type") != "ADDED" or not isinstance(obj, dict) or "t" not in obj.get("data", {}):
            return  # not one of ours (kube-root-ca.crt, which every namespace gets)
        name, sent = obj["metadata"]["name"], float(obj["data"]["t"])
        self.latencies.append(now - sent)
        self.seen[name] = self.seen.get(name, 0) + 1
        if self.seen[name] == self.n:
            self.all_seen[name].set()


async def _watch_round(n: int, events: int, target: tuple[str, int, ssl.SSLContext, list[tuple[str, str]]],
                       namespace: str, post: Callable[[str, dict[str, object]], None],
                       measure: Callable[[], None] | None = None) -> Watchers:  # fmt: skip
    """Open ``n`` watches on ``target``, then write ``events`` ConfigMaps one after another (each once
    every watcher saw the previous), and return what the watchers saw."""
    watchers = Watchers(n)
    host, port, ctx, headers = target
    path = f"/api/v1/namespaces/{namespace}/configmaps?watch=true"
    async with trio.open_nursery() as nursery:
        limit = trio.CapacityLimiter(32)  # handshakes in flight at once

        async def open_one() -> None:
            async with limit:
                nursery.start_soon(watchers.watch, host, port, ctx, headers, path)
                await trio.lowlevel.checkpoint()

        for _ in range(n):
            await open_one()
        with trio.fail_after(120):
            await watchers.all_up.wait()
        await trio.sleep(1.0)  # the last watches settle in the daemons before their memory is read
        if measure is not None:
            measure()
        for k in range(events):
            name = f"ev-{k}"
            watchers.all_seen[name] = trio.Event()
            body: dict[str, object] = {"metadata": {"name": name}, "data": {"t": repr(time.perf_counter())}}
            await trio.to_thread.run_sync(post, f"/api/v1/namespaces/{namespace}/configmaps", body)
            with trio.fail_after(60):
                await watchers.all_seen[name].wait()
        nursery.cancel_scope.cancel()
    return watchers


def bench_watches(stack: Stack, quick: bool, n: int) -> None:
    """``n`` concurrent watches through one kasd (and agentd) vs straight at kubesim: kasd's and
    agentd's memory per watch, and the latency from a write to each watcher seeing its event."""
    events = 5 if quick else 20
    cluster = yaml.safe_load((stack.dir / "cluster.kubeconfig").read_text())["clusters"][0]["cluster"]
    sim_ctx = ssl.create_default_context()
    sim_ctx.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    sim_ctx.check_hostname = False

    def post(path: str, body: dict[str, object]) -> None:
        request = urllib.request.Request(
            cluster["server"] + path, method="POST", data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {stack.cluster_token}", "Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, context=sim_ctx, timeout=30) as response:
            response.read()

    for ns in ("watch-direct", "watch-tunnel"):
        post("/api/v1/namespaces", {"metadata": {"name": ns}})
    sim_host, sim_port = cluster["server"].removeprefix("https://").rsplit(":", 1)
    host, port = stack.addresses["kubernetes_api"].rsplit(":", 1)
    direct = (sim_host, int(sim_port), sim_ctx, [("authorization", f"Bearer {stack.cluster_token}")])
    tunnel = (host, int(port), _ctx(stack), [("authorization", f"Bearer {stack.ci_token}")])
    pids = {name: p.proc.pid for name, p in (("kasd", stack.kasd), ("agentd", stack.agentd), ("kubesim", stack.kubesim))
            if p is not None and p.proc is not None}  # fmt: skip
    before = {name: _rss_kib(pid) for name, pid in pids.items()}
    after: dict[str, int] = {}

    def measure() -> None:
        after.update({name: _rss_kib(pid) for name, pid in pids.items()})

    print(f"watches: {n} concurrent watches of a namespace's ConfigMaps, {events} writes, each seen by every watch:")
    seen_direct = trio.run(_watch_round, n, events, direct, "watch-direct", post)
    seen_tunnel = trio.run(_watch_round, n, events, tunnel, "watch-tunnel", post, measure)
    for name, w in (("direct", seen_direct), ("tunnel", seen_tunnel)):
        print(f"  {name:<7} write → watcher: p50 {ms(pct(w.latencies, 50))}  p99 {ms(pct(w.latencies, 99))}"
              f"  ({len(w.latencies)} events seen)")  # fmt: skip
    added = pct(seen_tunnel.latencies, 50) - pct(seen_direct.latencies, 50)
    print(f"  the tunnel adds {added * 1e3:+.2f} ms p50 (both include the write's own HTTPS request)")
    print(f"  tunnel ÷ direct: p50 {pct(seen_tunnel.latencies, 50) / pct(seen_direct.latencies, 50):.2f}×"
          f"  p99 {pct(seen_tunnel.latencies, 99) / pct(seen_direct.latencies, 99):.2f}×")  # fmt: skip
    for name in ("kasd", "agentd"):
        print(f"  {name} RSS {before[name] / 1024:.0f} MiB → {after[name] / 1024:.0f} MiB with the tunnel's watches open:"
              f" {(after[name] - before[name]) / n:.1f} KiB per watch")  # fmt: skip
    print(f"  (kubesim, serving both rounds: {before['kubesim'] / 1024:.0f} → {after['kubesim'] / 1024:.0f} MiB)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller counts (noisier figures)")
    parser.add_argument("--only", choices=SECTIONS, action="append",
                        help="run only this section (repeatable)")
    parser.add_argument("--sessions", type=int, default=None, help="idle: how many agent sessions (default 10,000)")
    parser.add_argument("--agents", default=None,
                        help="agents: how many agents connected, comma-separated (default 1,100,1000; --quick 1,10)")
    parser.add_argument("--requests", type=int, default=None, help="agents: requests per figure (default 4,000; --quick 600)")
    parser.add_argument("--watches", type=int, default=None, help="watches: how many concurrent watches (default 1,000)")
    args = parser.parse_args()
    try:
        counts = [int(n) for n in (args.agents or ("1,10" if args.quick else "1,100,1000")).split(",")]
    except ValueError:
        parser.error(f"--agents must be comma-separated counts, got {args.agents!r}")
    if any(n < 1 for n in counts) or any(v is not None and v < 1 for v in (args.watches, args.requests)):
        parser.error("--agents counts, --requests and --watches must be at least 1")
    print(f"machine: {describe_machine()}", flush=True)
    sections = args.only or SECTIONS
    if "hop" in sections:
        bench_hop(args.quick)
    if "notice" in sections:
        bench_notice(args.quick)
    if "failover" in sections:
        bench_failover(args.quick)
    if "idle" in sections:
        bench_idle(args.quick, args.sessions)
    if "agents" in sections or "watches" in sections:
        watches = args.watches or (50 if args.quick else 1000)
        stack = scaling_stack(max(counts) if "agents" in sections else 1, watches if "watches" in sections else 1)
        try:
            if "agents" in sections:
                bench_agents(stack, args.quick, counts, args.requests)
            if "watches" in sections:
                bench_watches(stack, args.quick, watches)
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
