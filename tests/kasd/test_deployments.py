"""Environments and their deployment history in kasd's store (``kasd.store.deployments``): what a CI
job deployed where, kept in SQLite for a lone kasd (surviving a restart) and in Redis for replicas
(every replica reading what another wrote), filtered by project, group and tier, stopped and used
again, and purged past the retention and the cap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from kasd.store.deployments import Deployment, HistoryLimits
from kasd.store.redis import RedisStore
from kasd.store.sqlite import SqliteStore
from routing.redisconn import open_redis
from tests.kasd.storeopeners import Opener, store_opener
from tests.redisproc import RedisProcess

pytestmark = pytest.mark.timeout(30)

NOW = 1_800_000_000.0
DAY = 86400.0
#: a job id past 2^53: Lua's numbers (doubles) would round it
BIG_JOB = 9_007_199_254_740_993


def deployment(**changes: Any) -> Deployment:
    base = Deployment(project_id=42, project="group/app", environment="review/feat-x", slug="review-feat-x-abc123",
                      tier="development", agent_id=5, namespaces=("app",), job_id=100, pipeline_id=7, ref="feat-x",
                      user="alice", at=NOW)
    return attrs.evolve(base, **changes)




@pytest.fixture(params=["sqlite", "redis", "redis-cluster"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens a client of one store: the same SQLite file each time (a restart), or another client of
    one Redis (another replica), plain and as a 3-master cluster."""
    return store_opener(request, request.param, tmp_path, max_entries=10,
                        history=HistoryLimits(retention=30 * DAY, max_deployments=3))


async def test_a_deployment_is_kept_merged_and_read_back_by_another_client(opener: Opener) -> None:
    async with opener() as one:
        env = await one.record_deployment(deployment())
        assert (env.state, env.agents, env.namespaces, env.tier) == ("available", (5,), ("app",), "development")
        # the same job writes into another namespace: the same deployment, grown; its first use kept
        again = await one.record_deployment(deployment(namespaces=("app", "cache"), at=NOW + 5))
        assert again.id == env.id and again.namespaces == ("app", "cache") and again.created_at == NOW
        # another job, through another agent, of the same environment; a big job id survives
        await one.record_deployment(deployment(job_id=BIG_JOB, agent_id=6, namespaces=("web",), at=NOW + 10))
        other = await one.record_deployment(deployment(project_id=43, project="group/sub/api", environment="production",
                                                       slug="production", tier="production", at=NOW + 20))
        await one.record_deployment(deployment(project_id=44, project="groupie/app", environment="production",
                                               slug="production", tier="production", at=NOW + 30))
        assert other.id != env.id
    async with opener() as two:  # after a restart (SQLite), or on another replica (Redis)
        read = await two.environment_named(42, "review/feat-x")
        assert read is not None and read.id == env.id
        assert (read.agents, read.namespaces, read.updated_at) == ((5, 6), ("app", "cache", "web"), NOW + 10)
        assert read.last_deployment is not None and read.last_deployment.job_id == BIG_JOB
        assert await two.environment(env.id) == read
        history = await two.deployments(env.id)
        assert [(d.job_id, d.agent_id, d.namespaces) for d in history] == [
            (BIG_JOB, 6, ("web",)), (100, 5, ("app", "cache"))]
        assert history[1] == deployment(namespaces=("app", "cache"))
        assert [d.job_id for d in await two.deployments(env.id, limit=1)] == [BIG_JOB]
        # a group and its subgroups (not a group whose path merely starts alike); a tier
        in_group = await two.environments(project_prefix="group/")
        assert [e.project for e in in_group] == ["group/app", "group/sub/api"]
        assert [e.project for e in await two.environments(tier="production")] == ["group/sub/api", "groupie/app"]
        assert [e.id for e in await two.environments(project_prefix="GROUP/", tier="production")] == [other.id]
        assert [e.name for e in await two.environments(project_id=42)] == ["review/feat-x"]
        assert await two.environment_named(42, "nope") is None and await two.environment(999) is None


async def test_two_replicas_recording_one_job_at_once_merge_never_overwrite(opener: Opener) -> None:
    async with opener() as one, opener() as two, trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(one.record_deployment, deployment(namespaces=(f"a{i}",)))
            nursery.start_soon(two.record_deployment, deployment(namespaces=(f"b{i}",)))
    async with opener() as three:
        env = await three.environment_named(42, "review/feat-x")
        assert env is not None and len(env.namespaces) == 20
        assert [len(d.namespaces) for d in await three.deployments(env.id)] == [20]


async def test_a_stopped_environment_is_marked_not_forgotten_and_available_when_used_again(opener: Opener) -> None:
    async with opener() as store:
        env = await store.record_deployment(deployment())
        stopped = await store.mark_stopped(42, "review/feat-x", NOW + 60, job_id=200)
        assert stopped is not None and (stopped.state, stopped.stopped_at, stopped.id) == ("stopped", NOW + 60, env.id)
        assert stopped.namespaces == ("app",)  # its history stays
        assert [e.name for e in await store.environments(state="stopped")] == ["review/feat-x"]
        assert await store.environments(state="available") == []
        # the stop job's own requests (recorded late, through the queue) do not make it available
        late = await store.record_deployment(deployment(job_id=200, at=NOW + 50))
        assert late.state == "stopped"
        used = await store.record_deployment(deployment(job_id=300, at=NOW + 120))
        assert (used.state, used.stopped_at, used.id) == ("available", None, env.id)
        assert await store.mark_stopped(42, "never-deployed", NOW) is None


async def test_history_past_the_retention_or_the_cap_is_purged(opener: Opener) -> None:
    async with opener() as store:
        env = await store.record_deployment(deployment(job_id=1, at=NOW))
        for job in (2, 3, 4):  # the cap is 3: job 1 goes at once
            await store.record_deployment(deployment(job_id=job, at=NOW + job))
        assert [d.job_id for d in await store.deployments(env.id)] == [4, 3, 2]
        gone = await store.record_deployment(deployment(environment="review/gone", slug="review-gone", at=NOW))
        await store.mark_stopped(42, "review/gone", NOW + 1, job_id=9)
        kept = await store.record_deployment(deployment(environment="prod", slug="prod", job_id=5, at=NOW + 40 * DAY))
        # 31 days on: the old deployments go, but an available environment keeps its newest
        assert await store.purge_history(NOW + 31 * DAY) == 2 + 2  # jobs 2 and 3; review/gone and its one deployment
        assert [d.job_id for d in await store.deployments(env.id)] == [4]
        env_now = await store.environment(env.id)
        assert env_now is not None and env_now.namespaces == ("app",) and env_now.state == "available"
        assert await store.environment(gone.id) is None and await store.environment_named(42, "review/gone") is None
        assert await store.environment(kept.id) is not None
        assert await store.purge_history(NOW + 31 * DAY) == 0
        # used again, the forgotten environment is a new one, with a new id (ids are never reused)
        again = await store.record_deployment(deployment(environment="review/gone", slug="review-gone", job_id=6,
                                                         at=NOW + 32 * DAY))
        assert again.id not in (env.id, gone.id, kept.id) and again.state == "available"


async def test_the_redis_keys_carry_one_hash_tag(redis_server: RedisProcess) -> None:
    redis_server.command("FLUSHALL")
    async with open_redis(redis_server.url) as client:
        await RedisStore(client, key_prefix="kasd", max_entries=10).record_deployment(deployment())
    keys = redis_server.command("KEYS", "*")
    assert b"kasd:environments:{envs}:records" in keys and b"kasd:environments:{envs}:deployments:1" in keys


def test_a_sqlite_store_writes_off_the_event_loop(tmp_path: Path) -> None:
    """Every statement runs in a worker thread: while one waits for the connection, the loop runs on
    (were it on the loop's thread, the lock held here would hang the loop, and the test's time cap end it)."""
    store = SqliteStore.open_sync(tmp_path / "k.db", max_entries=10)

    async def main() -> None:
        done = trio.Event()

        async def record() -> None:
            await store.record_deployment(deployment())
            done.set()

        async with trio.open_nursery() as nursery:
            store._lock.acquire()  # another statement holds the connection
            nursery.start_soon(record)
            await trio.testing.wait_all_tasks_blocked()
            assert not done.is_set()
            store._lock.release()
            with trio.fail_after(5):
                await done.wait()
        await store.aclose()

    trio.run(main)


async def test_the_history_kept_is_a_setting_the_store_is_opened_with(tmp_path: Path) -> None:
    from kasd.config import ConfigError
    from kasd.store.revocation import open_store
    from tests.kasd.helpers import make_config

    config = make_config({"store": {"path": str(tmp_path / "k.db")},
                          "environments": {"history_retention": "36h", "max_deployments": 5}})
    async with open_store(config) as store:
        assert isinstance(store, SqliteStore)
        assert store.history == HistoryLimits(retention=36 * 3600, max_deployments=5)
    with pytest.raises(ConfigError, match=r"^environments\.history_retention: '3x' is not a duration \(seconds, or "
                                          r"a number with s, m, h or d: 90d\)"):
        make_config({"environments": {"history_retention": "3x"}})


async def test_hostile_environment_names_and_paths_are_kept_exactly_under_one_hash_tag(opener: Opener) -> None:
    # what a token's claims may say (GitLab allows 255 characters in a name): braces (Redis hash
    # tags), newlines, the key separator, non-ASCII, a NUL
    names = ["{envs}\n:x}", "é" * 255, "a:b:c", "x\x00y", "}" * 40 + "{"]
    async with opener() as one:
        recorded = [await one.record_deployment(deployment(environment=name, slug=f"s{i}", project="g/{a}\n",
                                                           at=NOW + i)) for i, name in enumerate(names)]
    async with opener() as two:
        for env, name in zip(recorded, names, strict=True):
            read = await two.environment_named(42, name)
            assert read is not None and read.id == env.id and read.name == name and read.project == "g/{a}\n"
        assert len({e.id for e in recorded}) == len(names)
        assert sorted(e.name for e in await two.environments(project_id=42)) == sorted(names)
