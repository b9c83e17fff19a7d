"""Which replicas hold tunnels of which agents (docs/routing.md, "Redis key layout").

``MemoryDirectory`` is a lone kasd's: nobody else exists, so nobody else holds anything.
``RedisDirectory`` keeps, per agent, ``kasd:tunnels:{<agent id>}`` — a HASH replica name → expiry
(ms, Redis's clock), refreshed every ``tunnel_ttl / 3`` for each agent this replica holds — and, per
replica, ``kasd:held:{<replica name>}`` — a SET of the agent ids it registered, so that whoever
finds a crashed replica expired collects its entries. Every command touches one key (one slot):
the layout runs unchanged on a Redis Cluster. Each change is PUBLISHed on ``kasd:tunnels`` as
``"<agent id> <+|-> <replica>"``: a request waiting for an agent on any replica wakes at once.

``holders()`` never raises for Redis trouble: Redis away, it answers "nobody" (the request waits
for a local tunnel), ``healthy`` turns False and the outage is logged once (``RedisHealth``).
``tunnels_up``/``tunnels_down`` are synchronous (the tunnel registry calls them) and never block:
the Redis writes happen in ``run``'s task, which also re-registers everything when Redis returns.

May import: ``routing.membership``, ``routing.redisconn``, ``wire.ids``, coredis, trio, the standard
library.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, Protocol

import trio

from routing.membership import RedisMembership
from routing.redisconn import COMMAND_TIMEOUT, REDIS_ERRORS, RedisHealth, follow
from wire.ids import InvalidNumber, parse_id

log = logging.getLogger("routing.directory")


#: seconds a holders answer read from Redis is used again (changes are announced at once; this
#: bounds what a lost notice could cost)
HOLDERS_MAX_AGE = 1.0
#: agents whose holders are remembered at once
HOLDERS_CACHED = 4096


class TunnelDirectory(Protocol):
    """Which replicas hold tunnels of an agent: what the tunnel registry tells (``tunnels_up`` /
    ``tunnels_down``, ``kasd.agents``), what the router asks (``holders``, ``changed``:
    ``routing.router``) and what kasd drives (``run``, ``withdraw``, ``healthy``: ``kasd.replicas``).
    Implemented by ``MemoryDirectory`` and ``RedisDirectory``."""

    def tunnels_up(self, agent_id: int) -> None: ...
    def tunnels_down(self, agent_id: int) -> None: ...
    async def holders(self, agent_id: int) -> frozenset[str]: ...
    def changed(self, agent_id: int) -> trio.Event: ...
    @property
    def healthy(self) -> bool: ...
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...
    async def withdraw(self) -> None: ...


class _Events:
    """One event per agent someone waits on, set (and dropped) when its holders may have changed."""

    def __init__(self) -> None:
        self._events: dict[int, trio.Event] = {}

    def changed(self, agent_id: int) -> trio.Event:
        event = self._events.get(agent_id)
        if event is None:
            event = self._events[agent_id] = trio.Event()
        return event

    def fire(self, agent_id: int) -> None:
        event = self._events.pop(agent_id, None)
        if event is not None:
            event.set()

    def fire_all(self) -> None:
        events, self._events = self._events, {}
        for event in events.values():
            event.set()


class MemoryDirectory(_Events):
    """A lone kasd: holders are always nobody else."""

    healthy = True

    async def withdraw(self) -> None:
        await trio.lowlevel.checkpoint()

    def tunnels_up(self, agent_id: int) -> None:
        pass

    def tunnels_down(self, agent_id: int) -> None:
        pass

    async def holders(self, agent_id: int) -> frozenset[str]:
        await trio.lowlevel.checkpoint()
        return frozenset()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()


# KEYS[1] kasd:tunnels:{id}; ARGV[1] replica, ARGV[2] TTL ms, ARGV[3] channel and ARGV[4] message
# to publish once written (none on a refresh): one round trip from a tunnel to every replica's notice
_UP = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], now + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], ARGV[4]) end
return now
"""

# KEYS[1] kasd:tunnels:{id}: the fields not yet expired (the expired ones are deleted)
_LIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
local live = {}
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) > now then table.insert(live, all[i]) else redis.call('HDEL', KEYS[1], all[i]) end
end
return live
"""


class RedisDirectory(_Events):
    def __init__(self, client: Any, membership: RedisMembership, *, health: RedisHealth, key_prefix: str = "kasd",
                 tunnel_ttl: float = 30.0, read_timeout: float = COMMAND_TIMEOUT, write_timeout: float = 5.0,
                 resubscribe_pause: float = 1.0) -> None:
        super().__init__()
        self.client = client
        #: how long a holders read may take before Redis counts as away (the request then waits
        #: for a local tunnel instead): a request's own wait is longer
        self.read_timeout = read_timeout
        #: how long one write of this replica's entries (all of them, on a refresh) may take
        self.write_timeout = write_timeout
        #: the pause before subscribing again after the change channel was lost
        self.resubscribe_pause = resubscribe_pause
        self.membership = membership
        self.health = health
        self.prefix = key_prefix
        self.tunnel_ttl = tunnel_ttl
        self.channel = f"{key_prefix}:tunnels"
        self._up_script = client.register_script(_UP)
        self._live_script = client.register_script(_LIVE)
        #: agents this replica holds tunnels of, as the registry told us
        self._local: set[int] = set()
        # What ``_write`` owes Redis, coalesced (so bounded by the agents and replicas there are,
        # never by how often tunnels come and go): agents whose entry may be stale (an ordered
        # set), replicas to collect, and whether everything must be written again.
        self._dirty: dict[int, None] = {}
        self._gone: list[str] = []
        self._rewrite = False
        self._wake = trio.Event()
        # The holders last read from Redis per agent, with when: every change is announced on the
        # channel (and a lost subscription, a member leaving, a re-registration clear it all), so
        # a forwarded request asks Redis only when something changed or the answer is older than
        # HOLDERS_MAX_AGE. ``_version`` moves on each invalidation: a read that overlapped one is
        # not kept.
        # Only while subscribed: a change announced before the subscription was made (or while it
        # was lost) is never heard, so an answer read then is not kept.
        self._holders: dict[int, tuple[float, frozenset[str]]] = {}
        self._version = 0
        self._subscribed = False
        #: set once the change channel is first subscribed (from then on answers are kept)
        self.listening = trio.Event()
        membership.on_removed.append(self._collect_later)
        membership.on_rejoined.append(self._rewrite_later)

    @property
    def me(self) -> str:
        return self.membership.self_name

    @property
    def healthy(self) -> bool:
        return self.health.healthy

    def _tunnels_key(self, agent_id: int) -> str:
        return f"{self.prefix}:tunnels:{{{agent_id}}}"

    def _held_key(self, replica: str) -> str:
        return f"{self.prefix}:held:{{{replica}}}"

    # ---- what the tunnel registry says (sync, never blocks)

    def tunnels_up(self, agent_id: int) -> None:
        self._local.add(agent_id)
        self._dirty[agent_id] = None
        self._wake.set()

    def tunnels_down(self, agent_id: int) -> None:
        self._local.discard(agent_id)
        self._dirty[agent_id] = None
        self._wake.set()

    def _collect_later(self, replicas: list[str]) -> None:
        self._gone.extend(r for r in replicas if r != self.me and r not in self._gone)
        self._wake.set()
        self.fire_all()  # requests waiting on a holder that is gone look again

    def _rewrite_later(self) -> None:
        """This replica was taken for dead (it missed its heartbeats: a stall, a partition) and
        joined again: whoever removed it collects its entries, so they are written again now,
        and once more a heartbeat later in case that collection ran after the first rewrite.
        The periodic refresh stays the last line of defence."""
        self._rewrite = True
        self._wake.set()

    def fire(self, agent_id: int) -> None:
        self._holders.pop(agent_id, None)
        self._version += 1
        super().fire(agent_id)

    def fire_all(self) -> None:
        self._holders.clear()
        self._version += 1
        super().fire_all()

    # ---- what the router asks

    async def holders(self, agent_id: int) -> frozenset[str]:
        """Live members other than this one holding a tunnel of ``agent_id`` now."""
        if not self.health.healthy:
            await trio.lowlevel.checkpoint()
            return frozenset()
        now = trio.current_time()
        cached = self._holders.get(agent_id)
        if cached is not None and now - cached[0] < HOLDERS_MAX_AGE:
            await trio.lowlevel.checkpoint()
            names = cached[1]
        else:
            version = self._version
            try:
                with trio.fail_after(self.read_timeout):
                    names = frozenset(str(n) for n in await self._live_script(keys=[self._tunnels_key(agent_id)], args=[]))
            except REDIS_ERRORS as exc:
                self.health.failed(exc)
                return frozenset()
            if version == self._version and self._subscribed:
                if len(self._holders) >= HOLDERS_CACHED:
                    del self._holders[next(iter(self._holders))]  # the oldest
                self._holders[agent_id] = (now, names)
        members = self.membership.members()
        return frozenset(n for n in names if n in members and n != self.me)

    # ---- the background

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write)
            nursery.start_soon(self._refresh)
            nursery.start_soon(self._listen)
            nursery.start_soon(self._members_changed)
            task_status.started()

    async def _write(self) -> None:
        """The one task that writes this replica's entries (so writes never race each other)."""
        second_pass_at = math.inf
        while True:
            with trio.move_on_at(second_pass_at):
                await self._wake.wait()
            self._wake = trio.Event()
            if trio.current_time() >= second_pass_at:
                second_pass_at = math.inf
                await self._reannounce()
            gone, self._gone = self._gone, []
            if gone:
                await self._collect(gone)
            if self._rewrite:
                self._rewrite = False
                await self._reannounce()
                second_pass_at = trio.current_time() + self.membership.heartbeat_interval
            while self._dirty:
                agent_id = next(iter(self._dirty))
                del self._dirty[agent_id]
                # The registry may have flipped again since it asked: write what is true now.
                await self._guard(self._announce(agent_id, agent_id in self._local))

    async def _reannounce(self) -> None:
        """Every local agent written again and announced: requests waiting elsewhere wake at once."""
        if await self._guard(self._register_all()):
            for agent_id in list(self._local):
                await self._guard(self.client.publish(self.channel, f"{agent_id} + {self.me}"))
            self.fire_all()

    async def _announce(self, agent_id: int, up: bool) -> None:
        key = self._tunnels_key(agent_id)
        if up:
            # The held set first (what collection and a restart's cleanup go by): crashing between
            # the two leaves a held agent without an entry (harmless), never an entry nothing
            # would delete before it expires. Then written and announced in one script.
            await self.client.sadd(self._held_key(self.me), [str(agent_id)])
            await self._up_script(keys=[key], args=[self.me, int(self.tunnel_ttl * 1000), self.channel,
                                                   f"{agent_id} + {self.me}"])
        else:
            await self.client.hdel(key, [self.me])
            await self.client.publish(self.channel, f"{agent_id} - {self.me}")
            await self.client.srem(self._held_key(self.me), [str(agent_id)])

    async def _register_all(self) -> None:
        """Every local agent written again (a refresh, or Redis came back empty)."""
        held = self._held_key(self.me)
        for agent_id in list(self._local):
            await self._up_script(keys=[self._tunnels_key(agent_id)], args=[self.me, int(self.tunnel_ttl * 1000), "", ""])
        if self._local:
            await self.client.sadd(held, [str(a) for a in self._local])
        # Agents whose last tunnel here went while Redis was away: their entries go now, so no
        # other replica forwards to this one for them until the entries would have expired.
        for agent in set(await self.client.smembers(held)) - {str(a) for a in self._local}:
            await self.client.hdel(f"{self.prefix}:tunnels:{{{agent}}}", [self.me])
            await self.client.srem(held, [agent])
            await self.client.publish(self.channel, f"{agent} - {self.me}")
        await self.client.pexpire(held, int(self.tunnel_ttl * 2000))

    async def _refresh(self) -> None:
        """Refresh every ``tunnel_ttl / 3``; re-register (and announce) at once when Redis returns.

        The first refresh runs at once: the entries a previous run of this replica (same name) left
        behind, crashed or killed, go before any peer forwards a request here for them."""
        await self._guard(self._register_all())
        while True:
            returned = self.health.returned
            with trio.move_on_after(self.tunnel_ttl / 3):
                await returned.wait()
            if returned.is_set():
                await self._reannounce()
            else:
                await self._guard(self._register_all())

    async def withdraw(self) -> None:
        """This replica is leaving: its entries go now (not at their expiry), each announced."""
        self._local.clear()
        await self._guard(self._withdraw())

    async def _withdraw(self) -> None:
        held = self._held_key(self.me)
        for agent in await self.client.smembers(held):
            await self.client.hdel(f"{self.prefix}:tunnels:{{{agent}}}", [self.me])
            await self.client.publish(self.channel, f"{agent} - {self.me}")
        await self.client.delete([held])

    async def _collect(self, replicas: list[str]) -> None:
        """Delete the tunnel entries of replicas that stopped heartbeating (this one removed them)."""
        for replica in replicas:

            async def collect(replica: str = replica) -> None:
                held = self._held_key(replica)
                agents = await self.client.smembers(held)
                for agent in agents:
                    await self.client.hdel(f"{self.prefix}:tunnels:{{{agent}}}", [replica])
                    await self.client.publish(self.channel, f"{agent} - {replica}")
                await self.client.delete([held])
                log.info("collected the tunnel entries of a gone replica replica=%s agents=%d", replica, len(agents))

            await self._guard(collect())

    async def _guard(self, work: Any) -> bool:
        try:
            with trio.fail_after(self.write_timeout):
                await work
        except REDIS_ERRORS as exc:
            self.health.failed(exc)
            return False
        self.health.succeeded()
        return True

    async def _listen(self) -> None:
        async def subscribed() -> None:
            # From now on every change is heard; what was read before (and changes missed while a
            # lost subscription was made again) must be read afresh.
            self._subscribed = True
            self.fire_all()
            self.listening.set()

        async def message(text: str) -> None:
            agent, _, _ = text.partition(" ")
            with contextlib.suppress(InvalidNumber):  # not one of ours: nothing to wake
                self.fire(parse_id(agent, "agent id"))

        def lost(_: BaseException) -> None:
            self._subscribed = False
            self.fire_all()

        try:
            await follow(self.client, self.channel, subscribed=subscribed, message=message, lost=lost,
                         delay=self.resubscribe_pause)
        finally:
            self._subscribed = False

    async def _members_changed(self) -> None:
        while True:
            await self.membership.wait_changed()
            self.fire_all()  # a holder left (or came): waiting requests look again


__all__ = ["MemoryDirectory", "RedisDirectory", "TunnelDirectory"]
