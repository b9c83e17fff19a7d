"""Which kasd replicas are alive: each heartbeats into Redis with a TTL and publishes its private
and agent URLs; joins, leaves and drains are published at once, a crash is seen within two
heartbeats (docs/routing.md, "Membership").

Redis (prefix ``kasd``): ``{kasd}:members`` is a ZSET name → expiry (ms, Redis's clock: replicas'
clocks never matter), ``{kasd}:member-info`` a HASH name → the member as JSON. One Lua script does a
heartbeat (refresh self, drop the expired, return who is live) — both keys share the ``{kasd}`` hash
tag, so it runs unchanged on a Redis Cluster. Changes are PUBLISHed on ``kasd:members``; an observer
also re-reads at the earliest expiry it knows of, so a member that stopped beating leaves everyone's
ring within two heartbeats even if nobody else beats in between.

May import: ``routing.ring``, ``routing.redisconn``, coredis, trio, attrs, the standard library.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs
import trio

from routing.redisconn import REDIS_ERRORS, RedisHealth, follow
from routing.ring import DEFAULT_WEIGHT, Ring

log = logging.getLogger("routing.membership")


@attrs.frozen(kw_only=True)
class Member:
    #: the ring identity "host:port" (= ``routing.name``: the front end's upstream server string)
    name: str
    weight: int = DEFAULT_WEIGHT
    #: what peers dial to forward a request here
    private_url: str = ""
    #: what agentd dials to reach this replica
    agent_url: str = ""
    #: shutting down: off the ring, still finishing what it has
    draining: bool = False

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Member | None:
        try:
            raw = json.loads(text)
            return cls(name=str(raw["name"]), weight=int(raw.get("weight", DEFAULT_WEIGHT)),
                       private_url=str(raw.get("private_url", "")), agent_url=str(raw.get("agent_url", "")),
                       draining=bool(raw.get("draining", False)))
        except (ValueError, KeyError, TypeError):
            return None  # a member written by something else: not one of ours


def ring_of(members: Mapping[str, Member]) -> Ring:
    """The ring over the live members that are not draining."""
    return Ring({m.name: m.weight for m in members.values() if not m.draining})


class Membership(Protocol):
    """Who the live replicas are: what the router and the placement notices read (``self_name``,
    ``members``, ``ring``, the change events) and what kasd drives (``run``, ``set_draining``,
    ``leave``: ``kasd.replicas``). Implemented by ``StaticMembership`` and ``RedisMembership``."""

    @property
    def self_name(self) -> str: ...
    def members(self) -> Mapping[str, Member]: ...
    @property
    def ring(self) -> Ring: ...
    async def wait_changed(self) -> None: ...
    def changes(self) -> trio.Event: ...
    @property
    def healthy(self) -> bool: ...
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...
    async def set_draining(self) -> None: ...
    async def leave(self) -> None: ...


class _Changes:
    """The member table, and an event fired on each change of it."""

    def __init__(self) -> None:
        self._members: dict[str, Member] = {}
        self._ring = Ring({})
        self._event = trio.Event()

    def members(self) -> Mapping[str, Member]:
        return dict(self._members)

    @property
    def ring(self) -> Ring:
        return self._ring

    async def wait_changed(self) -> None:
        await self._event.wait()

    def changes(self) -> trio.Event:
        """The event the next change sets: take it before reading ``members()``, wait on it after,
        and no change in between is missed."""
        return self._event

    def _replace(self, members: dict[str, Member]) -> bool:
        if members == self._members:
            return False
        self._members = members
        self._ring = ring_of(members)
        self._event.set()
        self._event = trio.Event()
        return True


class StaticMembership(_Changes):
    """A lone kasd (itself only), and tests: a fixed table."""

    def __init__(self, me: Member, others: list[Member] | None = None) -> None:
        super().__init__()
        self.me = me
        self._replace({m.name: m for m in [me, *(others or [])]})

    @property
    def self_name(self) -> str:
        return self.me.name

    @property
    def healthy(self) -> bool:
        return True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def set_draining(self) -> None:
        self.me = attrs.evolve(self.me, draining=True)
        self._replace({**self._members, self.me.name: self.me})
        await trio.lowlevel.checkpoint()

    async def leave(self) -> None:
        self._replace({n: m for n, m in self._members.items() if n != self.me.name})
        await trio.lowlevel.checkpoint()


# KEYS[1] the members ZSET, KEYS[2] the info HASH (one hash tag);
# ARGV[1] name, ARGV[2] member JSON, ARGV[3] TTL ms, ARGV[4] channel, ARGV[5] "beat" | "read" | "leave";
# returns Redis's time, the expired members it removed, the live table, and 1 if a beat added the caller
_HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local removed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, name in ipairs(removed) do
  redis.call('ZREM', KEYS[1], name)
  redis.call('HDEL', KEYS[2], name)
end
local changed = #removed > 0
local added = 0
if ARGV[5] == 'leave' then
  if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then changed = true end
  redis.call('HDEL', KEYS[2], ARGV[1])
elseif ARGV[5] == 'beat' then
  added = redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  if added == 1 then changed = true end
  if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
    changed = true
  end
end
if changed then redis.call('PUBLISH', ARGV[4], ARGV[1]) end
return {now, removed, redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES'), redis.call('HGETALL', KEYS[2]), added}
"""


class RedisMembership(_Changes):
    """This replica's heartbeat and everyone's table, in Redis. ``run`` in a task; ``set_draining``
    when shutting down (others drop it from their ring at once), ``leave`` last."""

    def __init__(self, client: Any, me: Member, *, health: RedisHealth, key_prefix: str = "kasd",
                 heartbeat_interval: float = 1.0, ttl: float | None = None) -> None:
        super().__init__()
        self.client = client
        self.me = me
        self.health = health
        self.heartbeat_interval = heartbeat_interval
        self.ttl = ttl if ttl is not None else 2 * heartbeat_interval
        self.members_key = f"{{{key_prefix}}}:members"
        self.info_key = f"{{{key_prefix}}}:member-info"
        self.channel = f"{key_prefix}:members"
        self._script = client.register_script(_HEARTBEAT)
        self._poke = trio.Event()
        self._left = False
        self._next_expiry_in: float | None = None
        self._last_beat = -1e9
        #: called with the names of members this replica found expired and removed (it, and only
        #: it, collects their tunnel entries: ``routing.directory``)
        self.on_removed: list[Callable[[list[str]], None]] = []
        #: called when a beat finds this replica gone from the table after it had joined: others
        #: took it for dead (it missed its heartbeats, or Redis lost its data) and may have
        #: collected its tunnel entries, which ``routing.directory`` then writes again
        self.on_rejoined: list[Callable[[], None]] = []
        self._joined = False

    @property
    def self_name(self) -> str:
        return self.me.name

    @property
    def healthy(self) -> bool:
        return self.health.healthy

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._call("beat")  # a first beat before serving (Redis away: serve anyway, degraded)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._listen)
            task_status.started()
            while not self._left:
                wait = self.heartbeat_interval
                if self._next_expiry_in is not None:
                    wait = max(0.01, min(wait, self._next_expiry_in + 0.005))
                with trio.move_on_after(wait):
                    await self._poke.wait()
                if self._left:
                    break
                poked = self._poke.is_set()
                self._poke = trio.Event()
                await self._call("beat" if not poked or self._beat_due() else "read")
            nursery.cancel_scope.cancel()

    def _beat_due(self) -> bool:
        return trio.current_time() - self._last_beat >= self.heartbeat_interval / 2

    async def set_draining(self) -> None:
        self.me = attrs.evolve(self.me, draining=True)
        await self._call("beat")

    async def leave(self) -> None:
        self._left = True
        self._poke.set()
        await self._call("leave")

    async def _call(self, mode: str) -> bool:
        try:
            with trio.fail_after(self.heartbeat_interval * 2 + 1):
                now, removed, live, info, added = await self._script(
                    keys=[self.members_key, self.info_key],
                    args=[self.me.name, self.me.to_json(), int(self.ttl * 1000), self.channel, mode],
                )
        except REDIS_ERRORS as exc:
            self.health.failed(exc)
            return False
        self.health.succeeded()
        if mode == "beat":
            self._last_beat = trio.current_time()
        self._apply(int(now), list(removed), _pairs(live), _pairs(info))
        if mode == "beat" and int(added) == 1:
            if self._joined:
                log.warning("this replica had been taken for dead (missed heartbeats, or Redis lost its data) "
                            "and joined again; its tunnels are registered again")
                for callback in self.on_rejoined:
                    callback()
            self._joined = True
        if mode == "leave":
            self._replace({n: m for n, m in self._members.items() if n != self.me.name})
        return True

    def _apply(self, now: int, removed: list[str], live: dict[str, Any], info: dict[str, Any]) -> None:
        members: dict[str, Member] = {}
        for name in live:
            member = Member.from_json(str(info.get(name, "")))
            if member is not None and member.name == name:
                members[name] = member
        others = [float(expiry) for name, expiry in live.items() if name != self.me.name]
        self._next_expiry_in = (min(others) - now) / 1000 if others else None
        if self._replace(members):
            log.info("members changed members=%s", ",".join(
                f"{m.name}{'(draining)' if m.draining else ''}" for m in sorted(members.values(), key=lambda m: m.name)))
        if removed:
            log.warning("members expired (stopped heartbeating) removed=%s", ",".join(removed))
            for callback in self.on_removed:
                callback(removed)

    async def _listen(self) -> None:
        """Re-read the table whenever a member says it changed (and after every reconnect)."""

        async def poke(_: str = "") -> None:
            await trio.lowlevel.checkpoint()
            self._poke.set()

        # (a lost subscription: the heartbeat reports the outage)
        await follow(self.client, self.channel, subscribed=poke, message=poke, lost=lambda _: None,
                     delay=self.heartbeat_interval)


def _pairs(value: Any) -> dict[str, Any]:
    """A Redis reply of alternating names and values (or RESP3's map) as a dict."""
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    items = list(value or [])
    if items and isinstance(items[0], list | tuple):  # RESP3 WITHSCORES: [[name, score], ...]
        return {str(k): v for k, v in items}
    return {str(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)}


__all__ = ["Member", "Membership", "RedisMembership", "StaticMembership", "ring_of"]
