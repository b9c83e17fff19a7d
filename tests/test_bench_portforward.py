"""bench/portforward.py runs as its --help says and prints a row per kubectl and transport, and the
kubectl cp rows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.e2e  # kubesim, kasd, agentd and each kubectl
@pytest.mark.timeout(120)
def test_the_bench_prints_direct_and_tunnel_figures_for_each_kubectl_and_transport() -> None:
    result = subprocess.run([sys.executable, "bench/portforward.py", "--mib", "1", "--rounds", "1", "--cp-mib", "1"],
                            capture_output=True, text=True, timeout=110, cwd=REPO)
    assert result.returncode == 0, result.stderr
    rows = re.findall(r"^\s+(\d+\.\d+)\s+(websocket|spdy)\s+[\d.]+ MiB/s\s+[\d.]+ MiB/s\s+[\d.]+×$",
                      result.stdout, re.MULTILINE)
    versions = {version for version, _ in rows}
    assert versions and len(rows) == 2 * len(versions), result.stdout
    assert {transport for _, transport in rows} == {"websocket", "spdy"}
    # kubectl cp of the 1 MiB file into the pod and back out, each checked, direct and tunnel
    assert "kubectl cp of a 1 MiB file into pod/pf-bench and back" in result.stdout
    for way in ("into", "out of"):
        assert re.search(rf"^\s+{way}\s+[\d.]+ MiB/s\s+[\d.]+ MiB/s\s+[\d.]+×$", result.stdout, re.MULTILINE), result.stdout


def test_bad_arguments_are_refused_with_a_message() -> None:
    result = subprocess.run([sys.executable, "bench/portforward.py", "--mib", "0"],
                            capture_output=True, text=True, timeout=30, cwd=REPO)
    assert result.returncode == 2 and "--mib and --rounds must be at least 1" in result.stderr
    result = subprocess.run([sys.executable, "bench/portforward.py", "--cp-mib", "4096"],
                            capture_output=True, text=True, timeout=30, cwd=REPO)
    assert result.returncode == 2 and "--cp-mib must be 0 to 2048" in result.stderr
