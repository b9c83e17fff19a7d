"""The ring: nginx's ketama point for point (a reference written independently, plus values checked
against a real nginx 1.22 — see test_nginx_front.py for the live check), keys spread evenly,
minimal movement when a member comes or goes, weights respected."""

from __future__ import annotations

import binascii
import functools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.ring import Ring

KEYS = [str(agent_id) for agent_id in range(1, 20_001)]


def _reference_points(server: str, weight: int) -> list[tuple[int, str]]:
    """nginx's ngx_http_upstream_init_chash, transcribed with binascii and an explicit
    pre/post-conditioned CRC (ngx_crc32_init / update / final) rather than zlib's continuation."""
    host, _, port = server.rpartition(":")

    def update(crc: int, data: bytes) -> int:  # ngx_crc32_update on a non-final value
        return binascii.crc32(data, crc ^ 0xFFFFFFFF) ^ 0xFFFFFFFF

    base = update(0xFFFFFFFF, host.encode() + b"\0" + port.encode())  # init, then update
    points = []
    prev = 0
    for _ in range(160 * weight):
        h = update(base, prev.to_bytes(4, "little")) ^ 0xFFFFFFFF  # final
        points.append((h, server))
        prev = h
    return points


def _reference_home(servers: dict[str, int], key: str) -> str:
    points = sorted((p for s, w in servers.items() for p in _reference_points(s, w)), key=lambda p: p[0])
    h = binascii.crc32(key.encode())
    for point, server in points:
        if point >= h:
            return server
    return points[0][1]


@functools.lru_cache(maxsize=64)
def _ring(n: int, weight: int = 10) -> Ring:
    return Ring({f"10.0.{i // 250}.{i % 250 + 1}:8154": weight for i in range(n)})


@functools.lru_cache(maxsize=64)
def _homes(n: int) -> tuple[str | None, ...]:
    ring = _ring(n)
    return tuple(ring.home(key) for key in KEYS)


def test_the_ring_is_nginx_ketama() -> None:
    servers = {"127.0.0.1:8154": 10, "127.0.0.1:8164": 10, "10.1.2.3:443": 3, "kasd-2.internal:8154": 1}
    ring = Ring(servers)
    for key in [str(i) for i in range(1, 300)] + ["", "agent", "99999999"]:
        assert ring.home(key) == _reference_home(servers, key), key


def test_homes_a_real_nginx_picked() -> None:
    # Read off nginx 1.22.1 (Debian 12) with `hash $arg_k consistent` over these four servers.
    ring = Ring({"127.0.0.1:19001": 10, "127.0.0.1:19002": 10, "127.0.0.1:19003": 7, "localhost:19004": 10})
    nginx = [19001, 19004, 19002, 19002, 19001, 19002, 19001, 19001, 19001, 19004, 19002, 19003,
             19004, 19002, 19002, 19001, 19001, 19003, 19002, 19002, 19004, 19002, 19002, 19002]
    assert [int(ring.home(str(k)).rsplit(":", 1)[1]) for k in range(1, 25)] == nginx  # type: ignore[union-attr]
    assert all(_reference_home(dict(ring.members), str(k)) == ring.home(str(k)) for k in range(1, 400))


@settings(max_examples=12, deadline=None)
@given(n=st.integers(min_value=3, max_value=50))
def test_keys_spread_within_ten_percent(n: int) -> None:
    counts = Counter(_homes(n))
    assert len(counts) == n
    fair = len(KEYS) / n
    worst = max(abs(c - fair) / fair for c in counts.values())
    # ±10 % needs enough keys per member for the sampling noise to stay small: 20,000 keys over at
    # most 50 members is 400 each (noise ~5 %), so the ring's own unevenness shows.
    assert worst <= 0.10 + 2.5 / fair**0.5, (n, worst)


@settings(max_examples=10, deadline=None)
@given(n=st.integers(min_value=3, max_value=40), data=st.data())
def test_a_member_coming_or_going_moves_only_its_keys(n: int, data: st.DataObject) -> None:
    before = _homes(n)
    after = _homes(n + 1)  # the (n+1)th member joins
    newcomer = f"10.0.{n // 250}.{n % 250 + 1}:8154"
    moved = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    # every key that moved, moved to the newcomer; nothing shuffles between the old members
    assert all(after[i] == newcomer for i in moved)
    share = len(moved) / len(KEYS)
    assert abs(share - 1 / (n + 1)) <= 0.35 / (n + 1) + 0.01, (n, share)
    # and when it leaves again, exactly those keys go back where they were
    assert _homes(n) == before


def test_weights_are_respected() -> None:
    ring = Ring({"a:1": 10, "b:1": 10, "c:1": 20})
    counts = Counter(ring.home(key) for key in KEYS)
    assert 1.7 <= counts["c:1"] / counts["a:1"] <= 2.3
    assert 0.85 <= counts["a:1"] / counts["b:1"] <= 1.15


def test_preference_is_every_member_once_in_ring_order_from_home() -> None:
    ring = _ring(5)
    for key in KEYS[:200]:
        order = ring.preference(key)
        assert order[0] == ring.home(key)
        assert sorted(order) == sorted(ring.members)
        assert ring.preference(key, 2) == order[:2]


def test_empty_and_bad_rings() -> None:
    assert Ring({}).home("1") is None and Ring({}).preference("1") == []
    with pytest.raises(ValueError, match="weight must be an integer >= 1"):
        Ring({"a:1": 0})
    assert Ring({"a:1": 10, "b:1": 5}) == Ring({"b:1": 5, "a:1": 10}) != Ring({"a:1": 10})
