"""The replicas' store: the Redis of ``routing.redis`` (``kasd.store.sqlite`` is a lone kasd's).

Finished jobs are one sorted set, ``<prefix>:finished_jobs:{jobs}`` (member: job id, score: until;
the hash tag keeps it on one slot of a Redis Cluster), written by one script that purges lapsed
members, keeps to the cap, adds with ``GT`` (a later until wins) and PUBLISHes ``"<job id> <until>"``
on ``<prefix>:finished_jobs``. Every replica subscribes to that channel and records each notice in
its ``FinishedJobs`` (within milliseconds: the 1 s promise has room); on each (re)subscription it
reads the whole set again, so a notice missed while Redis was away is not lost, and writes back
what it knows that Redis lost (a Redis restarted empty forgets no finished job while one replica
remembers it). The per-request
check never talks to Redis. Redis away: revocations are refused (503) and every replica keeps
refusing what it knew.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from typing import Any

import trio
from coredis.tokens import PureToken

from kasd.store.environments import MAX_ENVIRONMENTS, too_many
from kasd.store.finished import FinishedJobs, TooManyFinishedJobs
from kasd.store.made import MAX_MADE, too_many_made
from kasd.store.protocol import PURGE_INTERVAL, StoreError, purge_lapsed
from routing.redisconn import REDIS_ERRORS, subscription

log = logging.getLogger("kasd.store")

#: seconds one Redis call may take
COMMAND_TIMEOUT = 3.0
#: seconds before a lost subscription is made again
RESUBSCRIBE_DELAY = 1.0
#: seconds kasd waits at start for the first read of the set before it serves without it
FIRST_SYNC_TIMEOUT = 2.0

# KEYS[1] the set; ARGV: job id, until, now, cap, channel. 1 written, 0 full.
_FINISH = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  return 0
end
redis.call('ZADD', KEYS[1], 'GT', ARGV[2], ARGV[1])
redis.call('PUBLISH', ARGV[5], ARGV[1] .. ' ' .. ARGV[2])
return 1
"""

# KEYS[1] the hash of slugs; ARGV: field (<project id>:<slug>), name, cap. The owner's name, or
# false when the hash is full.
_CLAIM = """
local owner = redis.call('HGET', KEYS[1], ARGV[1])
if owner then
  return owner
end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return false
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return ARGV[2]
"""

# KEYS[1] the set of objects kasd made; ARGV: key, cap. 1 recorded, 0 full.
_MADE = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  return 1
end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('SADD', KEYS[1], ARGV[1])
return 1
"""

_LISTEN_ERRORS: tuple[type[BaseException], ...] = (*REDIS_ERRORS, StoreError)
_NOTICE = re.compile(r"([0-9]{1,19}) ([0-9]{1,19})")


class RedisStore:
    """The store in Redis through ``client`` (a coredis client, ``routing.redisconn.open_redis``)."""

    def __init__(self, client: Any, *, key_prefix: str = "kasd", max_entries: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.key = f"{key_prefix}:finished_jobs:{{jobs}}"
        self.channel = f"{key_prefix}:finished_jobs"
        self.max_entries = max_entries
        self._clock = clock
        self._finish = client.register_script(_FINISH)
        self.slugs_key = f"{key_prefix}:environment_slugs:{{envs}}"
        self._claim = client.register_script(_CLAIM)
        self.made_key = f"{key_prefix}:made_objects:{{made}}"
        self._made = client.register_script(_MADE)
        #: set at the end of the next sync (the channel subscribed, or subscribed again after a
        #: reconnect, and the set read and written back); each sync replaces it with a new one
        self.synced = trio.Event()

    async def _call(self, work: Any) -> Any:
        try:
            with trio.fail_after(COMMAND_TIMEOUT):
                return await work
        except REDIS_ERRORS as exc:
            raise StoreError(f"Redis unreachable: {_short(exc)}") from None

    # ---- the Store protocol

    async def finish_job(self, job_id: int, until: int) -> None:
        written = await self._call(self._finish(keys=[self.key], args=[
            job_id, until, math.floor(self._clock()), self.max_entries, self.channel]))
        if not written:
            raise StoreError(str(TooManyFinishedJobs(self.max_entries)))

    async def finished_jobs(self, now: float) -> dict[int, int]:
        found = await self._call(self.client.zrange(self.key, math.floor(now) + 1, "+inf", sortby=PureToken.BYSCORE,
                                                    offset=0, count=self.max_entries, withscores=True))
        return {int(member): int(score) for member, score in found}

    async def purge(self, now: float) -> int:
        return int(await self._call(self.client.zremrangebyscore(self.key, -math.inf, math.floor(now))))

    async def claim_environment(self, project_id: int, slug: str, name: str) -> str:
        owner = await self._call(self._claim(keys=[self.slugs_key], args=[f"{project_id}:{slug}", name,
                                                                          MAX_ENVIRONMENTS]))
        if owner is None:
            raise StoreError(too_many(MAX_ENVIRONMENTS))
        return owner.decode() if isinstance(owner, bytes) else str(owner)

    async def record_made(self, key: str) -> None:
        if not await self._call(self._made(keys=[self.made_key], args=[key, MAX_MADE])):
            raise StoreError(too_many_made(MAX_MADE))

    async def is_made(self, key: str) -> bool:
        return bool(await self._call(self.client.sismember(self.made_key, key)))

    async def forget_made(self, key: str) -> None:
        await self._call(self.client.srem(self.made_key, [key]))

    async def run(self, view: FinishedJobs, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen for notices (reading the whole set at each subscription) and purge periodically.
        ``started()`` once the set was first read, or after ``FIRST_SYNC_TIMEOUT`` without Redis
        (kasd serves what it can; the listener keeps trying, and syncs when Redis answers)."""
        first = self.synced
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._listen, view)
            # the listener reports an outage; the purge is asked again next time
            nursery.start_soon(purge_lapsed, self, view, self._clock, lambda exc: None)
            with trio.move_on_after(FIRST_SYNC_TIMEOUT):
                await first.wait()
            if not first.is_set():
                log.warning("finished jobs: Redis did not answer within %gs; serving, and reading them once it does",
                            FIRST_SYNC_TIMEOUT)
            task_status.started()

    async def _listen(self, view: FinishedJobs) -> None:
        away = False
        while True:
            try:
                async with subscription(self.client, [self.channel]) as pubsub:
                    async for message in pubsub:
                        if message["type"] == "subscribe":
                            # every notice from now on is heard: what came before is read whole,
                            # and what this replica knows that Redis lost (restarted empty) is
                            # written back (each entry a notice, so the others learn it too)
                            now = self._clock()
                            for job, until in view.merge(await self.finished_jobs(now), now).items():
                                # (a full set refuses it: the entry stays in this replica's memory)
                                await self._call(self._finish(keys=[self.key], args=[
                                    job, until, math.floor(now), self.max_entries, self.channel]))
                            if away:
                                log.info("finished jobs: Redis reachable again; %d known", len(view))
                                away = False
                            synced, self.synced = self.synced, trio.Event()
                            synced.set()
                        elif message["type"] == "message":
                            self._notice(view, str(message["data"]))
            except _LISTEN_ERRORS as exc:
                if not away:
                    log.warning("finished jobs: Redis unreachable; refusing the jobs known so far, revocations "
                                "fail until it returns error=%s", _short(exc))
                    away = True
                await trio.sleep(RESUBSCRIBE_DELAY)

    def _notice(self, view: FinishedJobs, data: str) -> None:
        found = _NOTICE.fullmatch(data)
        if found is None:
            log.warning("finished jobs: ignored a notice that is not '<job id> <until>' (%d characters)", len(data))
            return
        try:
            view.record(int(found[1]), int(found[2]))
        except TooManyFinishedJobs as exc:
            log.warning("finished jobs: %s", exc)


def _short(error: BaseException) -> str:
    return (str(error) or type(error).__name__)[:200]


__all__ = ["PURGE_INTERVAL", "RedisStore"]
