#!/usr/bin/env python3
"""What the parsers' worst-case inputs cost: the figures the tests used to assert against a clock.

    python bench/worstcase.py            # every figure, a few seconds
    python bench/worstcase.py --json

A test asserts what is true on any machine (the answer is right, the work is bounded by a count);
how long it took depends on the machine and on whoever else is using it, so the time is measured
here, beside a baseline from the same run, and written down in docs/benchmarks.md. Each figure is
this process's CPU time (``time.process_time``), so other work on a shared machine moves it less
than it moves the wall clock:

  protobuf   kubesim's protobuf decoder on 32 Ki, 64 Ki and 128 Ki empty containers in one Pod
             (2 bytes each): the time per element stays flat when the decoding is linear
             (tests/kubesim/test_protobuf.py checks the decoded value); and the slowest of
             --random random bodies of up to 2 KiB (the fuzz tests check they decode or are refused)
  regex      kasd's rules:if regexes (RE2): ``[a-z]{600}x`` against 20 distinct 1,024-character
             texts (each a real search), then one text 10,000 times (answered from memory), and
             each catastrophic-for-backtracking pattern against ``a`` × 1000 + ``!``; baseline:
             Python's ``re`` on the same long-repetition searches (tests/authz/test_regex.py checks
             the answers)
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

from kasd.authz.regex import compile_regex
from kubesim.protobuf import ProtobufDecodeError, decode_protobuf_object

MAGIC = b"k8s\x00"
CATASTROPHIC = (r"(a+)+$", r"(a|aa)*c", r"\d*\d*\d*\d*\d*\d*x", r"(.*a){12}")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _ld(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def tiny_containers_pod(count: int) -> bytes:
    """A protobuf Pod whose spec has ``count`` empty containers (2 bytes each on the wire)."""
    raw = _ld(2, _ld(2, b"") * count)
    return MAGIC + _ld(1, _ld(1, b"v1") + _ld(2, b"Pod")) + _ld(2, raw)


def _seconds(call: Callable[[], object], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        call()
        best = min(best, time.process_time() - started)
    return best


def protobuf_figures(sizes: tuple[int, ...] = (32 * 1024, 64 * 1024, 128 * 1024), randoms: int = 300) -> dict[str, float]:
    figures: dict[str, float] = {}
    for count in sizes:
        body = tiny_containers_pod(count)
        seconds = _seconds(lambda body=body: decode_protobuf_object(body))  # type: ignore[misc]
        figures[f"{count} tiny containers: s"] = seconds
        figures[f"{count} tiny containers: µs per element"] = seconds / count * 1e6
    rng = random.Random(26)
    slowest = 0.0
    for _ in range(randoms):
        data = rng.randbytes(rng.randrange(2049))
        for body in (data, MAGIC + data):
            started = time.process_time()
            try:
                decode_protobuf_object(body)
            except ProtobufDecodeError:
                pass
            slowest = max(slowest, time.process_time() - started)
    figures[f"slowest of {2 * randoms} random bodies: ms"] = slowest * 1e3
    return figures


def regex_figures(texts: int = 20, repeats: int = 10_000) -> dict[str, float]:
    import re

    figures: dict[str, float] = {}
    letters = "abcdefghijklmnopqrstuvwxyz"
    regex = compile_regex("[a-z]{600}x")
    started = time.process_time()
    for c in letters[:texts]:
        regex.search(c * 1024)
    figures[f"[a-z]{{600}}x, {texts} distinct texts: ms each"] = (time.process_time() - started) / texts * 1e3
    python = re.compile("[a-z]{600}x")
    started = time.process_time()
    for c in letters[:texts]:
        python.search(c * 1024)
    figures[f"baseline, Python re, the same {texts}: ms each"] = (time.process_time() - started) / texts * 1e3
    text = "q" * 1024
    regex.search(text)
    started = time.process_time()
    for _ in range(repeats):
        regex.search(text)
    figures[f"the same text {repeats} times: µs each"] = (time.process_time() - started) / repeats * 1e6
    for pattern in CATASTROPHIC:
        compiled = compile_regex(pattern)
        figures[f"{pattern} on a×1000+!: ms"] = _seconds(lambda c=compiled: c.search("a" * 1000 + "!"), 1) * 1e3  # type: ignore[misc]
    return figures


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--random", type=int, default=300, help="random protobuf bodies (each also behind the magic)")
    args = parser.parse_args(argv)
    figures = {"protobuf": protobuf_figures(randoms=args.random), "regex": regex_figures()}
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for group, rows in figures.items():
            print(f"== {group}")
            for name, value in rows.items():
                print(f"  {name:<48} {value:10.3f}")
    return figures


if __name__ == "__main__":
    main()
