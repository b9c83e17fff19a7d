"""A lone kasd's store: one SQLite file (``store.path``), through the standard library's sqlite3.

Every statement runs in a worker thread (``trio.to_thread``), one at a time (a lock around the one
connection), so a slow disk never blocks the event loop. Only one kasd process uses a file: replicas
share Redis instead (``kasd.store.redis``).

Tables: ``finished_jobs(job_id INTEGER PRIMARY KEY, until INTEGER)``; ``environment_slugs(project_id,
slug, name)``, each project's slugs and the environment that owns each (``kasd.store.environments``);
``made_objects(key)``, the objects kasd made (``kasd.store.made``); ``environments`` and
``deployments``, each environment's record and its deployment history (``kasd.store.deployments``;
``AUTOINCREMENT``: an environment's id is never reused).
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import trio

from kasd.store.deployments import (
    HISTORY,
    MAX_RECORDED_ENVIRONMENTS,
    Deployment,
    Environment,
    HistoryLimits,
    clamp_limit,
    deployment_from_json,
    deployment_to_json,
    dumps,
    environment_of,
    matches,
    merged,
    too_many_environments,
)
from kasd.store.discovery import MemoryPods, PodRecord
from kasd.store.environments import MAX_ENVIRONMENTS, too_many
from kasd.store.events_sqlite import SqliteEvents
from kasd.store.finished import FinishedJobs, TooManyFinishedJobs
from kasd.store.made import MAX_MADE, too_many_made
from kasd.store.protocol import PURGE_INTERVAL, StoreError, purge_lapsed
from kasd.store.sqlitetx import transaction

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
);
CREATE TABLE IF NOT EXISTS environments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    project_id INTEGER NOT NULL,
    project TEXT NOT NULL,
    name TEXT NOT NULL,
    slug TEXT NOT NULL,
    tier TEXT,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    stopped_at REAL,
    stopped_by INTEGER,
    UNIQUE (project_id, name)
);
CREATE TABLE IF NOT EXISTS deployments (
    environment_id INTEGER NOT NULL,
    job_id INTEGER NOT NULL,
    agent_id INTEGER NOT NULL,
    at REAL NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (environment_id, job_id, agent_id)
);
CREATE INDEX IF NOT EXISTS deployments_at ON deployments (at)
"""

#: an environment's deployments, newest first (the order every reader and the cap use)
_NEWEST = "ORDER BY at DESC, job_id DESC, agent_id DESC"
_ENV_COLUMNS = "id, project_id, project, name, slug, tier, state, created_at, updated_at, stopped_at"

_T = TypeVar("_T")


class SqliteStore(SqliteEvents):
    """The store in the SQLite file at ``path`` (``":memory:"``: in this process only).
    ``async with SqliteStore.open(path)``, or ``open_sync`` then ``aclose``."""

    def __init__(self, connection: sqlite3.Connection, where: str, *, max_entries: int,
                 clock: Callable[[], float] = time.time, history: HistoryLimits = HISTORY) -> None:
        self._db = connection
        self.where = where
        self.max_entries = max_entries
        self.history = history
        self._clock = clock
        # one statement at a time on the one connection, whichever worker thread runs it
        self._lock = threading.Lock()

    @classmethod
    def open_sync(cls, path: Path | str, *, max_entries: int, clock: Callable[[], float] = time.time,
                  history: HistoryLimits = HISTORY) -> SqliteStore:
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
        return cls(db, where, max_entries=max_entries, clock=clock, history=history)

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
            with transaction(db):
                known = db.execute("SELECT 1 FROM finished_jobs WHERE job_id = ?", (job_id,)).fetchone()
                if known is None:
                    db.execute("DELETE FROM finished_jobs WHERE until <= ?", (math.floor(now),))
                    (count,) = db.execute("SELECT count(*) FROM finished_jobs").fetchone()
                    if count >= max_entries:
                        db.execute("ROLLBACK")
                        return False
                db.execute("INSERT INTO finished_jobs (job_id, until) VALUES (?, ?) "
                           "ON CONFLICT (job_id) DO UPDATE SET until = max(until, excluded.until)", (job_id, until))
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
            with transaction(db):
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
            return str(row[0])

        owner = await self._run(claim)
        if owner is None:
            raise StoreError(too_many(MAX_ENVIRONMENTS))
        return owner

    async def record_made(self, key: str) -> None:
        def write(db: sqlite3.Connection) -> bool:
            with transaction(db):
                if db.execute("SELECT 1 FROM made_objects WHERE key = ?", (key,)).fetchone() is None:
                    (count,) = db.execute("SELECT count(*) FROM made_objects").fetchone()
                    if count >= MAX_MADE:
                        db.execute("ROLLBACK")
                        return False
                    db.execute("INSERT INTO made_objects (key) VALUES (?)", (key,))
            return True

        if not await self._run(write):
            raise StoreError(too_many_made(MAX_MADE))

    async def is_made(self, key: str) -> bool:
        return await self._run(lambda db: db.execute("SELECT 1 FROM made_objects WHERE key = ?", (key,)).fetchone()
                               is not None)

    async def forget_made(self, key: str) -> None:
        await self._run(lambda db: db.execute("DELETE FROM made_objects WHERE key = ?", (key,)))

    async def record_deployment(self, d: Deployment) -> Environment:
        cap = self.history.max_deployments

        def write(db: sqlite3.Connection) -> Environment | None:
            with transaction(db):
                row = db.execute("SELECT id, state, stopped_by FROM environments WHERE project_id = ? AND name = ?",
                                 (d.project_id, d.environment)).fetchone()
                if row is None:
                    (count,) = db.execute("SELECT count(*) FROM environments").fetchone()
                    if count >= MAX_RECORDED_ENVIRONMENTS:
                        db.execute("ROLLBACK")
                        return None
                    env_id = db.execute(
                        "INSERT INTO environments (project_id, project, name, slug, tier, state, created_at, "
                        "updated_at) VALUES (?, ?, ?, ?, ?, 'available', ?, ?)",
                        (d.project_id, d.project, d.environment, d.slug, d.tier, d.at, d.at)).lastrowid
                else:
                    env_id, state, stopped_by = row
                    # used again by a job other than the one that stopped it: available again
                    revive = state == "stopped" and stopped_by != d.job_id
                    db.execute(
                        "UPDATE environments SET project = ?, slug = ?, tier = coalesce(?, tier), "
                        "updated_at = max(updated_at, ?), state = CASE WHEN ? THEN 'available' ELSE state END, "
                        "stopped_at = CASE WHEN ? THEN NULL ELSE stopped_at END, "
                        "stopped_by = CASE WHEN ? THEN NULL ELSE stopped_by END WHERE id = ?",
                        (d.project, d.slug, d.tier, d.at, revive, revive, revive, env_id))
                old = db.execute("SELECT body FROM deployments WHERE environment_id = ? AND job_id = ? AND agent_id = ?",
                                 (env_id, d.job_id, d.agent_id)).fetchone()
                kept = merged(deployment_from_json(json.loads(old[0])) if old else None, d)
                db.execute("INSERT OR REPLACE INTO deployments (environment_id, job_id, agent_id, at, body) "
                           "VALUES (?, ?, ?, ?, ?)", (env_id, d.job_id, d.agent_id, kept.at,
                                                      dumps(deployment_to_json(kept))))
                db.execute(f"DELETE FROM deployments WHERE environment_id = ? AND rowid NOT IN (SELECT rowid FROM "
                           f"deployments WHERE environment_id = ? {_NEWEST} LIMIT ?)", (env_id, env_id, cap))
                env = _environments(db, "WHERE id = ?", (env_id,))[0]
            return env

        env = await self._run(write)
        if env is None:
            raise StoreError(too_many_environments(MAX_RECORDED_ENVIRONMENTS))
        return env

    async def environments(self, *, project_id: int | None = None, project_prefix: str | None = None,
                           tier: str | None = None, state: str | None = None) -> list[Environment]:
        where, args = ("WHERE project_id = ?", (project_id,)) if project_id is not None else ("", ())
        found = await self._run(lambda db: _environments(db, where, args))
        return [env for env in found if matches(env, project_id=project_id, project_prefix=project_prefix,
                                                  tier=tier, state=state)]

    async def environment(self, env_id: int) -> Environment | None:
        found = await self._run(lambda db: _environments(db, "WHERE id = ?", (env_id,)))
        return found[0] if found else None

    async def environment_named(self, project_id: int, name: str) -> Environment | None:
        found = await self._run(lambda db: _environments(db, "WHERE project_id = ? AND name = ?", (project_id, name)))
        return found[0] if found else None

    async def deployments(self, env_id: int, limit: int = 50) -> list[Deployment]:
        rows = await self._run(lambda db: db.execute(
            f"SELECT body FROM deployments WHERE environment_id = ? {_NEWEST} LIMIT ?",
            (env_id, clamp_limit(limit))).fetchall())
        return [deployment_from_json(json.loads(body)) for (body,) in rows]

    async def mark_stopped(self, project_id: int, name: str, at: float, *, job_id: int | None = None
                           ) -> Environment | None:
        def write(db: sqlite3.Connection) -> Environment | None:
            with transaction(db):
                db.execute("UPDATE environments SET state = 'stopped', stopped_at = ?, stopped_by = ?, "
                           "updated_at = max(updated_at, ?) WHERE project_id = ? AND name = ?",
                           (at, job_id, at, project_id, name))
                found = _environments(db, "WHERE project_id = ? AND name = ?", (project_id, name))
            return found[0] if found else None

        return await self._run(write)

    async def purge_history(self, now: float) -> int:
        cutoff, cap = now - self.history.retention, self.history.max_deployments

        def delete(db: sqlite3.Connection) -> int:
            with transaction(db):
                # a stopped environment untouched for the retention goes, with its history
                gone = db.execute("DELETE FROM environments WHERE state = 'stopped' AND max(updated_at, "
                                  "coalesce(stopped_at, 0)) < ?", (cutoff,)).rowcount
                went = db.execute("DELETE FROM deployments WHERE environment_id NOT IN (SELECT id FROM environments)"
                                  ).rowcount
                # older than the retention, or beyond the cap; an available environment's newest stays
                went += db.execute(
                    "DELETE FROM deployments WHERE rowid IN (SELECT d.rowid FROM (SELECT rowid, environment_id, at, "
                    "row_number() OVER (PARTITION BY environment_id ORDER BY at DESC, job_id DESC, agent_id DESC) "
                    "AS n FROM deployments) AS d JOIN environments AS e ON e.id = d.environment_id "
                    "WHERE d.n > ? OR (d.at < ? AND (d.n > 1 OR e.state = 'stopped')))", (cap, cutoff)).rowcount
            return int(gone + went)

        return await self._run(delete)

    async def run(self, view: FinishedJobs, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Fill ``view`` from the file, then purge both every ``PURGE_INTERVAL`` (this process is the
        file's only writer: nothing else can change it)."""
        now = self._clock()
        view.merge(await self.finished_jobs(now), now)
        task_status.started()
        await purge_lapsed(self, view, self._clock, lambda exc: log.warning(
            "could not purge lapsed finished jobs (tried again in %gs): %s", PURGE_INTERVAL, exc))

    # ---- connected agentd pods and their cluster reports: in memory (kasd.store.discovery says why)

    @property
    def _pods(self) -> MemoryPods:
        pods: MemoryPods | None = self.__dict__.get("_memory_pods")
        if pods is None:
            pods = self.__dict__["_memory_pods"] = MemoryPods(self._clock)
        return pods

    async def put_pod_records(self, records: Sequence[PodRecord], ttl: float) -> None:
        await self._pods.put_pod_records(records, ttl)

    async def drop_pod_record(self, agent_id: int, key: str) -> None:
        await self._pods.drop_pod_record(agent_id, key)

    async def pod_records(self, agent_ids: Sequence[int]) -> dict[int, list[PodRecord]]:
        return await self._pods.pod_records(agent_ids)

    async def put_cluster_report(self, agent_id: int, pod: str, body: str, ttl: float) -> None:
        await self._pods.put_cluster_report(agent_id, pod, body, ttl)

    async def keep_cluster_reports(self, agent_id: int, pods: Sequence[str], ttl: float) -> None:
        await self._pods.keep_cluster_reports(agent_id, pods, ttl)

    async def cluster_reports(self, agent_id: int) -> list[str]:
        return await self._pods.cluster_reports(agent_id)


def _environments(db: sqlite3.Connection, where: str, args: tuple[object, ...]) -> list[Environment]:
    """The environments ``where`` selects, each with its kept deployments (two statements in all)."""
    cursor = db.execute(f"SELECT {_ENV_COLUMNS} FROM environments {where} ORDER BY id", args)
    names = [c[0] for c in cursor.description]
    rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    if not rows:
        return []
    history: dict[int, list[Deployment]] = {int(row["id"]): [] for row in rows}
    ids = list(history)
    for env_id, body in db.execute(
            f"SELECT environment_id, body FROM deployments WHERE environment_id IN ({','.join('?' * len(ids))})"
            if len(ids) <= 500 else "SELECT environment_id, body FROM deployments", ids if len(ids) <= 500 else ()):
        if env_id in history:
            history[env_id].append(deployment_from_json(json.loads(body)))
    return [environment_of(row, history[int(row["id"])]) for row in rows]


__all__ = ["PURGE_INTERVAL", "SqliteStore"]
