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

Environments and their deployment history (``kasd.store.deployments``) are keys with the hash tag
``{envs}`` (one slot of a Redis Cluster, as the slugs): ``<prefix>:environments:{envs}:seq`` (INCR:
ids never reused), ``…:ids`` (hash ``<project id>:<name>`` → id), ``…:records`` (hash id → the
environment's JSON, its agents, namespaces and last deployment included, so a listing reads one
hash), ``…:deployments:<id>`` (hash ``<job id>:<agent id>`` → a deployment's JSON) and ``…:due``
(sorted set: the environments the next purge must look at, scored by when). Every change is one
script, so replicas recording the same job at once merge, never overwrite. Numbers are kept as
strings in these JSONs: Lua's cjson would round a 19-digit job id.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio
from coredis.tokens import PureToken

from kasd.store.deployments import (
    HISTORY,
    MAX_NAMESPACES,
    MAX_RECORDED_ENVIRONMENTS,
    Deployment,
    Environment,
    HistoryLimits,
    clamp_limit,
    deployment_from_json,
    deployment_to_json,
    dumps,
    environment_from_json,
    matches,
    newest_first,
    too_many_environments,
)
from kasd.store.discovery import MAX_POD_RECORDS, MAX_REPORTS, PodRecord
from kasd.store.environments import MAX_ENVIRONMENTS, too_many
from kasd.store.events_redis import RedisEvents
from kasd.store.finished import FinishedJobs, TooManyFinishedJobs
from kasd.store.made import MAX_MADE, too_many_made
from kasd.store.protocol import PURGE_INTERVAL, StoreError, purge_lapsed
from routing.redisconn import REDIS_ERRORS, follow

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

# Shared by the three environment scripts: recompute an environment's record from its kept
# deployments (newest first; beyond ARGV cap dropped), store it, and set when the purge must look at
# it again (its oldest kept deployment, when it has two or more; a stopped one's stop). KEYS[2] the
# records, KEYS[3] the due set.
_AGGREGATE = """
local function num(x) return tonumber(x) or 0 end
local function aggregate(env, dkey, cap)
  local kept = {}
  for _, body in ipairs(redis.call('HVALS', dkey)) do table.insert(kept, cjson.decode(body)) end
  table.sort(kept, function(a, b)
    if num(a.at) ~= num(b.at) then return num(a.at) > num(b.at) end
    if num(a.job_id) ~= num(b.job_id) then return num(a.job_id) > num(b.job_id) end
    return num(a.agent_id) > num(b.agent_id)
  end)
  while #kept > cap do
    local d = table.remove(kept)
    redis.call('HDEL', dkey, d.job_id .. ':' .. d.agent_id)
  end
  local agents, namespaces, seen = {}, {}, {}
  for _, d in ipairs(kept) do
    if not seen['a' .. d.agent_id] then seen['a' .. d.agent_id] = true; table.insert(agents, d.agent_id) end
    for _, n in ipairs(d.namespaces) do
      if not seen['n' .. n] then seen['n' .. n] = true; table.insert(namespaces, n) end
    end
  end
  table.sort(namespaces)
  env.agents, env.namespaces, env.last_deployment = agents, namespaces, kept[1]
  if #kept >= 2 then
    redis.call('ZADD', KEYS[3], num(kept[#kept].at), env.id)
  elseif env.state == 'stopped' then
    redis.call('ZADD', KEYS[3], math.max(num(env.updated_at), num(env.stopped_at)), env.id)
  else
    redis.call('ZREM', KEYS[3], env.id)
  end
  local encoded = cjson.encode(env)
  redis.call('HSET', KEYS[2], env.id, encoded)
  return encoded
end
"""

# KEYS[1] ids, [2] records, [3] due, [4] seq; ARGV: <project id>:<name>, the deployment's JSON, its
# field, the environment's own JSON, cap, most environments, the deployments key's prefix, most
# namespaces. The environment's JSON, or false when full.
_RECORD = _AGGREGATE + """
local new = cjson.decode(ARGV[2])
local id = redis.call('HGET', KEYS[1], ARGV[1])
local base = cjson.decode(ARGV[4])
local env
if not id then
  if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[6]) then return false end
  id = tostring(redis.call('INCR', KEYS[4]))
  redis.call('HSET', KEYS[1], ARGV[1], id)
  env = base
  env.id, env.state, env.created_at, env.updated_at = id, 'available', new.at, new.at
else
  env = cjson.decode(redis.call('HGET', KEYS[2], id))
  env.project, env.slug = base.project, base.slug
  if base.tier then env.tier = base.tier end
  if num(new.at) > num(env.updated_at) then env.updated_at = new.at end
  if env.state == 'stopped' and env.stopped_by ~= new.job_id then
    env.state, env.stopped_at, env.stopped_by = 'available', nil, nil
  end
end
local dkey = ARGV[7] .. id
local old = redis.call('HGET', dkey, ARGV[3])
if old then
  old = cjson.decode(old)
  local list, seen = {}, {}
  for _, n in ipairs(old.namespaces) do seen[n] = true; table.insert(list, n) end
  for _, n in ipairs(new.namespaces) do
    if not seen[n] and #list < tonumber(ARGV[8]) then seen[n] = true; table.insert(list, n) end
  end
  table.sort(list)
  new.namespaces = list
  if num(old.at) < num(new.at) then new.at = old.at end
end
redis.call('HSET', dkey, ARGV[3], cjson.encode(new))
return aggregate(env, dkey, tonumber(ARGV[5]))
"""

# KEYS[1] ids, [2] records, [3] due; ARGV: <project id>:<name>, at, job id ('' none), the
# deployments key's prefix, cap. The environment's JSON, or false when it was never recorded.
_STOP = _AGGREGATE + """
local id = redis.call('HGET', KEYS[1], ARGV[1])
if not id then return false end
local env = cjson.decode(redis.call('HGET', KEYS[2], id))
env.state, env.stopped_at = 'stopped', ARGV[2]
if ARGV[3] ~= '' then env.stopped_by = ARGV[3] else env.stopped_by = nil end
if num(ARGV[2]) > num(env.updated_at) then env.updated_at = ARGV[2] end
return aggregate(env, ARGV[4] .. id, tonumber(ARGV[5]))
"""

# KEYS[1] ids, [2] records, [3] due; ARGV: id, cutoff, the deployments key's prefix, cap. How many
# records went.
_PURGE = _AGGREGATE + """
local body = redis.call('HGET', KEYS[2], ARGV[1])
if not body then redis.call('ZREM', KEYS[3], ARGV[1]); return 0 end
local env = cjson.decode(body)
local dkey = ARGV[3] .. ARGV[1]
local cutoff = tonumber(ARGV[2])
if env.state == 'stopped' and math.max(num(env.updated_at), num(env.stopped_at)) < cutoff then
  local went = redis.call('HLEN', dkey) + 1
  redis.call('DEL', dkey)
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[1], env.project_id .. ':' .. env.name)
  redis.call('ZREM', KEYS[3], ARGV[1])
  return went
end
local newest, newest_field = nil, nil
local old = {}
local all = redis.call('HGETALL', dkey)
for i = 1, #all, 2 do
  local d = cjson.decode(all[i + 1])
  if not newest or num(d.at) > num(newest.at) or (num(d.at) == num(newest.at) and
      (num(d.job_id) > num(newest.job_id) or (num(d.job_id) == num(newest.job_id) and num(d.agent_id) > num(newest.agent_id)))) then
    newest, newest_field = d, all[i]
  end
  if num(d.at) < cutoff then table.insert(old, all[i]) end
end
local went = 0
for _, field in ipairs(old) do
  if field ~= newest_field or env.state == 'stopped' then
    redis.call('HDEL', dkey, field)
    went = went + 1
  end
end
aggregate(env, dkey, tonumber(ARGV[4]))
return went
"""

#: environments one purge round looks at
_PURGE_BATCH = 1000

_LISTEN_ERRORS: tuple[type[BaseException], ...] = (*REDIS_ERRORS, StoreError)
_NOTICE = re.compile(r"([0-9]{1,19}) ([0-9]{1,19})")


class RedisStore(RedisEvents):
    """The store in Redis through ``client`` (a coredis client, ``routing.redisconn.open_redis``)."""

    def __init__(self, client: Any, *, key_prefix: str = "kasd", max_entries: int,
                 clock: Callable[[], float] = time.time, history: HistoryLimits = HISTORY) -> None:
        self.client = client
        self._events_prefix = key_prefix
        self.key = f"{key_prefix}:finished_jobs:{{jobs}}"
        self.channel = f"{key_prefix}:finished_jobs"
        self.max_entries = max_entries
        self._clock = clock
        self._finish = client.register_script(_FINISH)
        self.slugs_key = f"{key_prefix}:environment_slugs:{{envs}}"
        self._claim = client.register_script(_CLAIM)
        self.made_key = f"{key_prefix}:made_objects:{{made}}"
        self._made = client.register_script(_MADE)
        self.history = history
        env = f"{key_prefix}:environments:{{envs}}"
        self.env_ids_key, self.env_records_key, self.env_due_key = f"{env}:ids", f"{env}:records", f"{env}:due"
        self.env_seq_key, self.deployments_prefix = f"{env}:seq", f"{env}:deployments:"
        self._record = client.register_script(_RECORD)
        self._stop = client.register_script(_STOP)
        self._purge_env = client.register_script(_PURGE)
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

    async def record_deployment(self, d: Deployment) -> Environment:
        base: dict[str, Any] = {"project_id": str(d.project_id), "project": d.project, "name": d.environment,
                                "slug": d.slug}
        if d.tier is not None:
            base["tier"] = d.tier
        found = await self._call(self._record(
            keys=[self.env_ids_key, self.env_records_key, self.env_due_key, self.env_seq_key],
            args=[f"{d.project_id}:{d.environment}", dumps(_deployment_json(d)), f"{d.job_id}:{d.agent_id}",
                  dumps(base), self.history.max_deployments, MAX_RECORDED_ENVIRONMENTS, self.deployments_prefix,
                  MAX_NAMESPACES]))
        if found is None:
            raise StoreError(too_many_environments(MAX_RECORDED_ENVIRONMENTS))
        return _environment(found)

    async def environments(self, *, project_id: int | None = None, project_prefix: str | None = None,
                           tier: str | None = None, state: str | None = None) -> list[Environment]:
        found = [_environment(body) for body in await self._call(self.client.hvals(self.env_records_key))]
        return sorted((env for env in found if matches(env, project_id=project_id, project_prefix=project_prefix,
                                                       tier=tier, state=state)), key=lambda env: env.id)

    async def environment(self, env_id: int) -> Environment | None:
        body = await self._call(self.client.hget(self.env_records_key, str(env_id)))
        return None if body is None else _environment(body)

    async def environment_named(self, project_id: int, name: str) -> Environment | None:
        env_id = await self._call(self.client.hget(self.env_ids_key, f"{project_id}:{name}"))
        return None if env_id is None else await self.environment(int(env_id))

    async def deployments(self, env_id: int, limit: int = 50) -> list[Deployment]:
        bodies = await self._call(self.client.hvals(f"{self.deployments_prefix}{env_id}"))
        return newest_first(deployment_from_json(json.loads(body)) for body in bodies)[:clamp_limit(limit)]

    async def mark_stopped(self, project_id: int, name: str, at: float, *, job_id: int | None = None
                           ) -> Environment | None:
        found = await self._call(self._stop(
            keys=[self.env_ids_key, self.env_records_key, self.env_due_key],
            args=[f"{project_id}:{name}", repr(float(at)), "" if job_id is None else str(job_id),
                  self.deployments_prefix, self.history.max_deployments]))
        return None if found is None else _environment(found)

    async def purge_history(self, now: float) -> int:
        cutoff = now - self.history.retention
        due = await self._call(self.client.zrange(self.env_due_key, -math.inf, cutoff, sortby=PureToken.BYSCORE,
                                                  offset=0, count=_PURGE_BATCH))
        went = 0
        for env_id in due:
            went += int(await self._call(self._purge_env(
                keys=[self.env_ids_key, self.env_records_key, self.env_due_key],
                args=[env_id, repr(cutoff), self.deployments_prefix, self.history.max_deployments])))
        return went

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

        async def subscribed() -> None:
            # every notice from now on is heard: what came before is read whole, and what this
            # replica knows that Redis lost (restarted empty) is written back (each entry a notice,
            # so the others learn it too)
            nonlocal away
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

        async def message(text: str) -> None:
            self._notice(view, text)

        def lost(exc: BaseException) -> None:
            nonlocal away
            if not away:
                log.warning("finished jobs: Redis unreachable; refusing the jobs known so far, revocations "
                            "fail until it returns error=%s", _short(exc))
                away = True

        await follow(self.client, self.channel, subscribed=subscribed, message=message, lost=lost,
                     errors=_LISTEN_ERRORS, delay=RESUBSCRIBE_DELAY)

    def _notice(self, view: FinishedJobs, data: str) -> None:
        found = _NOTICE.fullmatch(data)
        if found is None:
            log.warning("finished jobs: ignored a notice that is not '<job id> <until>' (%d characters)", len(data))
            return
        try:
            view.record(int(found[1]), int(found[2]))
        except TooManyFinishedJobs as exc:
            log.warning("finished jobs: %s", exc)

    # ---- connected agentd pods and their cluster reports (kasd.store.discovery)
    # Per agent (hash tag {agent:<id>}: one slot of a Redis Cluster): ``<prefix>:pods:{agent:<id>}``,
    # a hash tunnel key → the record's JSON with its ``expires`` (epoch s; readers skip and remove
    # the lapsed; the hash itself expires with its newest record); ``<prefix>:cluster:{agent:<id>}:<pod
    # digest>``, a string with a TTL (the report), listed in the set ``<prefix>:cluster:{agent:<id>}``.

    def _pods_key(self, agent_id: int) -> str:
        return f"{self.pods_prefix}:pods:{{agent:{agent_id}}}"

    def _reports_key(self, agent_id: int) -> str:
        return f"{self.pods_prefix}:cluster:{{agent:{agent_id}}}"

    def _report_key(self, agent_id: int, pod: str) -> str:
        return f"{self._reports_key(agent_id)}:{hashlib.sha256(pod.encode()).hexdigest()[:32]}"

    @property
    def pods_prefix(self) -> str:
        return self.key.split(":finished_jobs:", 1)[0]

    async def put_pod_records(self, records: Sequence[PodRecord], ttl: float) -> None:
        expires = self._clock() + ttl
        by_agent: dict[int, dict[str, str]] = {}
        for record in records:
            by_agent.setdefault(record.agent_id, {})[record.key] = json.dumps(
                {**record.to_json(), "expires": expires}, separators=(",", ":"))
        for agent_id, fields in by_agent.items():
            key = self._pods_key(agent_id)
            if await self._call(self.client.hlen(key)) + len(fields) > MAX_POD_RECORDS:
                await self.pod_records([agent_id])  # drops the lapsed
                if await self._call(self.client.hlen(key)) + len(fields) > MAX_POD_RECORDS:
                    raise StoreError(f"agent {agent_id} has over {MAX_POD_RECORDS} tunnel records")
            await self._call(self.client.hset(key, fields))
            await self._call(self.client.expire(key, max(1, math.ceil(ttl))))

    async def drop_pod_record(self, agent_id: int, key: str) -> None:
        await self._call(self.client.hdel(self._pods_key(agent_id), [key]))

    async def pod_records(self, agent_ids: Sequence[int]) -> dict[int, list[PodRecord]]:
        now = self._clock()
        out: dict[int, list[PodRecord]] = {}
        for agent_id in agent_ids:
            found = await self._call(self.client.hgetall(self._pods_key(agent_id)))
            lapsed = []
            for field, body in found.items():
                try:
                    data = json.loads(body)
                    if float(data["expires"]) <= now:
                        lapsed.append(field)
                        continue
                    out.setdefault(agent_id, []).append(PodRecord.from_json(data))
                except (ValueError, KeyError, TypeError):
                    lapsed.append(field)
            if lapsed:
                await self._call(self.client.hdel(self._pods_key(agent_id), lapsed))
        return out

    async def put_cluster_report(self, agent_id: int, pod: str, body: str, ttl: float) -> None:
        index = self._reports_key(agent_id)
        member = hashlib.sha256(pod.encode()).hexdigest()[:32]
        if (not await self._call(self.client.sismember(index, member))
                and await self._call(self.client.scard(index)) >= MAX_REPORTS):
            await self.cluster_reports(agent_id)  # drops the lapsed from the index
            if await self._call(self.client.scard(index)) >= MAX_REPORTS:
                raise StoreError(f"agent {agent_id} has over {MAX_REPORTS} cluster reports")
        await self._call(self.client.set(self._report_key(agent_id, pod), body, px=max(1, math.ceil(ttl * 1000))))
        await self._call(self.client.sadd(index, [member]))
        await self._call(self.client.expire(index, max(1, math.ceil(ttl))))

    async def keep_cluster_reports(self, agent_id: int, pods: Sequence[str], ttl: float) -> None:
        for pod in pods:
            await self._call(self.client.pexpire(self._report_key(agent_id, pod), max(1, math.ceil(ttl * 1000))))
        if pods:
            await self._call(self.client.expire(self._reports_key(agent_id), max(1, math.ceil(ttl))))

    async def cluster_reports(self, agent_id: int) -> list[str]:
        index = self._reports_key(agent_id)
        members = sorted(m.decode() if isinstance(m, bytes) else str(m)
                         for m in await self._call(self.client.smembers(index)))
        if not members:
            return []
        bodies = await self._call(self.client.mget([f"{index}:{m}" for m in members]))
        gone = [m for m, body in zip(members, bodies, strict=True) if body is None]
        if gone:
            await self._call(self.client.srem(index, gone))
        return [body.decode() if isinstance(body, bytes) else str(body) for body in bodies if body is not None]


def _deployment_json(d: Deployment) -> dict[str, Any]:
    """``d`` with its numbers as strings (the scripts' cjson keeps strings whole)."""
    data = deployment_to_json(d)
    for name in ("project_id", "agent_id", "job_id", "pipeline_id"):
        data[name] = str(data[name])
    data["at"] = repr(float(d.at))
    if d.tier is None:
        del data["tier"]
    return data


def _environment(body: str | bytes) -> Environment:
    data = json.loads(body)
    if not isinstance(data.get("last_deployment"), dict) or not data["last_deployment"]:
        data["last_deployment"] = None
    return environment_from_json(data)


def _short(error: BaseException) -> str:
    return (str(error) or type(error).__name__)[:200]


__all__ = ["PURGE_INTERVAL", "RedisStore"]
