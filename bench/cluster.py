#!/usr/bin/env python3
"""kasd among replicas: what the hop, the pub/sub notice, a failover and an idle agent cost.

    python bench/cluster.py              # every section, ~4 minutes
    python bench/cluster.py --quick      # smaller counts, noisier figures (~1 minute)
    python bench/cluster.py --only idle  # one section: hop, notice, failover, idle

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
"""

from __future__ import annotations

import argparse
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio
import yaml
from httpload import run_load
from wire_throughput import describe_machine

from kasctl.stack import Stack

SMALL = "/api/v1/namespaces/default/configmaps/bench-small"


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
async def one(i, ready, stop):
    async with open_h2_session(url, token=f"{token_prefix}{i}", metadata={"agent_id": i + 1, "pod_name": f"idle-{i}"}):
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller counts (noisier figures)")
    parser.add_argument("--only", choices=["hop", "notice", "failover", "idle"], action="append",
                        help="run only this section (repeatable)")
    parser.add_argument("--sessions", type=int, default=None, help="idle: how many agent sessions (default 10,000)")
    args = parser.parse_args()
    print(f"machine: {describe_machine()}", flush=True)
    sections = args.only or ["hop", "notice", "failover", "idle"]
    if "hop" in sections:
        bench_hop(args.quick)
    if "notice" in sections:
        bench_notice(args.quick)
    if "failover" in sections:
        bench_failover(args.quick)
    if "idle" in sections:
        bench_idle(args.quick, args.sessions)


if __name__ == "__main__":
    main()
