"""Membership in a real Redis (single server and Cluster): joins and leaves seen within two
heartbeats (at once when announced), a crashed member drops out, draining members leave the ring,
Redis away and back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import trio

from routing.membership import Member, RedisMembership, StaticMembership
from routing.redisconn import RedisHealth, describe, open_redis
from tests.redisproc import RedisProcess

HB = 0.2
pytestmark = pytest.mark.timeout(30)


@asynccontextmanager
async def member(url: str, name: str, **kwargs: object) -> AsyncIterator[RedisMembership]:
    """A member heartbeating until the block ends (then it crashes: no leave) — ``leave`` by hand."""
    async with open_redis(url) as client, trio.open_nursery() as nursery:
        me = Member(name=name, private_url=f"http://{name}", agent_url=f"http://{name}/tunnel")
        membership = RedisMembership(client, me, health=RedisHealth(url), heartbeat_interval=HB, **kwargs)  # type: ignore[arg-type]
        await nursery.start(membership.run)
        yield membership
        nursery.cancel_scope.cancel()


async def until(condition: Callable[[], bool], membership: RedisMembership, bound: float) -> None:
    with trio.fail_after(bound):
        while not condition():
            await membership.wait_changed()


async def test_joins_and_leaves_are_seen_at_once_and_crashes_within_two_heartbeats(redis_url: str) -> None:
    async with member(redis_url, "10.0.0.1:8154") as a:
        async with member(redis_url, "10.0.0.2:8154") as b:
            await until(lambda: set(a.members()) == {"10.0.0.1:8154", "10.0.0.2:8154"}, a, 2 * HB + 0.3)
            assert a.ring == b.ring and len(a.ring) == 2
            assert a.members()["10.0.0.2:8154"].agent_url == "http://10.0.0.2:8154/tunnel"
            await b.leave()  # announced: seen well before a heartbeat
            await until(lambda: set(a.members()) == {"10.0.0.1:8154"}, a, HB)
        async with member(redis_url, "10.0.0.3:8154"):
            await until(lambda: "10.0.0.3:8154" in a.members(), a, 2 * HB + 0.3)
        # c's block ended without leave: a crash. It is gone within two heartbeats (TTL), plus one.
        with trio.fail_after(3 * HB + 0.3):
            await until(lambda: "10.0.0.3:8154" not in a.members(), a, 3 * HB + 0.3)


async def test_a_draining_member_is_off_the_ring_but_still_a_member(redis_url: str) -> None:
    async with member(redis_url, "10.0.0.1:8154") as a, member(redis_url, "10.0.0.2:8154") as b:
        await until(lambda: len(a.ring) == 2, a, 2 * HB + 0.3)
        await b.set_draining()
        await until(lambda: len(a.ring) == 1, a, HB)
        assert a.members()["10.0.0.2:8154"].draining
        assert a.ring.home("1") == "10.0.0.1:8154"


async def test_redis_away_and_back(tmp_path: object, redis_server: RedisProcess) -> None:
    redis_server.command("FLUSHALL")
    async with member(redis_server.url, "10.0.0.1:8154") as a:
        assert a.healthy
        away = a.health.away
        redis_server.stop()
        with trio.fail_after(3 * HB + 5):
            await away.wait()  # the next heartbeat finds Redis gone
        assert not a.healthy
        assert set(a.members()) == {"10.0.0.1:8154"}  # the last table stays (the ring does not flap)
        returned = a.health.returned
        redis_server.start()  # empty
        with trio.fail_after(3 * HB + 5):
            await returned.wait()
        assert a.healthy
        assert b"10.0.0.1:8154" in redis_server.command("ZRANGE", "{kasd}:members", "0", "-1")  # registered again


async def test_static_membership() -> None:
    me = Member(name="a:1")
    static = StaticMembership(me, [Member(name="b:1")])
    assert set(static.members()) == {"a:1", "b:1"} and static.healthy
    with trio.fail_after(1):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(static.wait_changed)
            await trio.testing.wait_all_tasks_blocked()
            await static.set_draining()
    assert len(static.ring) == 1


def test_describe_never_shows_a_password() -> None:
    assert describe("redis://user:hunter2@10.0.0.1:6379/0") == "redis://10.0.0.1:6379/0"
    assert "hunter2" not in describe("rediss://:hunter2@h:1")
