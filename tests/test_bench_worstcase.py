"""bench/worstcase.py stays runnable: each figure, tiny. Figures are not judged here (they belong in
docs/benchmarks.md); only that each was measured."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import worstcase

from kubesim.protobuf import decode_protobuf_object


def test_the_tiny_containers_body_is_what_the_figure_says() -> None:
    pod = decode_protobuf_object(worstcase.tiny_containers_pod(3))
    assert pod["spec"]["containers"] == [{"name": "", "resources": {}}] * 3


def test_every_figure_is_measured() -> None:
    protobuf = worstcase.protobuf_figures(sizes=(64, 128), randoms=3)
    assert set(protobuf) == {"64 tiny containers: s", "64 tiny containers: µs per element", "128 tiny containers: s",
                             "128 tiny containers: µs per element", "slowest of 6 random bodies: ms"}
    regex = worstcase.regex_figures(texts=2, repeats=10)
    assert len(regex) == 3 + len(worstcase.CATASTROPHIC)
    assert all(value >= 0 for value in [*protobuf.values(), *regex.values()])
