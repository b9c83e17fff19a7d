"""bench/hops.py's analysis: requests followed across kasd's and agentd's socket traces."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import hops

PROXY, AGENT, CLUSTER = 8154, 8150, 6443


def test_each_request_is_followed_through_both_daemons(tmp_path: Path) -> None:
    kasd, agentd = [], []
    for i in range(20):
        t = i * 10_000_000  # one request every 10 ms, each hop a different length (ns)
        kasd += [f"{t} R {PROXY} 50001", f"{t + 1000} S {AGENT} 40000",  # from the client, to agentd
                 f"{t + 9000} R {AGENT} 40000", f"{t + 9700} S {PROXY} 50001"]
        agentd += [f"{t + 1100} R 40000 {AGENT}", f"{t + 1400} S 50100 {CLUSTER}",
                   f"{t + 8000} R 50100 {CLUSTER}", f"{t + 8950} S 40000 {AGENT}",
                   f"{t + 8960} S 40000 {AGENT}"]  # (a window update: not a hop)
    (tmp_path / "kasd.trace").write_text("\n".join(kasd) + "\n")
    (tmp_path / "agentd.trace").write_text("\n".join(agentd) + "\n")
    rows = hops.hops(tmp_path / "kasd.trace", tmp_path / "agentd.trace", proxy=PROXY, agent=AGENT, cluster=CLUSTER)
    assert len(rows) == 18  # the first tenth is warm-up
    assert rows[0] == {"kasd req": 1000, "wire kasd→a": 100, "agentd req": 300, "upstream": 6600,
                       "agentd resp": 950, "wire a→kasd": 50, "kasd resp": 700}
