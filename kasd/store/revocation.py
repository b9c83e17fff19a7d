"""The thin shell around the finished jobs: ``open_store`` picks the store kasd's configuration names
(Redis among replicas, else SQLite), and ``Revocations.finish`` records a job as finished — in the
store first (so every replica hears of it), then in this replica's map (so this replica refuses the
job's tokens as soon as the call returns).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from kasd.config import STORE_FILE_NAME, Config, ConfigError
from kasd.store.deployments import HistoryLimits
from kasd.store.finished import MAX_FINISHED_JOBS, FinishedJobs, TooManyFinishedJobs, finished_until
from kasd.store.protocol import Store, StoreError
from kasd.store.sqlite import SqliteStore

log = logging.getLogger("kasd.store")

#: the environment variable systemd's ``StateDirectory=`` sets
STATE_DIRECTORY = "STATE_DIRECTORY"


class Revocations:
    """``store`` and this replica's ``view`` of it."""

    def __init__(self, store: Store, view: FinishedJobs, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.view = view
        self._clock = clock

    async def finish(self, job_id: int, *, max_lifetime: float, leeway: float) -> int:
        """Record job ``job_id`` as finished; until when its tokens are refused. ``StoreError``
        (its message is safe for a client) when the store cannot record it."""
        until = finished_until(self._clock(), max_lifetime=max_lifetime, leeway=leeway)
        try:
            self.view.check_room(job_id)
        except TooManyFinishedJobs as exc:
            raise StoreError(str(exc)) from None
        await self.store.finish_job(job_id, until)
        try:
            self.view.record(job_id, until)
        except TooManyFinishedJobs:  # (filled by notices meanwhile: the store has it; its notice retries)
            pass
        return until


def sqlite_path(config: Config, environ: Mapping[str, str]) -> Path | str:
    """``store.path``, else ``$STATE_DIRECTORY/kasd.sqlite3``, else ``":memory:"``."""
    if config.store.path is not None:
        return config.store.path
    state = environ.get(STATE_DIRECTORY, "").split(":")[0]
    return Path(state) / STORE_FILE_NAME if state else ":memory:"


@asynccontextmanager
async def open_store(config: Config, *, environ: Mapping[str, str] = os.environ,
                     clock: Callable[[], float] = time.time,
                     max_entries: int = MAX_FINISHED_JOBS) -> AsyncIterator[Store]:
    """The store ``config`` names, open for the block; ``ConfigError`` naming the setting when its file
    cannot be opened (Redis is not asked here: its outages are reported as they happen)."""
    redis = config.routing.redis
    if redis.url is not None:
        from kasd.store.redis import RedisStore
        from routing.redisconn import describe, open_redis

        async with open_redis(redis.url, password=redis.password) as client:
            log.info("store: finished jobs in Redis redis=%s", describe(redis.url))
            yield RedisStore(client, key_prefix=redis.key_prefix, max_entries=max_entries, clock=clock,
                             history=HistoryLimits.of(config.environments))
        return
    path = sqlite_path(config, environ)
    if path == ":memory:":
        # (info, not a warning: tests and hand-run kasds are the ones without either; systemd's unit
        # sets $STATE_DIRECTORY)
        log.info("store: in memory (neither store.path nor $%s is set): finished jobs are forgotten when kasd "
                 "stops, and their tokens then work again until they expire", STATE_DIRECTORY)
    try:
        store = await trio.to_thread.run_sync(lambda: SqliteStore.open_sync(
            path, max_entries=max_entries, clock=clock, history=HistoryLimits.of(config.environments)))
    except StoreError as exc:
        named_by = "store.path" if config.store.path is not None else f"${STATE_DIRECTORY}"
        raise ConfigError(f"{named_by}: {exc}") from None
    if path != ":memory:":
        log.info("store: finished jobs in %s", path)
    try:
        yield store
    finally:
        with trio.move_on_after(5, shield=True):
            await store.aclose()


__all__ = ["STATE_DIRECTORY", "Revocations", "open_store", "sqlite_path"]
