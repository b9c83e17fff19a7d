#!/usr/bin/env python3
"""The CPU the kasd-to-kasd hop adds to a small GET, in one process (issue 30, "the hop").

    PYTHONPATH=. python bench/hop_cpu.py            # 300 GETs per round, 4 rounds, ~30 s
    PYTHONPATH=. python bench/hop_cpu.py 1000 --rounds 6
    PYTHONPATH=. python bench/hop_cpu.py --profile  # where the added CPU goes, by package

Two kasd runtimes (real sockets, the real private listener and peer sessions over HTTP/2) and a
fake agent on the first, all in one Trio run (tests/kasd's helpers): the same keep-alive client
asks through the replica holding the tunnel ("same") and through the other ("hop"), rounds
alternated. Everything runs in this one process, so its CPU time per request is the whole cost
(both replicas, the agent, the client), and the difference is the hop's: a figure far less
disturbed by a busy machine than latency. Compare two commits by running this from each tree in
turn: PYTHONPATH names the tree whose code runs (this file imports the project's tests' helpers).

``--profile`` runs each side under cProfile instead and prints, per package, the time and the calls
per request the hop adds (cProfile slows Python calls several times over: read the shares and the
call counts, not the absolute times).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import logging
import pstats
import sys
import tempfile
import time
from pathlib import Path

import trio

# (run as ``python bench/hop_cpu.py`` without PYTHONPATH: this file's own tree, after whatever
# PYTHONPATH names, so that comparing two trees by PYTHONPATH still runs the named one)
sys.path.append(str(Path(__file__).resolve().parents[1]))

from tests.kasd.helpers import CI_TOKEN, H1Client, bearer, fake_agent
from tests.kasd.replicas_helpers import replica_config, running_replicas
from tests.routing.standins import MemoryWorld


async def _cpu_per_request(client: H1Client, n: int) -> float:
    started = time.process_time()
    for _ in range(n):
        await client.request("GET", "/api/v1/pods", [bearer(CI_TOKEN)])
        await client.response()
        await client.body()
        client.conn.start_next_cycle()
    return (time.process_time() - started) / n


_PACKAGES = ("h2trio/", "/h2/", "hpack/", "hyperframe/", "wire/", "routing/", "trio/", "logging/", "k8sproxy/",
             "tunnelhttp/", "netio/", "daemonkit/", "kasd/", "tests/", "h11/", "msgpack")


def _by_package(profile: cProfile.Profile) -> tuple[collections.Counter[str], collections.Counter[str]]:
    seconds: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    for (filename, _, _name), (_, ncalls, tottime, _, _) in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        package = next((p.strip("/") for p in _PACKAGES if p in filename), "builtins" if filename == "~" else "other")
        seconds[package] += tottime
        calls[package] += ncalls
    return seconds, calls


async def _profile(same: H1Client, hop: H1Client, n: int) -> None:
    got = {}
    for label, client in (("same", same), ("hop", hop)):
        profile = cProfile.Profile()
        profile.enable()
        await _cpu_per_request(client, n)
        profile.disable()
        got[label] = _by_package(profile)
    (s, s_calls), (h, h_calls) = got["same"], got["hop"]
    print(f"{'package':12} {'same µs':>9} {'hop µs':>9} {'added µs':>9} {'added calls':>12}  (per GET, under cProfile)")
    for package in sorted(set(s) | set(h), key=lambda p: s[p] - h[p]):
        print(f"{package:12} {s[package] / n * 1e6:9.0f} {h[package] / n * 1e6:9.0f} "
              f"{(h[package] - s[package]) / n * 1e6:+9.0f} {(h_calls[package] - s_calls[package]) / n:+12.0f}")


async def main(n: int, rounds: int, profile: bool) -> None:
    logging.disable(logging.INFO)  # the request lines cost the same with and without the hop
    with tempfile.TemporaryDirectory() as tmp:
        async with running_replicas(MemoryWorld(), [replica_config(Path(tmp))] * 2) as (a, b), fake_agent(a):
            same = await H1Client.connect(a.port("kubernetes_api"))
            hop = await H1Client.connect(b.port("kubernetes_api"))
            await _cpu_per_request(same, 100)
            await _cpu_per_request(hop, 100)
            if profile:
                await _profile(same, hop, n)
                rounds = 0
            added = []
            for _ in range(rounds):
                s = await _cpu_per_request(same, n)
                h = await _cpu_per_request(hop, n)
                added.append(h - s)
                print(f"same {s * 1e3:.3f} ms  hop {h * 1e3:.3f} ms  of CPU per GET: the hop adds {(h - s) * 1e3:+.3f} ms",
                      flush=True)
            if added:
                added.sort()
                print(f"hop adds (median of {rounds} rounds) {added[len(added) // 2] * 1e3:+.3f} ms of CPU per small GET")
            await same.aclose()
            await hop.aclose()


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("requests", nargs="?", type=int, default=300, help="small GETs per round and side (default 300)")
    parser.add_argument("--rounds", type=int, default=4, help="alternated rounds (default 4); the median is printed")
    parser.add_argument("--profile", action="store_true", help="one cProfile'd pass per side instead of timed rounds")
    args = parser.parse_args()
    if args.requests < 1 or args.rounds < 1:
        parser.error("requests and --rounds must be at least 1")
    return args


if __name__ == "__main__":
    arguments = _arguments()
    trio.run(main, arguments.requests, arguments.rounds, arguments.profile)
