"""The consistent-hash ring over live kasd replicas: ketama, point for point nginx's
``hash $key consistent`` (``ngx_http_upstream_init_chash`` in ngx_http_upstream_hash_module.c), so
kasd computes the very replica a front end's nginx picks for an agent (docs/routing.md).

For each member named ``"host:port"`` (exactly the ``server`` string of nginx's upstream block):
``base = crc32(host + "\\0" + port)``; ``prev = 0``; ``160 * weight`` points, each
``h = crc32(prev as 4 little-endian bytes, continuing from base)``, then ``prev = h``. Points are
sorted by hash (stable: of equal hashes the first made stays first, as nginx's sort leaves them). A
key (the agent id as decimal text, nginx's ``$kasd_agent``) maps to the first point whose hash is
``>= crc32(key)``, wrapping to the first point.

Why ketama and not rendezvous: a front end must agree with kasd about the home, and nginx (the most
common front end) implements exactly this ring. Weight 10 per replica by default (1,600 points): keys
spread within about ±6 % at 50 replicas.

May import: the standard library only.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Mapping

#: points per unit of weight (nginx's constant)
POINTS_PER_WEIGHT = 160
#: kasd's default ``routing.weight`` (nginx's default is 1: write ``weight=10`` in its upstream)
DEFAULT_WEIGHT = 10


def _split(name: str) -> tuple[bytes, bytes]:
    """nginx's host/port split: the digits after the last ':' are the port (none: no port)."""
    raw = name.encode()
    if raw[:5].lower() == b"unix:":
        return raw[5:], b""
    for j in range(len(raw)):
        c = raw[len(raw) - j - 1]
        if c == ord(":"):
            return raw[: len(raw) - j - 1], raw[len(raw) - j:]
        if not ord("0") <= c <= ord("9"):
            break
    return raw, b""


def member_points(name: str, weight: int) -> list[int]:
    """The ring points of one member, in the order nginx makes them."""
    host, port = _split(name)
    base = zlib.crc32(host + b"\0" + port)
    points = []
    prev = 0
    for _ in range(POINTS_PER_WEIGHT * weight):
        prev = zlib.crc32(prev.to_bytes(4, "little"), base)
        points.append(prev)
    return points


def key_hash(key: str) -> int:
    return zlib.crc32(key.encode())


class Ring:
    """An immutable ring; build a new one when the members change (it is cheap: 1,600 points each)."""

    def __init__(self, members: Mapping[str, int]) -> None:
        for name, weight in members.items():
            if not isinstance(weight, int) or weight < 1:
                raise ValueError(f"ring member {name!r}: weight must be an integer >= 1, got {weight!r}")
        self.members: Mapping[str, int] = dict(sorted(members.items()))
        points: list[tuple[int, int, str]] = []
        order = 0
        # nginx makes points in upstream order and sorts them with a stable sort on the hash alone;
        # equal hashes are rare (2^-32 per pair), and the tie only decides which of two points
        # comes first. Names sorted here: both sides list the same set.
        for name, weight in self.members.items():
            for point in member_points(name, weight):
                points.append((point, order, name))
                order += 1
        points.sort()
        self._hashes = [p[0] for p in points]
        self._names = [p[2] for p in points]

    def __len__(self) -> int:
        return len(self.members)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ring) and self.members == other.members

    def __hash__(self) -> int:
        return hash(tuple(self.members.items()))

    def __repr__(self) -> str:
        return f"Ring({dict(self.members)!r})"

    def _start(self, key: str) -> int:
        index = bisect.bisect_left(self._hashes, key_hash(key))
        return 0 if index == len(self._hashes) else index

    def home(self, key: str) -> str | None:
        """The member ``key`` belongs to; None when the ring is empty."""
        if not self._names:
            return None
        return self._names[self._start(key)]

    def preference(self, key: str, n: int | None = None) -> list[str]:
        """Distinct members in ring order from ``key``'s home on (nginx's failover order);
        at most ``n``."""
        if not self._names:
            return []
        want = len(self.members) if n is None else min(n, len(self.members))
        found: list[str] = []
        seen: set[str] = set()
        start = self._start(key)
        total = len(self._names)
        for offset in range(total):
            name = self._names[(start + offset) % total]
            if name not in seen:
                seen.add(name)
                found.append(name)
                if len(found) >= want:
                    break
        return found


__all__ = ["DEFAULT_WEIGHT", "POINTS_PER_WEIGHT", "Ring", "key_hash", "member_points"]
