"""When a tunnel slot dials next: agentd's reconnect schedule, sans-I/O (the time and the random
source are arguments; ``agentd.connection`` does the waiting).

**An outage** begins when a tunnel drops, or when a dial fails with no tunnel up (an agentd that
starts while kasd is away is in one too). While it is *young* — its first ``quick_window`` seconds
(60) — every wait is ``uniform(0, ceiling)`` with the ceiling doubling from ``base`` (1 s) to at most
``quick_cap`` (2 s): a dial is never more than 2 s away, so agentd is back within 2 s (and one
handshake) of kasd's return, and full jitter spreads a fleet's dials evenly over those 2 s instead
of in step. Every outage starts young, however soon it follows the last one. Past its first minute
the ceiling keeps doubling, from 2 s: 4, 8, 16, 32, then ``cap`` (60 s).

What keeps a kasd that is up but misbehaving from being hammered — those are not outages:

- kasd refusing the token (401/403, ``refused=True``): the rest of this outage doubles up to ``cap``.
- a kasd that accepts tunnels and drops them soon after, while never away, makes the slot
  *flapping*: a tunnel is *short* when it lived under ``stable_after`` (30 s) and its dial came
  without a failed one since the last drop (kasd took the slot straight back); once more than
  ``flap_allowance`` (3) short ones came in a row, the ceiling is no longer reset at a drop but
  keeps doubling to ``cap``, until a tunnel stays up ``stable_after``. Such a kasd gets at most
  ``flap_allowance`` + 1 quick handshakes per slot, then 2, 4, 8 … 60 s apart. A kasd that
  really goes away between tunnels (restarts, crash loops: the dials in between fail) is redialed
  quickly each time, however often: those dials cost it nothing while it is down, and the
  handshakes come no faster than it restarts.
- a drop with GOAWAY (kasd draining) is replaced at once, unless the slot is flapping.

Load while kasd is away: about one dial a second per tunnel slot (the mean of ``uniform(0, 2)``) for
at most the first minute of an outage, then half as many at each step. A dial that hangs counts
against ``dial_timeout`` in ``agentd.connection``, not here.
"""

from __future__ import annotations

import random

import attrs


@attrs.frozen(kw_only=True)
class Backoff:
    """The schedule's numbers: the first ceiling, the young outage's cap, the final cap (seconds)."""

    base: float = 1.0
    quick_cap: float = 2.0
    cap: float = 60.0


@attrs.define(kw_only=True)
class RedialSchedule:
    """One tunnel slot's schedule. Tell it what happened; it answers how long to wait before the next dial."""

    backoff: Backoff = attrs.field(factory=Backoff)
    #: seconds a tunnel must stay up to count as stable (not short)
    stable_after: float = 30.0
    #: seconds an outage is young (its waits capped at ``backoff.quick_cap``); 0: never
    quick_window: float = 60.0
    #: short tunnels in a row still treated as separate outages
    flap_allowance: int = 3
    _outage_since: float | None = attrs.field(default=None, init=False)
    _ceiling: float = attrs.field(default=0.0, init=False)
    _young: bool = attrs.field(default=True, init=False)
    _short: int = attrs.field(default=0, init=False)
    #: a dial failed since the last drop (kasd was away, not refusing)
    _seen_away: bool = attrs.field(default=False, init=False)
    #: the tunnel now up came after kasd was seen away
    _up_after_away: bool = attrs.field(default=False, init=False)

    @property
    def flapping(self) -> bool:
        return self._short > self.flap_allowance

    def tunnel_up(self) -> None:
        self._outage_since = None
        self._up_after_away, self._seen_away = self._seen_away, False

    def after_drop(self, now: float, up_for: float, rand: random.Random, *, goaway: bool = False) -> float:
        """A tunnel that was up ``up_for`` seconds ended (``goaway``: kasd asked it to): the wait before redialing."""
        if up_for >= self.stable_after:
            self._short = 0
        elif not self._up_after_away:
            self._short += 1
        self._up_after_away = False
        self._outage_since = now
        if self.flapping:
            self._young = False  # the ceiling goes on doubling from where it was
        else:
            self._young = True
            self._ceiling = 0.0  # a new outage: from the base again
            if goaway:
                return 0.0
        return self._wait(now, rand)

    def after_failure(self, now: float, rand: random.Random, *, refused: bool = False) -> float:
        """A dial failed (``refused``: kasd answered and refused the token): the wait before the next."""
        if self._outage_since is None:
            self._outage_since = now
        if refused:
            self._young = False
        else:
            self._seen_away = True
        return self._wait(now, rand)

    def _wait(self, now: float, rand: random.Random) -> float:
        assert self._outage_since is not None
        young = self._young and now - self._outage_since < self.quick_window
        limit = self.backoff.quick_cap if young else self.backoff.cap
        self._ceiling = min(limit, max(self.backoff.base, self._ceiling * 2))
        return rand.uniform(0.0, self._ceiling)


__all__ = ["Backoff", "RedialSchedule"]
