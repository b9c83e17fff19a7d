"""The tunnel directory in a real Redis (single server and Cluster): who holds which agent, change
notices by pub/sub, a crashed replica's entries ignored and collected, Redis away and back — and a
stateful hypothesis model of all of it."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from routing.directory import MemoryDirectory, RedisDirectory
from routing.membership import Member, RedisMembership
from routing.redisconn import RedisHealth, open_redis
from tests.redisproc import RedisProcess

HB = 0.25  # a member's TTL is 2 beats: 0.5 s, well above a loaded test machine's stalls
TTL = 1.0
pytestmark = pytest.mark.timeout(60)


class Replica:
    def __init__(self, membership: RedisMembership, directory: RedisDirectory, scope: trio.CancelScope,
                 done: trio.Event) -> None:
        self.membership = membership
        self.directory = directory
        self.scope = scope
        self.done = done

    async def crash(self) -> None:
        """Gone without a goodbye (its tasks end, nothing is unregistered)."""
        self.scope.cancel()
        await self.done.wait()

    @property
    def name(self) -> str:
        return self.membership.self_name


@asynccontextmanager
async def replicas(url: str, names: list[str]) -> AsyncIterator[dict[str, Replica]]:
    async with trio.open_nursery() as nursery:
        made: dict[str, Replica] = {}
        for name in names:
            made[name] = await nursery.start(_replica, url, name)
        with trio.fail_after(10):  # subscribed: a change notice from now on is heard (and no waiter
            for replica in made.values():  # is woken by the subscription itself)
                await replica.directory.listening.wait()
        yield made
        nursery.cancel_scope.cancel()


async def _replica(url: str, name: str, tunnel_ttl: float = TTL, *, task_status: trio.TaskStatus[Replica]) -> None:
    done = trio.Event()
    with trio.CancelScope() as scope:
        health = RedisHealth(url)
        async with open_redis(url) as client, trio.open_nursery() as nursery:
            membership = RedisMembership(client, Member(name=name, private_url=f"http://{name}"), health=health,
                                         heartbeat_interval=HB)
            directory = RedisDirectory(client, membership, health=health, tunnel_ttl=tunnel_ttl)
            await nursery.start(membership.run)
            await nursery.start(directory.run)
            try:
                task_status.started(Replica(membership, directory, scope, done))
                await trio.sleep_forever()
            finally:
                done.set()


async def eventually(check: Callable[[], Any], bound: float) -> None:
    """Await ``check()`` until it is truthy, at most ``bound`` seconds. The state is Redis's, which
    signals nothing to a test, so it is polled (bounded)."""
    with trio.fail_after(bound):
        while not await check():  # noqa: ASYNC110 - polling another process's state, bounded
            await trio.sleep(0.01)


async def test_holders_and_change_notices(redis_url: str) -> None:
    async with replicas(redis_url, ["a:1", "b:1", "c:1"]) as r:
        a, b, c = r["a:1"], r["b:1"], r["c:1"]
        await eventually(lambda: _all_see(r), 1)
        changed = b.directory.changed(7)
        assert await b.directory.holders(7) == frozenset()
        a.directory.tunnels_up(7)
        with trio.fail_after(1):
            await changed.wait()  # pub/sub: no polling loop
        assert await b.directory.holders(7) == {"a:1"}
        assert await a.directory.holders(7) == frozenset()  # never itself
        c.directory.tunnels_up(7)
        await eventually(lambda: _eq(b.directory.holders(7), {"a:1", "c:1"}), 1)
        a.directory.tunnels_down(7)
        await until_holders(b, 7, {"c:1"}, 1)  # woken by the notices (c's own "+" may come first)


async def until_holders(replica: Replica, agent: int, want: set[str], bound: float) -> None:
    """Event-driven: look again at each change notice for ``agent`` until the holders are ``want``."""
    with trio.fail_after(bound):
        while True:
            changed = replica.directory.changed(agent)
            if await replica.directory.holders(agent) == want:
                return
            await changed.wait()


async def _all_see(r: dict[str, Replica]) -> bool:
    await trio.lowlevel.checkpoint()
    return all(set(x.membership.members()) == set(r) for x in r.values())


async def _eq(awaitable: Any, want: set[str]) -> bool:
    return bool(await awaitable == want)


async def test_a_crashed_replica_is_ignored_then_collected(redis_server: RedisProcess) -> None:
    redis_server.command("FLUSHALL")
    async with replicas(redis_server.url, ["a:1", "b:1"]) as r:
        a, b = r["a:1"], r["b:1"]
        await eventually(lambda: _all_see(r), 1)
        a.directory.tunnels_up(9)
        await eventually(lambda: _eq(b.directory.holders(9), {"a:1"}), 1)
        changed = b.directory.changed(9)
        await a.crash()
        with trio.fail_after(3 * HB + 0.5):
            await changed.wait()  # told when the member expired
        assert await b.directory.holders(9) == frozenset()
        # b removed a from the members, so b collected a's entries
        await eventually(lambda: _no_key(redis_server, "kasd:held:{a:1}"), 1)
        assert b"a:1" not in redis_server.command("HGETALL", "kasd:tunnels:{9}")


async def _no_key(server: RedisProcess, key: str) -> bool:
    await trio.lowlevel.checkpoint()
    return server.command("EXISTS", key).startswith(b":0")


async def test_redis_restarted_empty_everything_is_registered_again(redis_server: RedisProcess) -> None:
    redis_server.command("FLUSHALL")
    async with replicas(redis_server.url, ["a:1", "b:1"]) as r:
        a, b = r["a:1"], r["b:1"]
        a.directory.tunnels_up(5)
        await eventually(lambda: _eq(b.directory.holders(5), {"a:1"}), 1)
        redis_server.stop()
        assert await b.directory.holders(5) in (frozenset(), {"a:1"})  # never raises
        await eventually(lambda: _unhealthy(b), 10)
        assert await b.directory.holders(5) == frozenset()
        changed = b.directory.changed(5)
        redis_server.start()  # empty
        with trio.fail_after(10):
            await changed.wait()
        await eventually(lambda: _eq(b.directory.holders(5), {"a:1"}), 5)


async def _collected(client: Any, agent: int, replica: str) -> bool:
    return not await client.hexists(f"kasd:tunnels:{{{agent}}}", replica)


async def _unhealthy(replica: Replica) -> bool:
    await trio.lowlevel.checkpoint()
    return not replica.directory.healthy


async def test_the_memory_directory_knows_nobody_else() -> None:
    directory = MemoryDirectory()
    directory.tunnels_up(1)
    assert await directory.holders(1) == frozenset() and directory.healthy


# --------------------------------------------------------------------------- the stateful model

NAMES = ["r0:1", "r1:1", "r2:1"]


class _Loop:
    """One trio loop in a thread for the whole state machine run (hypothesis drives it from sync code)."""

    def __init__(self) -> None:
        self.token: trio.lowlevel.TrioToken | None = None
        self.ready = threading.Event()
        self.stop: trio.Event | None = None
        self.nursery: trio.Nursery | None = None
        threading.Thread(target=trio.run, args=(self._main,), daemon=True).start()
        self.ready.wait(10)

    async def _main(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self.stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            self.ready.set()
            await self.stop.wait()
            nursery.cancel_scope.cancel()

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run(fn, *args, trio_token=self.token)

    def close(self) -> None:
        assert self.stop is not None
        trio.from_thread.run_sync(self.stop.set, trio_token=self.token)


class DirectoryModel(RuleBasedStateMachine):
    """Replicas register and drop tunnels, crash and come back, Redis restarts empty. Whatever
    happened, every live replica's view settles within a bound to the truth: it names exactly
    the other live replicas that hold a tunnel — never a crashed one, never forgetting a live one."""

    server: RedisProcess
    loop: _Loop

    @initialize()
    def start(self) -> None:
        self.server.command("FLUSHALL")
        self.live: dict[str, Replica] = {}
        self.held: dict[str, set[int]] = {}
        for name in NAMES:
            self._start(name)

    def _start(self, name: str) -> None:
        assert self.loop.nursery is not None
        self.live[name] = self.loop.run(self.loop.nursery.start, _replica, self.server.url, name)
        self.held[name] = set()

    @rule(replica=st.sampled_from(NAMES), agent=st.integers(1, 3))
    def tunnel_up(self, replica: str, agent: int) -> None:
        if replica in self.live and agent not in self.held[replica]:
            self.held[replica].add(agent)
            self.loop.run(_sync, self.live[replica].directory.tunnels_up, agent)

    @rule(replica=st.sampled_from(NAMES), agent=st.integers(1, 3))
    def tunnel_down(self, replica: str, agent: int) -> None:
        if replica in self.live and agent in self.held[replica]:
            self.held[replica].discard(agent)
            self.loop.run(_sync, self.live[replica].directory.tunnels_down, agent)

    @rule(replica=st.sampled_from(NAMES))
    def crash(self, replica: str) -> None:
        if replica in self.live and len(self.live) > 1:
            self.loop.run(self.live.pop(replica).crash)
            del self.held[replica]

    @rule(replica=st.sampled_from(NAMES))
    def come_back(self, replica: str) -> None:
        if replica not in self.live:
            self._start(replica)

    @rule()
    def redis_restarts_empty(self) -> None:
        self.server.restart()

    def teardown(self) -> None:
        for replica in getattr(self, "live", {}).values():  # the next example starts from nothing
            self.loop.run(replica.crash)

    @invariant()
    def every_view_settles_to_the_truth(self) -> None:
        if not hasattr(self, "live"):
            return
        self.loop.run(self._settled)

    async def _settled(self) -> None:
        # bound: a crashed member's TTL (2 heartbeats) + a heartbeat to notice Redis back + slack
        wrong: list[tuple[str, int, set[str], set[str]]] = []
        with trio.move_on_after(2.0 + 3 * HB):
            while True:
                wrong = []
                for observer in self.live.values():
                    for agent in (1, 2, 3):
                        want = {n for n, held in self.held.items() if agent in held and n != observer.name}
                        got = await observer.directory.holders(agent)
                        if got != want:
                            wrong.append((observer.name, agent, set(got), want))
                if not wrong:
                    return
                await trio.sleep(0.02)
        raise AssertionError(f"views that did not settle (observer, agent, named, truth): {wrong}")


async def _sync(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def test_the_directory_model(redis_server: RedisProcess) -> None:
    loop = _Loop()
    DirectoryModel.server = redis_server
    DirectoryModel.loop = loop
    try:
        run = DirectoryModel.TestCase()
        run.settings = settings(max_examples=6, stateful_step_count=8, deadline=None,
                                suppress_health_check=list(HealthCheck))
        run.runTest()
    finally:
        loop.close()


async def test_a_leaving_replica_withdraws_its_entries_at_once(redis_server: RedisProcess) -> None:
    redis_server.command("FLUSHALL")
    async with replicas(redis_server.url, ["a:1", "b:1"]) as r:
        a, b = r["a:1"], r["b:1"]
        a.directory.tunnels_up(4)
        await eventually(lambda: _eq(b.directory.holders(4), {"a:1"}), 1)
        changed = b.directory.changed(4)
        await a.directory.withdraw()
        with trio.fail_after(1):
            await changed.wait()  # announced, not left to expire
        assert b"a:1" not in redis_server.command("HGETALL", "kasd:tunnels:{4}")
        assert redis_server.command("EXISTS", "kasd:held:{a:1}").startswith(b":0")


async def test_a_replica_taken_for_dead_registers_its_tunnels_again(redis_url: str) -> None:
    """a stalls past its TTL (its heartbeat stops; its tunnels stay up); b finds it expired and
    collects its entries; a beats again: its tunnels are registered and announced at once, not
    at the next refresh (``tunnel_ttl / 3`` = 10 s here)."""
    async with replicas(redis_url, ["b:1"]) as r, open_redis(redis_url) as client, trio.open_nursery() as nursery:
        b = r["b:1"]
        health = RedisHealth(redis_url)
        membership = RedisMembership(client, Member(name="a:1", private_url="http://a:1"), health=health,
                                     heartbeat_interval=HB)
        directory = RedisDirectory(client, membership, health=health, tunnel_ttl=30.0)
        beating = trio.CancelScope()

        async def heartbeat(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with beating:
                await membership.run(task_status=task_status)

        await nursery.start(heartbeat)
        await nursery.start(directory.run)
        directory.tunnels_up(11)
        await until_holders(b, 11, {"a:1"}, 2)
        beating.cancel()  # the stall: no goodbye, the tunnels stay
        await until_holders(b, 11, set(), 3 * HB + 0.5)  # expired
        await eventually(lambda: _collected(client, 11, "a:1"), 2)  # and its entry deleted by b
        beating = trio.CancelScope()
        await nursery.start(heartbeat)  # a beats again
        await until_holders(b, 11, {"a:1"}, 2)
        nursery.cancel_scope.cancel()


async def test_a_restarted_replica_drops_what_its_previous_run_left_at_once(redis_url: str) -> None:
    """a is killed and started again under the same name before its entries expire: the new run
    holds no tunnel, so peers must not forward to it; its first refresh (at once, not after
    ``tunnel_ttl / 3``) deletes and announces the stale entries."""
    async with replicas(redis_url, ["b:1"]) as r, trio.open_nursery() as nursery:
        b = r["b:1"]
        first = await nursery.start(_replica, redis_url, "a:1", 30.0)
        first.directory.tunnels_up(6)
        await until_holders(b, 6, {"a:1"}, 2)
        await first.crash()  # no goodbye: its entries stay (for 30 s)
        await nursery.start(_replica, redis_url, "a:1", 30.0)  # back before its member TTL ran out
        await until_holders(b, 6, set(), 2)  # at once: tunnel_ttl / 3 would be 10 s
        assert await b.directory.holders(6) == frozenset()
        nursery.cancel_scope.cancel()


def _script_calls(server: RedisProcess) -> int:
    stats = server.command("INFO", "commandstats").decode()
    return sum(int(line.split("calls=")[1].split(",")[0]) for line in stats.splitlines()
               if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")))


async def test_holders_are_read_from_redis_again_only_after_a_change(redis_server: RedisProcess) -> None:
    """A forwarded request must not cost a Redis round trip each: the answer is kept until a
    change notice (or HOLDERS_MAX_AGE) says it may be stale."""
    redis_server.command("FLUSHALL")
    async with replicas(redis_server.url, ["a:1", "b:1"]) as r:
        a, b = r["a:1"], r["b:1"]
        a.directory.tunnels_up(8)
        await until_holders(b, 8, {"a:1"}, 2)
        before = _script_calls(redis_server)
        for _ in range(50):
            assert await b.directory.holders(8) == {"a:1"}
        assert _script_calls(redis_server) - before <= 2  # (a heartbeat script may run meanwhile)
        a.directory.tunnels_down(8)
        await until_holders(b, 8, set(), 1)  # the notice made b ask again


async def test_an_answer_read_before_the_subscription_is_never_kept(redis_server: RedisProcess) -> None:
    """A change announced before a replica has subscribed is never heard: what it read then must be
    read again, not trusted for HOLDERS_MAX_AGE (a replica just started forwarded to nobody)."""
    redis_server.command("FLUSHALL")
    async with replicas(redis_server.url, ["a:1"]) as r, open_redis(redis_server.url) as client, \
            trio.open_nursery() as nursery:
        health = RedisHealth(redis_server.url)
        membership = RedisMembership(client, Member(name="b:1", private_url="http://b:1"), health=health,
                                     heartbeat_interval=HB)
        await nursery.start(membership.run)
        b = RedisDirectory(client, membership, health=health, tunnel_ttl=TTL)  # not run: not subscribed
        assert await b.holders(6) == frozenset()
        r["a:1"].directory.tunnels_up(6)
        await eventually(lambda: _sync(lambda: b"a:1" in redis_server.command("HGETALL", "kasd:tunnels:{6}")), 2)
        assert await b.holders(6) == {"a:1"}
        nursery.cancel_scope.cancel()


async def test_a_change_notice_naming_no_valid_agent_id_is_ignored(redis_url: str) -> None:
    # '²' passes str.isdigit() and fails int(); so does a 5,000-digit id: the listener goes on.
    async with replicas(redis_url, ["a:1"]) as r, open_redis(redis_url) as client:
        directory = r["a:1"].directory
        changed = directory.changed(7)
        for junk in ("² + x:1", "7" * 5000 + " + x:1", "007 + x:1", "7 + x:1"):
            await client.publish(directory.channel, junk)
        with trio.fail_after(2):
            await changed.wait()


class _HangingRedis:
    """A Redis that never answers (a stalled server, a partition that drops packets)."""

    def register_script(self, source: str) -> Any:
        async def script(**kwargs: Any) -> Any:
            await trio.sleep_forever()

        return script


class _Members:
    self_name = "a:1"
    heartbeat_interval = 1.0

    def __init__(self) -> None:
        self.on_removed: list[Any] = []
        self.on_rejoined: list[Any] = []

    def members(self) -> dict[str, Member]:
        return {}


async def test_the_caller_sets_how_long_a_holders_read_may_take(autojump_clock: trio.testing.MockClock) -> None:
    health = RedisHealth("redis://127.0.0.1:1")
    directory = RedisDirectory(_HangingRedis(), _Members(), health=health, read_timeout=7.0)  # type: ignore[arg-type]
    started = trio.current_time()
    assert await directory.holders(1) == frozenset()  # Redis away: nobody else, the request waits locally
    assert trio.current_time() - started == pytest.approx(7.0)
    assert not directory.healthy and health.outages == 1
