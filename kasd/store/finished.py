"""The finished jobs a kasd knows of, in memory: what every CI job token is checked against.

``FinishedJobs`` maps a job id to the moment (seconds since the epoch) until which its tokens are
refused. The check on each request is one dict lookup (``until``); the store's shell keeps the map in
step (``kasd.store.protocol.Store.run``). It holds at most ``max_entries`` (a job is recorded only by
its own token or by the holder of the signing key, so strangers cannot fill it; a full map refuses
new entries rather than forgetting old ones, which would bring a finished job's tokens back).

``finished_until`` is how long a revocation lasts: until every token of the job that kasd would still
accept has expired — one issued up to now (clocks ``leeway`` ahead), living at most
``authorization.tokens.max_job_token_lifetime``, accepted ``leeway`` past its ``exp``.

Pure: no I/O, no clock (time is an argument), no trio.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import attrs

#: the most finished jobs held at once (≈ 100 bytes each)
MAX_FINISHED_JOBS = 100_000


class TooManyFinishedJobs(Exception):
    """The map (or the store) is full; ``str()`` says so and names the limit."""

    def __init__(self, max_entries: int) -> None:
        super().__init__(f"kasd holds {max_entries} finished jobs already (their tokens have not expired yet); "
                         "try again once some have")


def finished_until(now: float, *, max_lifetime: float, leeway: float) -> int:
    """Until when the tokens of a job finished at ``now`` must be refused (see the module docstring)."""
    return math.ceil(now + max_lifetime + 2 * leeway)


@attrs.frozen(kw_only=True)
class Statistics:
    jobs: int
    max_entries: int
    #: moves on every change (a new entry, a later until, a purge, a reload)
    version: int


class FinishedJobs:
    """job id → until. ``on_change`` callbacks run (synchronously) after each change."""

    def __init__(self, max_entries: int = MAX_FINISHED_JOBS) -> None:
        self.max_entries = max_entries
        self._until: dict[int, int] = {}
        self.version = 0
        self.on_change: list[Callable[[], None]] = []

    def until(self, job_id: int, now: float) -> int | None:
        """When job ``job_id``'s tokens are accepted again (never, in practice: they have expired by
        then), or None if the job is not finished (or its entry lapsed)."""
        until = self._until.get(job_id)
        return until if until is not None and until > now else None

    def check_room(self, job_id: int) -> None:
        """``TooManyFinishedJobs`` if recording ``job_id`` would need an entry there is no room for."""
        if job_id not in self._until and len(self._until) >= self.max_entries:
            raise TooManyFinishedJobs(self.max_entries)

    def record(self, job_id: int, until: int) -> bool:
        """Job ``job_id`` is finished until ``until`` (the later of this and what was known);
        whether that changed anything. ``TooManyFinishedJobs`` when full."""
        known = self._until.get(job_id)
        if known is not None and known >= until:
            return False
        self.check_room(job_id)
        self._until[job_id] = until
        self._changed()
        return True

    def merge(self, entries: Mapping[int, int], now: float) -> dict[int, int]:
        """What the store holds, read whole, joins the map (the later until of each job wins; an
        entry only ever lapses, never goes, so a union is never wrong); lapsed ones are left out.
        Returns what this map knows that ``entries`` lacks (or holds shorter): what a store that
        lost data (a Redis restarted empty) must be told again. Entries beyond ``max_entries`` are
        not taken (the store keeps to the same cap)."""
        changed = False
        for job, until in entries.items():
            known = self._until.get(job)
            if until > now and (known is None or until > known):
                if known is None and len(self._until) >= self.max_entries:
                    break
                self._until[job] = until
                changed = True
        if changed:
            self._changed()
        return {job: until for job, until in self._until.items() if until > now and entries.get(job, 0) < until}

    def purge(self, now: float) -> int:
        """Forget entries that lapsed by ``now``; how many."""
        lapsed = [job for job, until in self._until.items() if until <= now]
        for job in lapsed:
            del self._until[job]
        if lapsed:
            self._changed()
        return len(lapsed)

    def __len__(self) -> int:
        return len(self._until)

    def statistics(self) -> Statistics:
        return Statistics(jobs=len(self._until), max_entries=self.max_entries, version=self.version)

    def _changed(self) -> None:
        self.version += 1
        for callback in list(self.on_change):
            callback()


__all__ = ["MAX_FINISHED_JOBS", "FinishedJobs", "Statistics", "TooManyFinishedJobs", "finished_until"]
