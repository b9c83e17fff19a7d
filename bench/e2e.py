#!/usr/bin/env python3
"""End-to-end request latency, requests/s and bulk throughput: through the tunnel vs direct vs ssh -R.

    python bench/e2e.py                 # ~1-2 minutes on 2 cores
    python bench/e2e.py --quick         # fewer requests, noisier

Starts the demo stack (kubesim, kasd, agentd as real processes on 127.0.0.1; ``kasctl.stack``) and
measures, in the same run, three ways to reach the same kubesim:

  direct    HTTPS straight to kubesim (what a cluster-local client would see)
  tunnel    HTTPS to kasd's Kubernetes API proxy → mux over h2c → agentd → HTTPS to kubesim
  ssh -R    HTTPS to kubesim through an OpenSSH reverse tunnel (sshd with throwaway keys on
            loopback; skipped, with the reason, when sshd is not installed)
  relay     HTTPS through two bare TLS byte relays in a chain (``bench/relay.py``): the processes,
            wake-ups and TLS of a two-process tunnel without any protocol work; concurrency 1
            only, as the floor under the tunnel's added latency on this machine

Small GET: one ~300-byte ConfigMap, at concurrency 1 and 64, keep-alive connections, p50/p99 and
requests/s. Bulk: a ~64 MiB ConfigMap list. Prints ratios against direct and ssh -R.

    python bench/e2e.py --quick --profile   # and, after the timed loads, one more c1 tunnel load
                                            # with kasd and agentd under cProfile: Python calls
                                            # per request in each daemon, by package

``--profile`` starts the daemons through ``bench/profiled.py`` (cProfile switched on and off by
SIGUSR2, so start-up is not counted); the timed figures above it are taken without a profile running.
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import pstats
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import trio
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from httpload import LoadResult, run_load
from sshtunnel import ReverseTunnel
from wire_throughput import describe_machine

from kasctl.stack import Stack

SMALL = "/api/v1/namespaces/default/configmaps/bench-small"
BULK_NS = "bench-bulk"
BULK = f"/api/v1/namespaces/{BULK_NS}/configmaps"


class Target:
    def __init__(self, name: str, host: str, port: int, ctx: ssl.SSLContext, token: str) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.ctx = ctx
        self.headers = [("authorization", f"Bearer {token}"), ("accept", "application/json")]

    def load(self, target: str, concurrency: int, requests: int) -> LoadResult:
        return trio.run(
            lambda: run_load(
                self.host, self.port, target, concurrency=concurrency, requests=requests,
                headers=self.headers, ssl_context=self.ctx,
            )
        )  # fmt: skip


def _context(ca_pem: bytes) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(cadata=ca_pem.decode())
    ctx.check_hostname = False  # kubesim's throwaway certificate names localhost; we dial 127.0.0.1
    return ctx


def _seed(url: str, ctx: ssl.SSLContext, token: str, bulk_mib: int) -> None:
    def post(path: str, body: dict[str, object]) -> None:
        request = urllib.request.Request(
            url + path, data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, context=ctx, timeout=60) as response:
            response.read()

    post("/api/v1/namespaces/default/configmaps", {"metadata": {"name": "bench-small"}, "data": {"greeting": "hello"}})
    post("/api/v1/namespaces", {"metadata": {"name": BULK_NS}})
    for i in range(bulk_mib):
        post(f"/api/v1/namespaces/{BULK_NS}/configmaps", {"metadata": {"name": f"blob-{i}"}, "data": {"blob": "x" * (1 << 20)}})


def _cpu_seconds(process: object) -> float:
    """utime + stime of a ``kasctl.stack`` process so far, from ``/proc/<pid>/stat``."""
    proc = getattr(process, "proc", None)
    if proc is None:
        return 0.0
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _profiled_python(workdir: Path) -> str:
    """An executable that runs ``python -m MODULE`` through ``bench/profiled.py``."""
    wrapper = workdir / "python-profiled"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).with_name("profiled.py")}" "$@"\n')
    wrapper.chmod(0o700)
    return str(wrapper)


def _package(filename: str) -> str:
    if filename == "~":
        return "builtins"
    if filename.startswith("<attrs generated"):
        return "attrs"  # the __init__/__eq__/… attrs writes for each class
    if filename.startswith("<"):
        return "stdlib"  # <frozen …>, <string>
    parts = Path(filename).parts
    for marker in ("site-packages", "kubesim"):
        if marker in parts:
            rest = parts[parts.index(marker) + 1 :]
            return rest[0].removesuffix(".py") if rest else marker
    for root in (Path.cwd().resolve(), Path(__file__).resolve().parent.parent):  # the daemons' tree first
        try:
            return Path(filename).resolve().relative_to(root).parts[0].removesuffix(".py")
        except ValueError:
            pass
    return "stdlib" if "python3" in filename else "other"


def _calls_by_package(files: list[Path], requests: int) -> tuple[int, list[tuple[str, int]]]:
    """Python calls per request in all of ``files`` (pstats), and per package, most first."""
    by_package: collections.Counter[str] = collections.Counter()
    for f in files:
        for (filename, _line, _name), (_cc, calls, _tt, _ct, _callers) in pstats.Stats(str(f)).stats.items():  # type: ignore[attr-defined]
            by_package[_package(filename)] += calls
    total = sum(by_package.values())
    return round(total / requests), [(name, round(n / requests)) for name, n in by_package.most_common()]


def _profile_load(stack: Stack, target: Target, count: int, directory: Path) -> None:
    daemons = [p for p in (*stack.kasds, *stack.agentds) if p is not None and p.proc is not None]
    for p in daemons:
        p.proc.send_signal(signal.SIGUSR2)  # type: ignore[union-attr]
    time.sleep(0.5)  # the handlers run at the daemons' next bytecode; a load of seconds dwarfs this
    target.load(SMALL, 1, count)
    for p in daemons:
        p.proc.send_signal(signal.SIGUSR2)  # type: ignore[union-attr]
    time.sleep(2.0)  # the dumps
    print(f"Python calls per request under cProfile (c1, {count} requests through the tunnel):")
    for p in daemons:
        files = sorted(directory.glob(f"*-{p.proc.pid}-*.prof"))  # type: ignore[union-attr]
        if not files:
            print(f"  {p.name}: no profile written")
            continue
        total, packages = _calls_by_package(files, count)
        print(f"  {p.name}: {total} calls per request: " + ", ".join(f"{name} {n}" for name, n in packages[:14] if n))


def _row(name: str, result: LoadResult) -> str:
    return (
        f"  {name:<8} p50 {result.percentile(50) * 1e3:7.2f} ms   p99 {result.percentile(99) * 1e3:7.2f} ms"
        f"   {result.rps:8.0f} req/s"
    )


class RelayChain:
    """client → relay → relay → kubesim: two ``bench/relay.py`` processes, as kasd and agentd sit."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, stack: Stack, sim_host: str, sim_port: int, sim_ca: bytes) -> int:
        cert = stack.ca.issue_cert("127.0.0.1", "localhost")
        (stack.dir / "relay-cert.pem").write_bytes(b"".join(c.bytes() for c in cert.cert_chain_pems))
        (stack.dir / "relay-key.pem").write_bytes(cert.private_key_pem.bytes())
        (stack.dir / "relay-ca.pem").write_bytes(stack.ca.cert_pem.bytes())
        (stack.dir / "sim-ca.pem").write_bytes(sim_ca)
        port = self._one(stack.dir, f"{sim_host}:{sim_port}", stack.dir / "sim-ca.pem")  # the "agentd"
        return self._one(stack.dir, f"127.0.0.1:{port}", stack.dir / "relay-ca.pem")  # the "kasd"

    def _one(self, workdir: Path, upstream: str, upstream_ca: Path) -> int:
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("relay.py")), "--cert", str(workdir / "relay-cert.pem"),
             "--key", str(workdir / "relay-key.pem"), "--upstream", upstream, "--upstream-ca", str(upstream_ca)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.processes.append(process)
        assert process.stdout is not None
        line = process.stdout.readline()  # "listening on 127.0.0.1:PORT", or "" if it died
        if not line.startswith("listening on "):
            raise RuntimeError(f"bench/relay.py did not start (exit code {process.poll()})")
        return int(line.rsplit(":", 1)[1])

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests (noisier figures)")
    parser.add_argument("--bulk-mib", type=int, default=64, help="size of the bulk list in MiB (default 64)")
    parser.add_argument("--profile", action="store_true",
                        help="then one more c1 tunnel load with kasd and agentd under cProfile: calls per request")
    args = parser.parse_args()
    n1, n64, bulk_rounds = (200, 1000, 2) if args.quick else (1000, 6400, 4)

    print(f"machine: {describe_machine()}")
    workdir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    profile_dir = workdir / "profiles"
    if args.profile:
        profile_dir.mkdir()
        os.environ["BENCH_PROFILE_DIR"] = str(profile_dir)
    stack = Stack(workdir / "stack", python=_profiled_python(workdir)) if args.profile else Stack(workdir / "stack")
    stack.start()
    tunnel: ReverseTunnel | None = None
    relays = RelayChain()
    try:
        cluster = yaml.safe_load((stack.dir / "cluster.kubeconfig").read_text())["clusters"][0]["cluster"]
        sim_ctx = _context(base64.b64decode(cluster["certificate-authority-data"]))
        sim_host, sim_port = cluster["server"].removeprefix("https://").rsplit(":", 1)
        kas_host, kas_port = stack.addresses["kubernetes_api"].rsplit(":", 1)
        _seed(cluster["server"], sim_ctx, stack.cluster_token, args.bulk_mib)

        targets = [
            Target("direct", sim_host, int(sim_port), sim_ctx, stack.cluster_token),
            Target("tunnel", kas_host, int(kas_port), _context(stack.ca.cert_pem.bytes()), stack.ci_token),
        ]
        reason = ReverseTunnel.unavailable_reason()
        if reason is None:
            tunnel = ReverseTunnel.start(int(sim_port))
            targets.append(Target("ssh -R", "127.0.0.1", tunnel.port, sim_ctx, stack.cluster_token))
        else:
            print(f"ssh -R baseline skipped: {reason}")

        relay_port = relays.start(stack, sim_host, int(sim_port), base64.b64decode(cluster["certificate-authority-data"]))
        relay = Target("relay", "127.0.0.1", relay_port, _context(stack.ca.cert_pem.bytes()), stack.cluster_token)

        results: dict[tuple[str, str], LoadResult] = {}
        for concurrency, count in ((1, n1), (64, n64)):
            print(f"small GET ({SMALL}), concurrency {concurrency}, {count} requests:", flush=True)
            for t in targets + ([relay] if concurrency == 1 else []):
                daemons = [p for p in (*stack.kasds, *stack.agentds, stack.kubesim) if p is not None]
                before = [_cpu_seconds(p) for p in daemons]
                results[(t.name, f"c{concurrency}")] = r = t.load(SMALL, concurrency, count)
                print(_row(t.name, r), flush=True)
                if t.name == "tunnel":
                    cpu = [(_cpu_seconds(p) - b) / count * 1e3 for p, b in zip(daemons, before, strict=True)]
                    print("    CPU per request (/proc): " + ", ".join(
                        f"{p.name} {ms:.3f} ms" for p, ms in zip(daemons, cpu, strict=True)), flush=True)
        print(f"bulk GET of a {args.bulk_mib} MiB list, {bulk_rounds} rounds, 1 connection:", flush=True)
        for t in targets:
            started = time.perf_counter()
            r = t.load(BULK, 1, bulk_rounds)
            results[(t.name, "bulk")] = r
            print(f"  {t.name:<8} {r.mb_per_s:8.1f} MB/s  ({r.body_bytes / 2**20:.0f} MiB in {time.perf_counter() - started:.1f} s)", flush=True)

        d1, t1 = results[("direct", "c1")], results[("tunnel", "c1")]
        print("ratios:")
        print(f"  added p50 latency, concurrency 1: {(t1.percentile(50) - d1.percentile(50)) * 1e3:+.2f} ms (target ≤ 1 ms)")
        floor = results[("relay", "c1")].percentile(50) - d1.percentile(50)
        print(f"    two bare TLS relays in its place add: {floor * 1e3:+.2f} ms (processes, wake-ups, TLS: the floor)")
        rps = results[("tunnel", "c64")].rps / results[("direct", "c64")].rps
        print(f"  requests/s at concurrency 64: {rps:.2f} × direct (target ≥ 0.5)")
        bulk_direct = results[("tunnel", "bulk")].mb_per_s / results[("direct", "bulk")].mb_per_s
        print(f"  bulk: {bulk_direct:.2f} × direct")
        if ("ssh -R", "bulk") in results:
            ratio = results[("tunnel", "bulk")].mb_per_s / results[("ssh -R", "bulk")].mb_per_s
            print(f"  bulk: {ratio:.2f} × ssh -R (target ≥ 1.0)")
            print(f"  requests/s at concurrency 64 vs ssh -R: {results[('tunnel', 'c64')].rps / results[('ssh -R', 'c64')].rps:.2f}")
        if args.profile:
            _profile_load(stack, targets[1], n1, profile_dir)
    finally:
        relays.stop()
        if tunnel is not None:
            tunnel.close()
        stack.stop()


if __name__ == "__main__":
    main()
