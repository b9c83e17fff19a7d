"""bench/hostile.py stays runnable: every attack, tiny, against a real stack. Figures are not judged
here (they belong in docs/benchmarks.md); only that each attack ran and reported them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kasctl.stack import find_kubectl

HOSTILE = Path(__file__).resolve().parent.parent / "bench" / "hostile.py"

TINY = ["--connections", "2", "--seconds", "0.5", "--settle", "0.2", "--baseline-seconds", "0.5",
        "--flood-cap", "10", "--continuation-mib", "0.1", "--partial-mib", "0.1", "--agent-wait", "1",
        "--max-pairs", "640", "--regex-requests", "5", "--requests", "10", "--no-fresh", "--json"]  # fmt: skip


pytestmark = pytest.mark.e2e  # a whole stack, as processes


@pytest.mark.skipif(find_kubectl() is None, reason="the legitimate client is real kubectl")
def test_every_attack_runs_and_reports_its_figures() -> None:
    bench = subprocess.Popen([sys.executable, str(HOSTILE), *TINY], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)  # fmt: skip
    try:
        stdout, stderr = bench.communicate(timeout=100)
    finally:
        if bench.poll() is None:
            bench.terminate()  # the bench stops its stack on SIGTERM; a SIGKILL would leave it running
            stdout, stderr = bench.communicate(timeout=40)
    assert bench.returncode == 0, stderr[-4000:]
    rows = json.loads(stdout)["rows"]
    cases = {(row["attack"], row["case"]) for row in rows}
    assert [row["attack"] for row in rows].count("memory") == 6, cases  # 3 cases × 2 ports
    assert {case for attack, case in cases if attack == "rapid-reset"} == {"proxy TLS, no token", "proxy TLS, valid token"}
    assert {case for attack, case in cases if attack == "tunnel-limit"} == {
        "17 KiB path", "17 KiB header value", "300 headers"}  # fmt: skip
    assert [row["attack"] for row in rows].count("flood") == 2, cases
    assert [row["attack"] for row in rows].count("regex") == 1, cases
    assert {case for attack, case in cases if attack == "strange-id"} == {"ci:²:x and 5,000 digits"}
    assert {case for attack, case in cases if attack == "yaml-bomb"} == {"639-byte template, SIGHUP"}
    for row in rows:
        assert "error" not in row["figures"], row
        assert isinstance(row["met"], bool), row
    by = {(row["attack"], row["case"]): row["figures"] for row in rows}
    assert all(f["connections"] == 2 and f["peak_rss"] > 0 for (a, _), f in by.items() if a == "memory")
    assert all(f["pairs"] > 0 for (a, _), f in by.items() if a == "rapid-reset")
    assert all(f["status"] >= 400 for (a, _), f in by.items() if a == "tunnel-limit")  # answered, not 200
    assert all(f["opened"] == 10 or f["refused"] for (a, _), f in by.items() if a == "flood")
    assert all(f["requests"] == 10 and not f["dropped"] and not f["error_lines"]
               for (a, _), f in by.items() if a == "strange-id")
    assert all(f["requests"] == 5 and f["answer"].startswith("403") for (a, _), f in by.items() if a == "regex")
    assert all(f["refused"] and f["restored"] and not f["readiness_failures"]
               for (a, _), f in by.items() if a == "yaml-bomb")
    assert [f["connections"] for (a, _), f in by.items() if a == "close-notify"] == [2]
