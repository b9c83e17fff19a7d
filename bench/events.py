#!/usr/bin/env python3
"""Events pushed to agents: delivery latency and throughput (docs/benchmarks.md, "Events").

    python bench/events.py                  # 200 events each way, 1000 for throughput, ~1 min
    python bench/events.py --events 50 --burst 200

First a lone kasd (its SQLite store, no Redis), kubesim and one agentd; then two kasd replicas
sharing a Redis, kubesim, and one agentd (one tunnel, on its home replica). agentd's events handler
POSTs each event to an in-cluster target: a loopback HTTP server in this process that notes when
each event arrived. Prints, never asserts:

  lone kasd     latency from kasd taking the POST (the event's posted_at) to the target getting it,
                a single kasd with its SQLite store, events POSTed one at a time (p50, p99)
  one replica   latency from kasd taking the POST (the event's posted_at) to the target getting it,
                events POSTed to the replica holding the tunnel, one at a time (p50, p99)
  across a hop  the same, POSTed to the replica that does not hold the tunnel (its store notice
                wakes the holder's deliverer; the lease stays there)
  throughput    events/s from the first POST to the last arrival, ``--burst`` events from 8 threads
                POSTing to both replicas
  baseline      the same loopback POST to the target straight from this process (what the
                webhook's own HTTP costs), p50/p99, and each latency's ratio to it

Targets (issue 28): ≤ 10 ms p99 on one replica, ≤ 20 ms across a hop.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kasctl.restclient import opener
from kasctl.stack import Stack


class Target:
    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.changed = threading.Condition()
        target = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                now = time.time()
                event_id = json.loads(body).get("id", "")
                with target.changed:
                    target.arrived.setdefault(event_id, now)
                    target.changed.notify_all()
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, ids: list[str], timeout: float = 60.0) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: all(i in self.arrived for i in ids), timeout=timeout)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


class Poster:
    """POSTs events to one replica on one kept-alive connection per thread."""

    def __init__(self, stack: Stack, replica: int) -> None:
        self.url = f"https://{stack.replica_addresses[replica]['api']}/api/v4/agents/1/events"
        self.token = stack.personal_token
        self.open = opener(Path(stack.ca_file).read_bytes()).open

    def post(self, event_id: str) -> float:
        """kasd's posted_at of the event."""
        body = json.dumps({"type": "push", "payload": {"ref": "main"}, "id": event_id}).encode()
        request = urllib.request.Request(self.url, data=body, method="POST", headers={
            "PRIVATE-TOKEN": self.token, "Content-Type": "application/json"})
        with self.open(request, timeout=30) as answer:
            return float(json.loads(answer.read())["posted_at"])


def latencies(target: Target, poster: Poster, prefix: str, count: int) -> list[float]:
    found = []
    for n in range(count + count // 10):  # the first tenth warms up
        event_id = f"{prefix}-{n}"
        posted = poster.post(event_id)
        if not target.wait([event_id], 30):
            raise SystemExit(f"event {event_id} did not arrive within 30 s")
        if n >= count // 10:
            found.append((target.arrived[event_id] - posted) * 1000)
    return found


def baseline(target: Target, count: int) -> list[float]:
    found = []
    for n in range(count):
        body = json.dumps({"id": f"direct-{n}"}).encode()
        start = time.time()
        with urllib.request.urlopen(urllib.request.Request(target.url, data=body, method="POST"), timeout=10):
            pass
        found.append((target.arrived[f"direct-{n}"] - start) * 1000)
    return found


def holder(stack: Stack) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for replica in range(stack.replicas):
            url = f"http://{stack.replica_addresses[replica]['observability']}/metrics"
            with urllib.request.urlopen(url, timeout=5) as answer:
                for line in answer.read().decode().splitlines():
                    if line.startswith("kasd_agent_sessions ") and float(line.split()[1]) > 0:
                        return replica
        time.sleep(0.1)
    raise SystemExit("no replica holds agentd's tunnel")


def start_stack(tmp: Path, name: str, target: Target, replicas: int) -> Stack:
    secret = tmp / "hook-secret"
    secret.write_text("bench-secret")
    stack = Stack(tmp / name, replicas=replicas, agentd_connections=1, heartbeat_interval=0.3,
                  agentd_settings={"events": {"handlers": [
                      {"type": "push", "webhook": {"url": target.url, "secret_file": str(secret)}}]}})
    stack.start()
    return stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200, help="events per latency run (default 200)")
    parser.add_argument("--burst", type=int, default=1000, help="events in the throughput run (default 1000)")
    args = parser.parse_args()
    target = Target()
    with tempfile.TemporaryDirectory(prefix="bench-events-") as tmp:
        stack = start_stack(Path(tmp), "lone", target, 1)
        try:
            holder(stack)
            direct = baseline(target, args.events)
            lone = latencies(target, Poster(stack, 0), "lone", args.events)
        finally:
            stack.stop()
        stack = start_stack(Path(tmp), "replicas", target, 2)
        try:
            home = holder(stack)
            one = latencies(target, Poster(stack, home), "one", args.events)
            hop = latencies(target, Poster(stack, 1 - home), "hop", args.events)
            posters = [Poster(stack, 0), Poster(stack, 1)]
            ids = [f"burst-{n}" for n in range(args.burst)]
            start = time.time()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda n: posters[n % 2].post(ids[n]), range(args.burst)))
            posted = time.time() - start
            arrived = target.wait(ids, 120)
            elapsed = max(target.arrived[i] for i in ids if i in target.arrived) - start
        finally:
            stack.stop()
    base50, base99 = percentile(direct, 50), percentile(direct, 99)
    print(f"events: {args.events} per latency run (after {args.events // 10} to warm up), burst {args.burst}")
    print(f"  baseline      p50 {base50:7.2f} ms  p99 {base99:7.2f} ms  (loopback POST to the target)")
    for name, values, goal in (("lone kasd", lone, 10.0), ("one replica", one, 10.0), ("across a hop", hop, 20.0)):
        p50, p99 = percentile(values, 50), percentile(values, 99)
        print(f"  {name:13} p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  mean {statistics.fmean(values):6.2f} ms  "
              f"(×{p50 / base50:.1f} / ×{p99 / base99:.1f} the baseline; target p99 ≤ {goal:g} ms)")
    print(f"  throughput    {args.burst / elapsed:7.0f} events/s delivered ({args.burst / posted:.0f}/s posted; "
          f"{'all arrived' if arrived else 'NOT all arrived within 120 s'})")


if __name__ == "__main__":
    main()
