#!/usr/bin/env python3
"""Where a small GET's latency goes, hop by hop, through the tunnel at concurrency 1.

    python bench/hops.py                # 2000 GETs, ~30 s
    python bench/hops.py --requests 500

Starts the demo stack with kasd and agentd under a tracer that timestamps (CLOCK_MONOTONIC, shared
by all processes) every socket send and every receive as it returns, then pairs each request's
events across the two daemons and prints, per hop, the p10/p50/p90 of:

  kasd req      the client's request received → its stream sent to agentd
  wire kasd→a   kasd's send → agentd's receive (kernel, wake-up, scheduling)
  agentd req    the stream received → the request sent to the API server
  upstream      the request sent → the answer received (kubesim and its two wires)
  agentd resp   the answer received → sent back on the tunnel
  wire a→kasd   agentd's send → kasd's receive
  kasd resp     the answer received from the tunnel → sent to the client

Each daemon's hops are time on its critical path: the sum of them is what the tunnel adds. The
tracer costs a few microseconds per event, so absolute figures are a little high.
"""

from __future__ import annotations

import argparse
import atexit
import bisect
import os
import runpy
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HOPS = ("kasd req", "wire kasd→a", "agentd req", "upstream", "agentd resp", "wire a→kasd", "kasd resp")


def _trace(module: str, out: Path) -> None:
    """Run ``module`` (a daemon) with its socket sends and receives timestamped into ``out``."""
    from netio import fastio

    events: list[tuple[int, str, int, int]] = []
    ports: dict[int, tuple[int, int]] = {}
    now = time.perf_counter_ns

    def ends(sock: object) -> tuple[int, int]:
        fd = sock.fileno()  # type: ignore[attr-defined]
        if fd not in ports:
            try:
                ports[fd] = (sock.getsockname()[1], sock.getpeername()[1])  # type: ignore[attr-defined]
            except OSError:
                ports[fd] = (0, 0)
        return ports[fd]

    send_many = fastio.FastSocketStream.send_many
    receive_some = fastio.FastSocketStream.receive_some

    async def traced_send(self: fastio.FastSocketStream, buffers: object) -> None:
        events.append((now(), "S", *ends(self.socket)))
        await send_many(self, buffers)  # type: ignore[arg-type]

    async def traced_receive(self: fastio.FastSocketStream, max_bytes: int | None = None) -> bytes:
        data = await receive_some(self, max_bytes)
        events.append((now(), "R", *ends(self.socket)))
        return data

    fastio.FastSocketStream.send_many = traced_send  # type: ignore[method-assign]
    fastio.FastSocketStream.receive_some = traced_receive  # type: ignore[method-assign]

    def dump() -> None:
        out.write_text("".join(f"{t} {op} {local} {peer}\n" for t, op, local, peer in events))

    atexit.register(dump)
    sys.argv = [module, *sys.argv[4:]]
    runpy.run_module(module, run_name="__main__")


def _load(path: Path) -> list[tuple[int, str, int, int]]:
    rows = (line.split() for line in path.read_text().splitlines())
    return [(int(t), op, int(local), int(peer)) for t, op, local, peer in rows]


def _cycles(events: list[tuple[int, str, int, int]], inside: object, outside: object) -> list[list[int]]:
    """[received from inside, sent outside, received from outside, sent inside] per request."""
    out: list[list[int]] = []
    state: list[int] = []
    want = (("R", inside), ("S", outside), ("R", outside), ("S", inside))
    for t, op, local, peer in events:
        if state == [] and op == "R" and inside(local, peer):  # type: ignore[operator]
            state = [t]
        elif state and op == want[len(state)][0] and want[len(state)][1](local, peer):  # type: ignore[operator]
            state.append(t)
            if len(state) == 4:
                out.append(state)
                state = []
    return out


def hops(kasd: Path, agentd: Path, *, proxy: int, agent: int, cluster: int) -> list[dict[str, int]]:
    k = _cycles(_load(kasd), lambda local, peer: local == proxy, lambda local, peer: local == agent)
    a = _cycles(_load(agentd), lambda local, peer: peer == agent, lambda local, peer: peer == cluster)
    starts = [c[0] for c in a]
    rows = []
    for kc in k:
        i = bisect.bisect_left(starts, kc[1])
        if i < len(a) and a[i][3] <= kc[2]:
            ac = a[i]
            rows.append(dict(zip(HOPS, (kc[1] - kc[0], ac[0] - kc[1], ac[1] - ac[0], ac[2] - ac[1],
                                         ac[3] - ac[2], kc[2] - ac[3], kc[3] - kc[2]), strict=True)))
    return rows[len(rows) // 10:]  # the first tenth warms up


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--trace":
        _trace(sys.argv[2], Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="small GETs to send (default 2000)")
    args = parser.parse_args()

    import base64

    import yaml
    from e2e import SMALL, Target, _context, _seed

    from kasctl.stack import Stack

    work = Path(tempfile.mkdtemp(prefix="kasd-hops-"))

    class TracedStack(Stack):
        def _python(self, module: str, *argv: str) -> list[str]:
            if module in ("kasd", "agentd"):
                return [self.python, __file__, "--trace", module, str(work / f"{module}.trace"), *argv]
            return super()._python(module, *argv)

    stack = TracedStack(work / "stack")
    print(f"starting the demo stack (traced) in {work} …", flush=True)
    stack.start()
    try:
        cluster = yaml.safe_load((stack.dir / "cluster.kubeconfig").read_text())["clusters"][0]["cluster"]
        _seed(cluster["server"], _context(base64.b64decode(cluster["certificate-authority-data"])),
              stack.cluster_token, 0)
        host, port = stack.addresses["kubernetes_api"].rsplit(":", 1)
        tunnel = Target("tunnel", host, int(port), _context(stack.ca.cert_pem.bytes()), stack.ci_token)
        print(f"{args.requests} small GETs through the tunnel at concurrency 1 …", flush=True)
        result = tunnel.load(SMALL, 1, args.requests)
    finally:
        stack.stop()
    rows = hops(work / "kasd.trace", work / "agentd.trace", proxy=int(port),
                agent=int(stack.addresses["agent"].rsplit(":", 1)[1]),
                cluster=int(stack.cluster_url.rsplit(":", 1)[1]))
    if not rows:
        sys.exit("no request could be followed through both daemons (were they traced?)")
    print(f"tunnel p50 {result.percentile(50) * 1e3:.2f} ms (traced); {len(rows)} requests followed")
    print(f"{'hop':14} {'p10':>7} {'p50':>7} {'p90':>7}  µs")
    medians = {}
    for hop in HOPS:
        values = sorted(row[hop] for row in rows)
        medians[hop] = values[len(values) // 2] / 1e3
        print(f"{hop:14} " + " ".join(f"{values[int(len(values) * q)] / 1e3:7.0f}" for q in (0.1, 0.5, 0.9)))
    daemons = sum(v for h, v in medians.items() if h.startswith(("kasd", "agentd")))
    wires = medians["wire kasd→a"] + medians["wire a→kasd"]
    print(f"sum of medians: daemons {daemons:.0f} µs, wires between them {wires:.0f} µs")
    if not os.environ.get("KEEP_TRACES"):
        for trace in work.glob("*.trace"):
            trace.unlink()


if __name__ == "__main__":
    main()
