"""bench/cluster.py's scaling sections run as their --help says and print their figures."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.e2e  # kubesim, kasd, agentd, and the bench's own agent sessions and watches
@pytest.mark.timeout(120)
def test_the_agents_and_watches_sections_print_their_figures() -> None:
    result = subprocess.run(
        [sys.executable, "bench/cluster.py", "--quick", "--only", "agents", "--agents", "1,3", "--requests", "64",
         "--only", "watches", "--watches", "4"],
        capture_output=True, text=True, timeout=110, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # every agent count measured with that many sessions on kasd, as a ratio to direct and to one agent
    assert re.search(r"^\s+1 agents \(1 sessions\)\s+\d+ req/s\s+[\d.]+ × direct$", out, re.MULTILINE), out
    assert re.search(r"^\s+3 agents \(3 sessions\)\s+\d+ req/s\s+[\d.]+ × direct$", out, re.MULTILINE), out
    assert re.search(r"ratio to the fewest agents: 1: 1\.00\s+3: [\d.]+$", out, re.MULTILINE), out
    # each of 5 writes (--quick) seen by all 4 watches, direct and through the tunnel
    assert re.search(r"direct\s+write → watcher: p50 .* \(20 events seen\)", out), out
    assert re.search(r"tunnel\s+write → watcher: p50 .* \(20 events seen\)", out), out
    assert re.search(r"tunnel ÷ direct: p50 [\d.]+×\s+p99 [\d.]+×", out), out
    assert re.search(r"kasd RSS .* KiB per watch", out) and re.search(r"agentd RSS .* KiB per watch", out), out


def test_bad_counts_are_refused_with_a_message() -> None:
    for bad in (["--agents", "1,x"], ["--watches", "0"]):
        result = subprocess.run([sys.executable, "bench/cluster.py", *bad],
                                capture_output=True, text=True, timeout=30, cwd=REPO)
        assert result.returncode == 2 and "--agents" in result.stderr, (bad, result.stderr)
