"""A lone kasd's store: one SQLite file (``store.path``), through the standard library's sqlite3.

Every statement runs in a worker thread (``trio.to_thread``), one at a time (a lock around the one
connection), so a slow disk never blocks the event loop. Only one kasd process uses a file: replicas
share Redis instead (``kasd.store.redis``).

Tables: ``finished_jobs(job_id INTEGER PRIMARY KEY, until INTEGER)``; ``environment_slugs(project_id,
slug, name)``, each project's slugs and the environment that owns each (``kasd.store.environments``);
``made_objects(key)``, the objects kasd made (``kasd.store.made``).
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import trio

from kasd.store.environments import MAX_ENVIRONMENTS, too_many
from kasd.store.finished import FinishedJobs, TooManyFinishedJobs
from kasd.store.made import MAX_MADE, too_many_made
from kasd.store.protocol import PURGE_INTERVAL, StoreError, purge_lapsed

log = logging.getLogger("kasd.store")

#: seconds a statement waits for a lock held by another connection (another process misusing the file)
BUSY_TIMEOUT = 5.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS finished_jobs (
    job_id INTEGER PRIMARY KEY,
    until INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS environment_slugs (
    project_id INTEGER NOT NULL,
    slug TEXT NOT NULL,
    name TEXT NOT NULL,
    PRIMARY KEY (project_id, slug)
);
CREATE TABLE IF NOT EXISTS made_objects (
    key TEXT PRIMARY KEY
)
"""

_T = TypeVar("_T")


class SqliteStore:
    """The store in the SQLite file at ``path`` (``":memory:"``: in this process only).
    ``async with SqliteStore.open(path)``, or ``open_sync`` then ``aclose``."""

    def __init__(self, connection: sqlite3.Connection, where: str, *, max_entries: int,
                 clock: Callable[[], float] = time.time) -> None:
        self._db = connection
        self.where = where
        self.max_entries = max_entries
        self._clock = clock
        # one statement at a time on the one connection, whichever worker thread runs it
        self._lock = threading.Lock()

    @classmethod
    def open_sync(cls, path: Path | str, *, max_entries: int, clock: Callable[[], float] = time.time) -> SqliteStore:
        """Open (creating the file and its table if needed); ``StoreError`` naming the file."""
        where = str(path)
        try:
            if where != ":memory:":
                Path(where).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(where, timeout=BUSY_TIMEOUT, check_same_thread=False, isolation_level=None)
            try:
                db.execute("PRAGMA journal_mode=WAL" if where != ":memory:" else "PRAGMA journal_mode=MEMORY")
                db.executescript(_SCHEMA)
            except BaseException:
                db.close()
                raise
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the store {where}: {exc}") from None
        return cls(db, where, max_entries=max_entries, clock=clock)

    async def aclose(self) -> None:
        await trio.to_thread.run_sync(self._close)

    def _close(self) -> None:
        with self._lock:
            self._db.close()

    async def _run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        def locked() -> _T:
            with self._lock:
                return work(self._db)

        try:
            return await trio.to_thread.run_sync(locked)
        except sqlite3.Error as exc:
            raise StoreError(f"the store {self.where} failed: {exc}") from None

    # ---- the Store protocol

    async def finish_job(self, job_id: int, until: int) -> None:
        max_entries, now = self.max_entries, self._clock()

        def write(db: sqlite3.Connection) -> bool:
            db.execute("BEGIN IMMEDIATE")
            try:
                known = db.execute("SELECT 1 FROM finished_jobs WHERE job_id = ?", (job_id,)).fetchone()
                if known is None:
                    db.execute("DELETE FROM finished_jobs WHERE until <= ?", (math.floor(now),))
                    (count,) = db.execute("SELECT count(*) FROM finished_jobs").fetchone()
                    if count >= max_entries:
                        db.execute("ROLLBACK")
                        return False
                db.execute("INSERT INTO finished_jobs (job_id, until) VALUES (?, ?) "
                           "ON CONFLICT (job_id) DO UPDATE SET until = max(until, excluded.until)", (job_id, until))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return True

        if not await self._run(write):
            raise StoreError(str(TooManyFinishedJobs(max_entries)))

    async def finished_jobs(self, now: float) -> dict[int, int]:
        def read(db: sqlite3.Connection) -> dict[int, int]:
            rows = db.execute("SELECT job_id, until FROM finished_jobs WHERE until > ? ORDER BY until DESC LIMIT ?",
                              (math.floor(now), self.max_entries)).fetchall()
            return {int(job): int(until) for job, until in rows}

        return await self._run(read)

    async def purge(self, now: float) -> int:
        def delete(db: sqlite3.Connection) -> int:
            return db.execute("DELETE FROM finished_jobs WHERE until <= ?", (math.floor(now),)).rowcount

        return await self._run(delete)

    async def claim_environment(self, project_id: int, slug: str, name: str) -> str:
        def claim(db: sqlite3.Connection) -> str | None:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT name FROM environment_slugs WHERE project_id = ? AND slug = ?",
                                 (project_id, slug)).fetchone()
                if row is None:
                    (count,) = db.execute("SELECT count(*) FROM environment_slugs").fetchone()
                    if count >= MAX_ENVIRONMENTS:
                        db.execute("ROLLBACK")
                        return None
                    db.execute("INSERT INTO environment_slugs (project_id, slug, name) VALUES (?, ?, ?)",
                               (project_id, slug, name))
                    row = (name,)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return str(row[0])

        owner = await self._run(claim)
        if owner is None:
            raise StoreError(too_many(MAX_ENVIRONMENTS))
        return owner

    async def record_made(self, key: str) -> None:
        def write(db: sqlite3.Connection) -> bool:
            db.execute("BEGIN IMMEDIATE")
            try:
                if db.execute("SELECT 1 FROM made_objects WHERE key = ?", (key,)).fetchone() is None:
                    (count,) = db.execute("SELECT count(*) FROM made_objects").fetchone()
                    if count >= MAX_MADE:
                        db.execute("ROLLBACK")
                        return False
                    db.execute("INSERT INTO made_objects (key) VALUES (?)", (key,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return True

        if not await self._run(write):
            raise StoreError(too_many_made(MAX_MADE))

    async def is_made(self, key: str) -> bool:
        return await self._run(lambda db: db.execute("SELECT 1 FROM made_objects WHERE key = ?", (key,)).fetchone()
                               is not None)

    async def forget_made(self, key: str) -> None:
        await self._run(lambda db: db.execute("DELETE FROM made_objects WHERE key = ?", (key,)))

    async def run(self, view: FinishedJobs, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Fill ``view`` from the file, then purge both every ``PURGE_INTERVAL`` (this process is the
        file's only writer: nothing else can change it)."""
        now = self._clock()
        view.merge(await self.finished_jobs(now), now)
        task_status.started()
        await purge_lapsed(self, view, self._clock, lambda exc: log.warning(
            "could not purge lapsed finished jobs (tried again in %gs): %s", PURGE_INTERVAL, exc))


__all__ = ["PURGE_INTERVAL", "SqliteStore"]
