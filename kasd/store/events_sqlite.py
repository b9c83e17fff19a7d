"""A lone kasd's event queues (``kasd.store.events``) in its SQLite store: the ``EventStore`` half
of ``kasd.store.sqlite.SqliteStore`` (a mixin, so the store's own file keeps its shape).

Tables (made on first use): ``events`` (one row per event, ``(agent_id, id)`` its key, ``(agent_id,
seq)`` unique) and ``event_seq`` (each agent's last seq: a seq is never reused, even after its
event is purged). Their commits do not wait for the disk (``synchronous=NORMAL``: durable against
kasd's death, not the machine's power loss). The lease is this process's memory: a lone kasd is the only deliverer. Notices
are calls in this process.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import trio

from kasd.store.events import UNDELIVERED, QueuedEvent, QueueFull
from kasd.store.sqlitetx import transaction

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    agent_id INTEGER NOT NULL,
    id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL,
    posted_at REAL NOT NULL,
    delivered_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    outcome TEXT,
    detail TEXT,
    pod TEXT,
    ended_at REAL,
    handed TEXT,
    PRIMARY KEY (agent_id, id)
);
CREATE UNIQUE INDEX IF NOT EXISTS events_seq ON events (agent_id, seq);
CREATE INDEX IF NOT EXISTS events_state ON events (state, agent_id, seq);
CREATE TABLE IF NOT EXISTS event_seq (
    agent_id INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL
)
"""
#: columns added since the table was first made: (name, type), each added to an older file's table
_ADDED = (("handed", "TEXT"),)
_COLUMNS = "agent_id, id, seq, type, payload, state, posted_at, delivered_at, attempts, outcome, detail, pod"
_WAITING = f"state IN ({', '.join(repr(s) for s in UNDELIVERED)})"


def _event(row: Any) -> QueuedEvent:
    agent_id, event_id, seq, type_, payload, state, posted_at, delivered_at, attempts, outcome, detail, pod = row
    return QueuedEvent(agent_id=int(agent_id), id=event_id, seq=int(seq), type=type_, payload=payload, state=state,
                 posted_at=float(posted_at), delivered_at=delivered_at, attempts=int(attempts), outcome=outcome,
                 detail=detail, pod=pod)


def _expire(db: sqlite3.Connection, agent_id: int, now: float, ttl: float) -> int:
    return db.execute(f"UPDATE events SET state = 'expired', ended_at = ?, payload = '' WHERE agent_id = ? AND {_WAITING} "
                      "AND posted_at <= ?", (now, agent_id, now - ttl)).rowcount


def _migrate(db: sqlite3.Connection) -> None:
    """An events table made by an older kasd gets the columns added since (``CREATE TABLE IF NOT
    EXISTS`` keeps its old shape)."""
    have = {str(row[1]) for row in db.execute("PRAGMA table_info(events)")}
    for name, kind in _ADDED:
        if name not in have:
            db.execute(f"ALTER TABLE events ADD COLUMN {name} {kind}")


def _take(db: sqlite3.Connection, agent_id: int, now: float, ttl: float, start: bool,
          handed_to: str | None) -> tuple[QueuedEvent | None, int]:
    """``next_event``'s step, in one transaction: started, one attempt more — unless a post started
    it for ``handed_to`` (its mark ``handed``: that attempt is this one); the mark goes."""
    with transaction(db):
        expired = _expire(db, agent_id, now, ttl)
        row = db.execute(f"SELECT {_COLUMNS} FROM events WHERE agent_id = ? AND {_WAITING} ORDER BY seq LIMIT 1",
                         (agent_id,)).fetchone()
        if row is not None and start:
            db.execute("UPDATE events SET state = 'delivering', attempts = attempts + (CASE WHEN state = 'delivering' "
                       "AND handed IS NOT NULL AND handed = ? THEN 0 ELSE 1 END), handed = NULL "
                       "WHERE agent_id = ? AND id = ?", (handed_to, agent_id, row[1]))
            row = db.execute(f"SELECT {_COLUMNS} FROM events WHERE agent_id = ? AND id = ?", (agent_id, row[1])).fetchone()
    return (None if row is None else _event(row)), expired


class SqliteEvents:
    """The ``EventStore`` methods of ``SqliteStore`` (which provides ``_db``, ``_lock``, ``_run``, ``_clock``)."""

    _db: sqlite3.Connection
    _lock: threading.Lock
    _clock: Callable[[], float]
    _events_ready = False
    _event_leases: dict[int, tuple[str, float]] | None = None
    _event_listeners: list[Callable[[int], object]] | None = None

    async def _run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        raise NotImplementedError  # (SqliteStore's)

    async def _events(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        def ready(db: sqlite3.Connection) -> _T:
            if not self._events_ready:
                db.executescript(_SCHEMA)
                _migrate(db)
                self._events_ready = True
            # the events' writes do not wait for the disk (synchronous=NORMAL, in WAL mode): a
            # commit is in the write-ahead log file when it returns, so kasd's death (a crash, kill
            # -9) loses none of them — what "a replica's death loses nothing" asks, and what the
            # replicas' Redis gives; the machine's power loss may lose the last ones. FULL's fsync
            # per commit cost 3-7 ms per event on the benchmarks' disk (docs/benchmarks.md, Events)
            (before,) = db.execute("PRAGMA synchronous").fetchone()
            db.execute("PRAGMA synchronous=NORMAL")
            try:
                return work(db)
            finally:
                db.execute(f"PRAGMA synchronous={int(before)}")

        return await self._run(ready)

    async def post_event(self, event: QueuedEvent, *, max_queued: int, ttl: float, keep_for: float,
                         max_kept: int, deliverer: str | None = None, handed_to: str | None = None
                         ) -> tuple[QueuedEvent, bool]:
        now = event.posted_at
        # (the lease is this process's: looked at here, before the transaction's thread)
        holder = self._leases().get(event.agent_id)
        held = deliverer is not None and holder is not None and holder[0] == deliverer and holder[1] > trio.current_time()

        def post(db: sqlite3.Connection) -> tuple[QueuedEvent, bool] | None:
            with transaction(db):
                row = db.execute(f"SELECT {_COLUMNS} FROM events WHERE agent_id = ? AND id = ?",
                                 (event.agent_id, event.id)).fetchone()
                if row is not None:
                    return _event(row), False
                _expire(db, event.agent_id, now, ttl)
                (waiting,) = db.execute(f"SELECT count(*) FROM events WHERE agent_id = ? AND {_WAITING}",
                                        (event.agent_id,)).fetchone()
                if waiting >= max_queued:
                    return None
                db.execute("INSERT INTO event_seq (agent_id, seq) VALUES (?, 1) "
                           "ON CONFLICT (agent_id) DO UPDATE SET seq = seq + 1", (event.agent_id,))
                (seq,) = db.execute("SELECT seq FROM event_seq WHERE agent_id = ?", (event.agent_id,)).fetchone()
                # the deliverer's take in the same step: its lease holder, the only event waiting
                state, attempts = ("delivering", 1) if held and waiting == 0 else ("queued", 0)
                # (marked with whom it is handed to: their first take does not count it again)
                handed = (handed_to or deliverer) if state == "delivering" else None
                db.execute(f"INSERT INTO events ({_COLUMNS}, handed) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, NULL, "
                           "NULL, NULL, ?)", (event.agent_id, event.id, seq, event.type, event.payload, state, now,
                                              attempts, handed))
                # ended events: those past keep_for, and beyond the newest max_kept
                db.execute(f"DELETE FROM events WHERE agent_id = ? AND NOT {_WAITING} AND ended_at <= ?",
                           (event.agent_id, now - keep_for))
                db.execute(f"DELETE FROM events WHERE agent_id = ? AND NOT {_WAITING} AND seq NOT IN (SELECT seq "
                           f"FROM events WHERE agent_id = ? AND NOT {_WAITING} ORDER BY ended_at DESC, seq DESC LIMIT ?)",
                           (event.agent_id, event.agent_id, max_kept))
            return attrs.evolve(event, seq=int(seq), state=state, attempts=attempts), True

        posted = await self._events(post)
        if posted is None:
            raise QueueFull(event.agent_id, max_queued)
        if posted[1]:
            await self.announce_events(event.agent_id)
        return posted

    async def event(self, agent_id: int, event_id: str) -> QueuedEvent | None:
        row = await self._events(lambda db: db.execute(f"SELECT {_COLUMNS} FROM events WHERE agent_id = ? AND id = ?",
                                                       (agent_id, event_id)).fetchone())
        return None if row is None else _event(row)

    async def events(self, agent_id: int, *, state: str | None = None, limit: int = 100) -> list[QueuedEvent]:
        where, args = ("AND state = ?", (agent_id, state, limit)) if state else ("", (agent_id, limit))
        rows = await self._events(lambda db: db.execute(
            f"SELECT {_COLUMNS} FROM events WHERE agent_id = ? {where} ORDER BY seq DESC LIMIT ?", args).fetchall())
        return [_event(row) for row in rows]

    async def next_event(self, agent_id: int, now: float, ttl: float, *, start: bool = False,
                         handed_to: str | None = None) -> tuple[QueuedEvent | None, int]:
        return await self._events(lambda db: _take(db, agent_id, now, ttl, start, handed_to))

    async def start_delivery(self, agent_id: int, event_id: str) -> None:
        await self._events(lambda db: db.execute(
            f"UPDATE events SET state = 'delivering', attempts = attempts + 1, handed = NULL WHERE agent_id = ? AND id = ? AND "
            f"{_WAITING}", (agent_id, event_id)))

    async def end_delivery(self, agent_id: int, event_id: str, *, state: str, outcome: str | None, detail: str | None,
                           pod: str | None, at: float, next_ttl: float | None = None,
                           handed_to: str | None = None) -> tuple[QueuedEvent | None, int]:
        def end(db: sqlite3.Connection) -> tuple[QueuedEvent | None, int]:
            db.execute(f"UPDATE events SET state = ?, outcome = ?, detail = ?, pod = ?, delivered_at = ?, ended_at = ?, "
                       f"payload = '', handed = NULL WHERE agent_id = ? AND id = ? AND {_WAITING}",
                       (state, outcome, detail, pod, at, at, agent_id, event_id))
            return (None, 0) if next_ttl is None else _take(db, agent_id, at, next_ttl, True, handed_to)

        return await self._events(end)

    async def pending_agents(self) -> dict[int, int]:
        rows = await self._events(lambda db: db.execute(
            f"SELECT agent_id, count(*) FROM events WHERE {_WAITING} GROUP BY agent_id ORDER BY agent_id").fetchall())
        return {int(agent_id): int(count) for agent_id, count in rows}

    # ---- the lease and the notices: this process's own

    def _leases(self) -> dict[int, tuple[str, float]]:
        found = self._event_leases
        if found is None:
            found = self._event_leases = {}
        return found

    async def take_lease(self, agent_id: int, owner: str, seconds: float) -> bool:
        await trio.lowlevel.checkpoint()
        leases, now = self._leases(), trio.current_time()
        holder = leases.get(agent_id)
        if holder is not None and holder[0] != owner and holder[1] > now:
            return False
        leases[agent_id] = (owner, now + seconds)
        return True

    async def release_lease(self, agent_id: int, owner: str) -> None:
        await trio.lowlevel.checkpoint()
        leases = self._leases()
        if leases.get(agent_id, ("",))[0] == owner:
            del leases[agent_id]

    def _listeners(self) -> list[Callable[[int], object]]:
        found = self._event_listeners
        if found is None:
            found = self._event_listeners = []
        return found

    async def announce_events(self, agent_id: int) -> None:
        await trio.lowlevel.checkpoint()
        for wake in list(self._listeners()):
            wake(agent_id)

    async def listen_events(self, wake: Callable[[int], object], *,
                            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = self._listeners()
        listeners.append(wake)
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            listeners.remove(wake)


__all__ = ["SqliteEvents"]
