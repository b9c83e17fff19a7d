#!/usr/bin/env python3
"""In-cluster services through the tunnel: a PromQL range query of a real Prometheus through kasd →
agentd → Prometheus against the same query asked of Prometheus directly, in one run.

    python bench/services.py               # 40 runs of each query
    python bench/services.py --runs 100 --step 0.005 --range 60

Real processes on 127.0.0.1 (``kasctl.stack``: kubesim, kasd with its API port over TLS, agentd
with ``services: [prometheus]``) and Debian's ``prometheus`` scraping kasd's ``/metrics`` every
second. After ``--warmup`` seconds of scrapes, each run asks ``/api/v1/query_range`` of every
series (``{__name__=~".+"}``) over the last ``--range`` seconds at ``--step`` seconds: many points,
a large JSON answer (its size is printed). Two ways, alternated run by run so both see the same
data and load:

direct   plain HTTP to Prometheus, a fresh connection each run;
tunnel   ``GET /api/v4/agents/1/services/prometheus/api/v1/query_range`` on kasd's API port (TLS,
         a personal token, a fresh connection each run), kasd → agentd over the tunnel;
kept     the same on one kept-alive TLS connection (no handshake per run).

Also a small instant query (``up``) both ways, to show the fixed cost apart from the transfer.
Prints p50/p99 and the ratio tunnel/direct; never asserts. The cores are shared by the client,
kasd, agentd, kubesim and Prometheus: compare the ratio, not absolute times, across machines.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml

from kasctl.stack import AGENT_NAME, CONFIG_PROJECT, DEMO_AGENT_CONFIG, Stack

SERVICES = """\
services:
  - name: prometheus
    user_access: {projects: [{id: group/demo}]}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fetch(url: str, headers: dict[str, str], context: ssl.SSLContext | None) -> int:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=60, context=context) as response:
        size = 0
        while chunk := response.read(256 * 1024):
            size += len(chunk)
    return size


class _KeptAlive:
    """One HTTPS connection to kasd kept across runs: the tunnel's cost without a TLS handshake."""

    def __init__(self, base: str, context: ssl.SSLContext, headers: dict[str, str]) -> None:
        parts = urllib.parse.urlsplit(base)
        self.prefix, self.headers = parts.path, headers
        self.conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, context=context, timeout=60)

    def fetch(self, query: str) -> int:
        self.conn.request("GET", self.prefix + query, headers=self.headers)
        response = self.conn.getresponse()
        size = 0
        while chunk := response.read(256 * 1024):
            size += len(chunk)
        return size


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _row(name: str, times: list[float]) -> str:
    return f"  {name:<7} p50 {_percentile(times, 50) * 1e3:8.2f} ms   p99 {_percentile(times, 99) * 1e3:8.2f} ms   " \
           f"mean {statistics.fmean(times) * 1e3:8.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40, help="runs of each query each way (default 40)")
    parser.add_argument("--range", type=float, default=30.0, help="seconds the range query covers (default 30)")
    parser.add_argument("--step", type=float, default=0.01, help="the range query's step in seconds (default 0.01)")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of scrapes before measuring (default 20)")
    args = parser.parse_args()
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        sys.exit("bench/services.py needs Debian's prometheus (apt-get install prometheus)")
    workdir = Path(tempfile.mkdtemp(prefix="kasd-bench-services-"))
    port = _free_port()
    stack = Stack(workdir / "stack", agentd_settings={"services": [
        {"name": "prometheus", "url": f"http://127.0.0.1:{port}", "paths": ["/api/v1/"]}]})
    stack.auth.agent_config(CONFIG_PROJECT, AGENT_NAME, DEMO_AGENT_CONFIG + SERVICES)
    prometheus: subprocess.Popen[bytes] | None = None
    try:
        stack.start()
        config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [
            {"job_name": "kasd", "static_configs": [{"targets": [stack.addresses["observability"]]}]}]}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        with (workdir / "prometheus.log").open("wb") as log:
            prometheus = subprocess.Popen(
                [prometheus_bin, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
        print(f"warming up: {args.warmup:g} s of scrapes …", flush=True)
        time.sleep(args.warmup)  # (a bench: data to query, not synchronisation)
        direct_base = f"http://127.0.0.1:{port}"
        tunnel_base = f"{stack.api_url}/api/v4/agents/1/services/prometheus"
        context = ssl.create_default_context(cafile=str(stack.ca_file))
        token = {"PRIVATE-TOKEN": stack.personal_token}
        end = time.time()
        range_query = "/api/v1/query_range?" + urllib.parse.urlencode({
            "query": '{__name__=~".+"}', "start": f"{end - args.range:.3f}", "end": f"{end:.3f}", "step": f"{args.step:g}"})
        instant_query = "/api/v1/query?" + urllib.parse.urlencode({"query": "up", "time": f"{end:.3f}"})
        with urllib.request.urlopen(direct_base + range_query, timeout=60) as response:
            answer = json.loads(response.read())
        points = sum(len(series["values"]) for series in answer["data"]["result"])
        size = _fetch(direct_base + range_query, {}, None)
        print(f"range query: {len(answer['data']['result'])} series, {points} points, {size / 1e6:.1f} MB of JSON")
        for name, query in (("range", range_query), ("instant", instant_query)):
            times: dict[str, list[float]] = {"direct": [], "tunnel": [], "kept": []}
            kept = _KeptAlive(tunnel_base, context, token)
            for _ in range(3):  # warm every path (connections, caches)
                _fetch(direct_base + query, {}, None)
                _fetch(tunnel_base + query, token, context)
                kept.fetch(query)
            for _ in range(args.runs):
                for way in ("direct", "tunnel", "kept"):
                    started = time.perf_counter()
                    if way == "direct":
                        _fetch(direct_base + query, {}, None)
                    elif way == "tunnel":
                        _fetch(tunnel_base + query, token, context)
                    else:
                        kept.fetch(query)
                    times[way].append(time.perf_counter() - started)
            kept.conn.close()
            print(f"{name} query, {args.runs} runs each way:")
            for way in ("direct", "tunnel", "kept"):
                print(_row(way, times[way]))
            ratio50 = _percentile(times["tunnel"], 50) / _percentile(times["direct"], 50)
            ratio99 = _percentile(times["tunnel"], 99) / _percentile(times["direct"], 99)
            added = (_percentile(times["tunnel"], 50) - _percentile(times["direct"], 50)) * 1e3
            print(f"  tunnel/direct: p50 {ratio50:.2f}×, p99 {ratio99:.2f}× (p50 {added:+.2f} ms)")
            kept50 = _percentile(times["kept"], 50) / _percentile(times["direct"], 50)
            kept_added = (_percentile(times["kept"], 50) - _percentile(times["direct"], 50)) * 1e3
            print(f"  kept/direct:   p50 {kept50:.2f}× (p50 {kept_added:+.2f} ms)")
            if name == "range":
                rate = size / _percentile(times["tunnel"], 50) / 1e6
                print(f"  through the tunnel at p50: {rate:.0f} MB/s")
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(10)
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
