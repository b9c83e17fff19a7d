"""A config refresh (``POST /api/kasd/v1/config/refresh``) asked of one replica reaches every
replica: the one asked publishes a notice on ``<key_prefix>:config-refresh`` in the replicas'
Redis, and each replica, subscribed, looks at its own repositories at once (``CiAuthority.refresh``).

Each replica reads its own ``authorization.config_root`` (a shared volume, or a clone of its own
kept up to date by the operator) and polls it; the notice only makes the look immediate. A notice
carries the sender's name and nothing else (a replica ignores its own); nothing in it is trusted
beyond "look now", so a forged one costs one look at the refs, as a poll does. Without Redis (an
outage) each replica still polls.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio

from routing.redisconn import COMMAND_TIMEOUT, REDIS_ERRORS, follow, open_redis

log = logging.getLogger("kasd.gitrefresh")

#: seconds between two attempts to subscribe again while Redis is away
RESUBSCRIBE_DELAY = 1.0
#: characters of a notice read (a replica's name)
MAX_NOTICE = 256


class Refreshable(Protocol):
    async def refresh(self, wait: float = ...) -> bool: ...


class RefreshFanout:
    """``refresh`` here and, through Redis, on every other replica; ``run`` hears the others'."""

    def __init__(self, authority: Refreshable, client: Any, *, name: str, key_prefix: str = "kasd") -> None:
        self.authority = authority
        self.client = client
        self.name = name
        self.channel = f"{key_prefix}:config-refresh"
        #: set when the subscription is (again) in place (tests wait on it)
        self.subscribed = trio.Event()

    async def refresh(self, wait: float = 10.0) -> bool:
        try:
            with trio.fail_after(COMMAND_TIMEOUT):
                await self.client.publish(self.channel, self.name[:MAX_NOTICE])
        except REDIS_ERRORS as exc:  # the others poll anyway
            log.warning("config refresh: could not tell the other replicas (Redis): %s", str(exc)[:200] or
                        type(exc).__name__)
        return await self.authority.refresh(wait)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        away = False

        def start() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        async def subscribed() -> None:
            nonlocal away
            if away:
                log.info("config refresh: Redis reachable again")
                away = False
            self.subscribed.set()
            start()

        async def message(text: str) -> None:
            if text[:MAX_NOTICE] != self.name:
                await self.authority.refresh(0)  # (look now; nobody here waits for it)

        def lost(exc: BaseException) -> None:
            nonlocal away
            if not away:
                log.warning("config refresh: Redis unreachable; the replicas still poll their repositories: %s",
                            str(exc)[:200] or type(exc).__name__)
                away = True
            self.subscribed = trio.Event()
            start()

        await follow(self.client, self.channel, subscribed=subscribed, message=message, lost=lost,
                     delay=RESUBSCRIBE_DELAY)


@asynccontextmanager
async def refresh_fanout(authority: Refreshable, url: str, *, password: str | None, name: str,
                         key_prefix: str) -> AsyncIterator[RefreshFanout]:
    """A ``RefreshFanout`` on a Redis connection of its own, listening for the block."""
    async with open_redis(url, password=password) as client, trio.open_nursery() as nursery:
        fanout = RefreshFanout(authority, client, name=name, key_prefix=key_prefix)
        await nursery.start(fanout.run)
        yield fanout
        nursery.cancel_scope.cancel()


__all__ = ["RefreshFanout", "refresh_fanout"]
