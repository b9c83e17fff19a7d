"""The replicas' event queues (``kasd.store.events``) in Redis: the ``EventStore`` half of
``kasd.store.redis.RedisStore`` (a mixin, so the store's own file keeps its shape).

Per agent, keys under one hash tag (``{ev:<agent id>}``, one slot of a Redis Cluster):

- ``<prefix>:events:{ev:N}:q``: a Redis Stream, the queue: one entry per undelivered event, its
  entry id ``<seq>-1`` (so the stream's order is the agent's order), its field ``id``; delivered,
  failed and expired events leave it (XDEL);
- ``…:rec``: hash event id → the event's JSON (its status), while it waits and for ``keep_for``
  after it ended; ``…:done``: sorted set of ended event ids by when they ended (the trim);
- ``…:seq``: INCR, each event's seq (never reused); ``…:lease``: the replica delivering the agent's
  events (``SET … PX``, renewed while it delivers: a replica that dies loses it when it lapses).

Every change is one script, so two replicas posting at once never overwrite. ``<prefix>:events:agents``
(a set) names the agents that may have events waiting (a replica that starts, or a lease that
lapsed, finds them there); ``<prefix>:events`` is the channel whose notices (``"<agent id>"``) wake
the deliverer on every replica. Times are kept as strings (Lua's cjson would round them).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import trio

from kasd.store.errors import StoreError
from kasd.store.events import QueuedEvent, QueueFull, event_from_json, event_to_json
from routing.redisconn import REDIS_ERRORS, follow

log = logging.getLogger("kasd.store")

#: seconds between two subscriptions after Redis failed
_RESUBSCRIBE_DELAY = 1.0
_LISTEN_ERRORS: tuple[type[BaseException], ...] = (*REDIS_ERRORS, StoreError)

_EXPIRE = """
local function expire(rec, q, done, now, cutoff)
  local n = 0
  while true do
    local first = redis.call('XRANGE', q, '-', '+', 'COUNT', 1)
    if #first == 0 then return n end
    local id = first[1][2][2]
    local body = redis.call('HGET', rec, id)
    local e = body and cjson.decode(body)
    if e and tonumber(e.posted_at) > cutoff then return n end
    redis.call('XDEL', q, first[1][1])
    if e then
      e.state, e.ended_at, e.payload = 'expired', now, ''
      redis.call('HSET', rec, id, cjson.encode(e))
      redis.call('ZADD', done, now, id)
      n = n + 1
    end
  end
end
"""

# KEYS rec, q, seq, done, lease; ARGV id, event JSON, now, expiry cutoff, max queued, keep cutoff, max kept,
# the notices' channel, the agent's id, the poster's lease owner ('' none: its delivery never starts
# here), the deliverer it is handed to (its mark). {0, existing} | {1, new} (announced; 'delivering',
# marked 'handed', when that owner holds the lease and it is the only event waiting) | {2} when full
_POST = _EXPIRE + """
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then return {0, old} end
expire(KEYS[1], KEYS[2], KEYS[4], ARGV[3], tonumber(ARGV[4]))
if redis.call('XLEN', KEYS[2]) >= tonumber(ARGV[5]) then return {2} end
local seq = redis.call('INCR', KEYS[3])
local e = cjson.decode(ARGV[2])
e.seq = seq
if ARGV[10] ~= '' and redis.call('XLEN', KEYS[2]) == 0 and redis.call('GET', KEYS[5]) == ARGV[10] then
  e.state, e.attempts, e.handed = 'delivering', 1, ARGV[11]
end
local encoded = cjson.encode(e)
redis.call('HSET', KEYS[1], ARGV[1], encoded)
redis.call('XADD', KEYS[2], seq .. '-1', 'id', ARGV[1])
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[6])
for _, id in ipairs(gone) do redis.call('HDEL', KEYS[1], id) end
if #gone > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[6]) end
local extra = redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[7])
if extra > 0 then
  gone = redis.call('ZRANGE', KEYS[4], 0, extra - 1)
  for _, id in ipairs(gone) do redis.call('HDEL', KEYS[1], id) end
  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, extra - 1)
end
redis.call('PUBLISH', ARGV[8], ARGV[9])
return {1, encoded}
"""

# KEYS rec, q, done; ARGV now, expiry cutoff, '1' to start its delivery, the deliverer taking it
# first ('' a take to send again). {expired} | {expired, the oldest waiting event's JSON}. Started,
# one attempt more, unless a post started it for this deliverer (its mark: that attempt is this one)
_TAKE = _EXPIRE + """
local function take(rec, q, done, now, cutoff, start, taker)
  local n = expire(rec, q, done, now, cutoff)
  local first = redis.call('XRANGE', q, '-', '+', 'COUNT', 1)
  if #first == 0 then return {n} end
  local body = redis.call('HGET', rec, first[1][2][2])
  if body and start then
    local e = cjson.decode(body)
    if not (taker and taker ~= '' and e.state == 'delivering' and e.handed == taker) then
      e.attempts = (tonumber(e.attempts) or 0) + 1
    end
    e.state, e.handed = 'delivering', nil
    body = cjson.encode(e)
    redis.call('HSET', rec, first[1][2][2], body)
  end
  return {n, body}
end
"""
_NEXT = _TAKE + """
return take(KEYS[1], KEYS[2], KEYS[3], ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1', ARGV[4])
"""

# KEYS rec; ARGV id
_START = """
local body = redis.call('HGET', KEYS[1], ARGV[1])
if not body then return 0 end
local e = cjson.decode(body)
if e.state ~= 'queued' and e.state ~= 'delivering' then return 0 end
e.state, e.attempts, e.handed = 'delivering', (tonumber(e.attempts) or 0) + 1, nil
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(e))
return 1
"""

# KEYS rec, q, done; ARGV id, state, outcome, detail, pod, at, then the next's expiry cutoff ('' none),
# the deliverer taking it. {0} | take()'s answer
_END = _TAKE + """
local function then_next()
  if ARGV[7] == '' then return {0} end
  return take(KEYS[1], KEYS[2], KEYS[3], ARGV[6], tonumber(ARGV[7]), true, ARGV[8])
end
local body = redis.call('HGET', KEYS[1], ARGV[1])
if not body then return then_next() end
local e = cjson.decode(body)
if e.state ~= 'queued' and e.state ~= 'delivering' then return then_next() end
e.state, e.outcome, e.detail, e.pod, e.delivered_at, e.ended_at = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[6]
e.payload, e.handed = '', nil
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(e))
redis.call('XDEL', KEYS[2], e.seq .. '-1')
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[1])
return then_next()
"""

# KEYS lease; ARGV owner, milliseconds. 1 taken (or renewed), 0 held by another
_LEASE = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _stream_id(entry: Any) -> str:
    """The event id a queue entry names (its one field, ``id``), whatever shape coredis gives it."""
    fields = getattr(entry, "field_values", entry)
    if not isinstance(fields, dict):
        fields = entry[1] if isinstance(entry, (tuple, list)) and len(entry) == 2 else {}
    value = fields.get(b"id", fields.get("id", b""))
    return _text(value)


def _decoded(body: Any) -> QueuedEvent:
    return event_from_json(json.loads(body))


class RedisEvents:
    """The ``EventStore`` methods of ``RedisStore`` (which provides ``client`` and ``_call``)."""

    client: Any
    _events_prefix = "kasd"
    _event_scripts: dict[str, Any] | None = None

    async def _call(self, work: Any) -> Any:
        raise NotImplementedError  # (RedisStore's)

    def _script(self, name: str) -> Any:
        if self._event_scripts is None:
            self._event_scripts = {n: self.client.register_script(s) for n, s in (
                ("post", _POST), ("next", _NEXT), ("start", _START), ("end", _END), ("lease", _LEASE),
                ("release", _RELEASE))}
        return self._event_scripts[name]

    def _keys(self, agent_id: int, *names: str) -> list[str]:
        return [f"{self._events_prefix}:events:{{ev:{agent_id}}}:{name}" for name in names]

    @property
    def _agents_key(self) -> str:
        return f"{self._events_prefix}:events:agents"

    @property
    def _events_channel(self) -> str:
        return f"{self._events_prefix}:events"

    async def post_event(self, event: QueuedEvent, *, max_queued: int, ttl: float, keep_for: float,
                         max_kept: int, deliverer: str | None = None, handed_to: str | None = None
                         ) -> tuple[QueuedEvent, bool]:
        now = event.posted_at
        record = event_to_json(event)
        record.update(agent_id=str(event.agent_id), posted_at=repr(now), delivered_at="", outcome="", detail="",
                      pod="")
        script = self._script("post")(
            keys=self._keys(event.agent_id, "rec", "q", "seq", "done", "lease"),
            args=[event.id, json.dumps(record), repr(now), repr(now - ttl), max_queued, repr(now - keep_for),
                  max_kept, self._events_channel, str(event.agent_id), deliverer or "",
                  handed_to or deliverer or ""])
        # the index of agents with events (another slot) at the same time: one round trip's wait
        # (named even when nothing was queued: the sweep drops an agent whose queue is empty)
        answer, _ = await self._both(script, self.client.sadd(self._agents_key, [str(event.agent_id)]))
        if int(answer[0]) == 2:
            raise QueueFull(event.agent_id, max_queued)
        return _decoded(answer[1]), int(answer[0]) == 1

    async def _both(self, first: Any, second: Any) -> tuple[Any, Any]:
        """Two commands' answers, sent at once; the first ``StoreError`` raised as itself."""
        answers: list[Any] = [None, None]
        failures: list[StoreError] = []

        async def one(index: int, work: Any) -> None:
            try:
                answers[index] = await self._call(work)
            except StoreError as exc:
                failures.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, 0, first)
            nursery.start_soon(one, 1, second)
        if failures:
            raise failures[0]
        return answers[0], answers[1]

    async def event(self, agent_id: int, event_id: str) -> QueuedEvent | None:
        body = await self._call(self.client.hget(self._keys(agent_id, "rec")[0], event_id))
        return None if body is None else _decoded(body)

    async def events(self, agent_id: int, *, state: str | None = None, limit: int = 100) -> list[QueuedEvent]:
        # Not every record: a waiting one holds its payload (up to 64 KiB, a thousand of them per
        # agent). The newest ``limit`` waiting ones (the queue's tail) and the ended ones (kept
        # without their payload, at most max_kept) are read: the newest ``limit`` of either are there.
        rec, q, done = self._keys(agent_id, "rec", "q", "done")
        ids: list[str] = []
        if state in (None, "queued", "delivering"):
            entries = await self._call(self.client.xrevrange(q, "+", "-", count=limit))
            ids += [_stream_id(entry) for entry in (entries.values() if isinstance(entries, dict) else entries)]
        if state not in ("queued", "delivering"):
            ids += [_text(m) for m in await self._call(self.client.zrange(done, 0, -1, rev=True))]
        ids = [i for i in dict.fromkeys(ids) if i]
        bodies = await self._call(self.client.hmget(rec, ids)) if ids else []
        found = [e for e in (_decoded(b) for b in bodies if b is not None) if state is None or e.state == state]
        return sorted(found, key=lambda e: e.seq, reverse=True)[:limit]

    async def next_event(self, agent_id: int, now: float, ttl: float, *, start: bool = False,
                         handed_to: str | None = None) -> tuple[QueuedEvent | None, int]:
        answer = await self._call(self._script("next")(keys=self._keys(agent_id, "rec", "q", "done"),
                                                       args=[repr(now), repr(now - ttl), "1" if start else "0",
                                                             handed_to or ""]))
        body = answer[1] if len(answer) > 1 else None
        return (None if body is None else _decoded(body)), int(answer[0])

    async def start_delivery(self, agent_id: int, event_id: str) -> None:
        await self._call(self._script("start")(keys=self._keys(agent_id, "rec"), args=[event_id]))

    async def end_delivery(self, agent_id: int, event_id: str, *, state: str, outcome: str | None, detail: str | None,
                           pod: str | None, at: float, next_ttl: float | None = None,
                           handed_to: str | None = None) -> tuple[QueuedEvent | None, int]:
        answer = await self._call(self._script("end")(
            keys=self._keys(agent_id, "rec", "q", "done"),
            args=[event_id, state, outcome or "", detail or "", pod or "", repr(at),
                  "" if next_ttl is None else repr(at - next_ttl), handed_to or ""]))
        body = answer[1] if len(answer) > 1 else None
        return (None if body is None else _decoded(body)), int(answer[0])

    async def pending_agents(self) -> dict[int, int]:
        members = await self._call(self.client.smembers(self._agents_key))
        pending = {}
        for member in sorted(int(_text(m)) for m in members if _text(m).isdigit()):
            queue = self._keys(member, "q")[0]
            if waiting := int(await self._call(self.client.xlen(queue))):
                pending[member] = waiting
                continue
            # Dropped from the index, then the queue read again: a post that came between the first
            # read and the removal found the agent still named (its SADD a no-op) and must not be left
            # out of the index (the queue and the index are in different slots: no one script).
            await self._call(self.client.srem(self._agents_key, [str(member)]))
            if waiting := int(await self._call(self.client.xlen(queue))):
                await self._call(self.client.sadd(self._agents_key, [str(member)]))
                pending[member] = waiting
        return pending

    async def take_lease(self, agent_id: int, owner: str, seconds: float) -> bool:
        return bool(await self._call(self._script("lease")(keys=self._keys(agent_id, "lease"),
                                                           args=[owner, max(1, int(seconds * 1000))])))

    async def release_lease(self, agent_id: int, owner: str) -> None:
        await self._call(self._script("release")(keys=self._keys(agent_id, "lease"), args=[owner]))

    async def announce_events(self, agent_id: int) -> None:
        await self._call(self.client.publish(self._events_channel, str(agent_id)))

    async def listen_events(self, wake: Callable[[int], object], *,
                            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Each notice wakes its agent; each (re)subscription wakes every agent with events waiting
        (a notice sent while Redis was away is not lost)."""
        started = False

        def start() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        async def subscribed() -> None:
            start()
            for agent_id in await self.pending_agents():
                wake(agent_id)

        async def message(text: str) -> None:
            if text.isascii() and text.isdigit() and len(text) <= 19:
                wake(int(text))

        def lost(exc: BaseException) -> None:
            log.warning("events: Redis unreachable; delivery waits for it error=%s", str(exc)[:200])
            start()

        await follow(self.client, self._events_channel, subscribed=subscribed, message=message, lost=lost,
                     errors=_LISTEN_ERRORS, delay=_RESUBSCRIBE_DELAY)


__all__ = ["RedisEvents"]
