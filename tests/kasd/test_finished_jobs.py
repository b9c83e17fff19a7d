"""A job token dies with its job: ``PUT /api/v4/jobs/:id`` with the job's own token records the job
as finished in kasd's store (SQLite alone, Redis among replicas), and every replica refuses the job's
tokens — on the proxy port (a Kubernetes Status 401) and on the REST API (401) — until the last of
them would have expired anyway, when the record is purged."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import trio

from kasd.authz.verdict import AccessDenied
from kasd.config import ConfigError
from kasd.restpaths import ALLOWED_AGENTS_PATH, finish_path
from kasd.store.finished import FinishedJobs, TooManyFinishedJobs, finished_until
from kasd.store.protocol import StoreError
from kasd.store.redis import RedisStore
from kasd.store.revocation import Revocations, sqlite_path
from kasd.store.sqlite import SqliteStore
from routing.redisconn import open_redis
from tests.kasd.helpers import (
    AUTH,
    CI_SECRET,
    CI_TOKEN,
    bearer,
    http_request,
    make_config,
    running_kasd,
)
from tests.kasd.storeopeners import flushed_redis_url
from tests.redisproc import RedisProcess

pytestmark = pytest.mark.timeout(30)

NOW = 1_800_000_000.0
DAY = 24 * 3600


def _api_config() -> Any:
    return make_config({"listeners": {
        "agent": {"address": "127.0.0.1:0"}, "observability": {"address": "127.0.0.1:0"},
        "kubernetes_api": {"address": "127.0.0.1:0"}, "api": {"address": "127.0.0.1:0"},
    }})


async def _json(port: int, method: str, path: str, headers: list[tuple[str, str]]) -> tuple[int, Any]:
    reply = await http_request(port, method, path, headers)
    return reply.status, json.loads(reply.body)


# ------------------------------------------------------------------ the pure core


def test_a_finished_job_is_kept_until_the_latest_until_then_purged() -> None:
    jobs = FinishedJobs(max_entries=2)
    seen: list[int] = []
    jobs.on_change.append(lambda: seen.append(jobs.version))
    assert jobs.record(7, 100) and not jobs.record(7, 90)  # an earlier until never shortens it
    assert jobs.record(7, 120) and jobs.until(7, 119) == 120 and jobs.until(7, 120) is None
    jobs.record(8, 50)
    with pytest.raises(TooManyFinishedJobs, match="2 finished jobs already"):
        jobs.record(9, 200)  # full: refused, never an old entry forgotten
    assert jobs.purge(60) == 1 and len(jobs) == 1 and jobs.record(9, 200)
    assert seen == [1, 2, 3, 4, 5]
    # what the store holds joins the map (the later until wins); what the map knows better is returned
    assert jobs.merge({7: 130, 9: 150, 10: 40}, now=60) == {9: 200}
    assert (jobs.until(7, 60), jobs.until(10, 60)) == (130, None)
    # a revocation outlasts every token kasd would still accept: issued now (clocks a leeway
    # ahead), living the longest lifetime allowed, accepted a leeway past its exp
    assert finished_until(NOW, max_lifetime=DAY, leeway=60) == NOW + DAY + 120


# ------------------------------------------------------------------ the stores


def test_the_sqlite_store_keeps_finished_jobs_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "state" / "kasd.sqlite3"

    async def main() -> None:
        store = SqliteStore.open_sync(path, max_entries=2, clock=lambda: NOW)
        await store.finish_job(7, int(NOW) + 100)
        await store.finish_job(7, int(NOW) + 50)  # the later until stays
        await store.finish_job(8, int(NOW) + 10)
        with pytest.raises(StoreError, match="2 finished jobs already"):
            await store.finish_job(9, int(NOW) + 10)
        await store.aclose()
        again = SqliteStore.open_sync(path, max_entries=2, clock=lambda: NOW + 20)
        assert await again.finished_jobs(NOW) == {7: int(NOW) + 100, 8: int(NOW) + 10}
        assert await again.finished_jobs(NOW + 20) == {7: int(NOW) + 100}
        await again.finish_job(9, int(NOW) + 30)  # room again: 8 lapsed and went
        assert await again.purge(NOW + 40) == 1 and await again.finished_jobs(NOW) == {7: int(NOW) + 100}
        view = FinishedJobs()
        async with trio.open_nursery() as nursery:
            await nursery.start(again.run, view)  # started once the view holds the file's entries
            assert view.until(7, NOW + 40) == int(NOW) + 100
            nursery.cancel_scope.cancel()
        await again.aclose()

    trio.run(main)


async def test_the_store_is_where_the_configuration_says_and_an_unusable_one_stops_kasd() -> None:
    default = make_config()
    assert sqlite_path(default, {}) == ":memory:"
    assert sqlite_path(default, {"STATE_DIRECTORY": "/var/lib/kasd"}) == Path("/var/lib/kasd/kasd.sqlite3")
    assert sqlite_path(make_config({"store": {"path": "/srv/k.db"}}), {"STATE_DIRECTORY": "/x"}) == Path("/srv/k.db")
    with pytest.raises(ExceptionGroup) as failed:  # (kasd's main says each as "configuration error", exit 2)
        async with running_kasd(make_config({"store": {"path": "/proc/kasd/kasd.sqlite3"}})):
            pass  # pragma: no cover
    assert failed.group_contains(ConfigError, match=r"^store\.path: cannot open the store /proc/kasd/kasd\.sqlite3: ")


@pytest.fixture
def redis_url(redis_server: RedisProcess) -> str:
    redis_server.command("FLUSHALL")
    return redis_server.url


@pytest.fixture(params=["redis", "redis-cluster"])
def any_redis_url(request: pytest.FixtureRequest) -> str:
    """A single Redis, and a 3-master Redis Cluster (each flushed first)."""
    return flushed_redis_url(request, request.param)


@asynccontextmanager
async def _redis_replica(url: str, nursery: trio.Nursery, *, max_entries: int = 100,
                         clock: Any = lambda: NOW) -> AsyncIterator[tuple[RedisStore, FinishedJobs]]:
    async with open_redis(url) as client:
        store = RedisStore(client, key_prefix="test", max_entries=max_entries, clock=clock)
        view = FinishedJobs(max_entries)
        await nursery.start(store.run, view)
        yield store, view


async def test_the_redis_store_tells_every_replica_within_a_second(any_redis_url: str) -> None:
    redis_url = any_redis_url
    async with trio.open_nursery() as nursery, \
            _redis_replica(redis_url, nursery, max_entries=2) as (one, one_view), \
            _redis_replica(redis_url, nursery, max_entries=2) as (two, two_view):
        heard = trio.Event()
        two_view.on_change.append(heard.set)
        await Revocations(one, one_view, clock=lambda: NOW).finish(7, max_lifetime=100, leeway=0)
        assert one_view.until(7, NOW) == NOW + 100  # the replica that recorded it: at once
        with trio.fail_after(1):
            await heard.wait()
        assert two_view.until(7, NOW) == NOW + 100
        await two.finish_job(8, int(NOW) + 10)
        with pytest.raises(StoreError, match="2 finished jobs already"):
            await one.finish_job(9, int(NOW) + 10)
        assert await one.purge(NOW + 10) == 1 and await two.finished_jobs(NOW) == {7: int(NOW) + 100}
        # a replica that starts later (or resubscribes after an outage) reads the whole set
        async with _redis_replica(redis_url, nursery) as (_, late_view):
            assert late_view.until(7, NOW) == NOW + 100
        nursery.cancel_scope.cancel()


async def test_a_redis_restarted_empty_is_told_again_what_the_replicas_remember(redis_url: str,
                                                                                redis_server: RedisProcess) -> None:
    async with trio.open_nursery() as nursery, _redis_replica(redis_url, nursery) as (store, view):
        await Revocations(store, view, clock=lambda: NOW).finish(7, max_lifetime=100, leeway=0)
        synced = store.synced
        redis_server.restart()  # empty: no persistence; coredis reconnects and subscribes again
        with trio.fail_after(10):
            await synced.wait()
        assert await store.finished_jobs(NOW) == {7: int(NOW) + 100}
        nursery.cancel_scope.cancel()


async def test_with_redis_away_kasd_serves_and_ending_a_job_says_it_could_not(monkeypatch: pytest.MonkeyPatch) -> None:
    from kasctl.redisproc import free_port
    from kasd.store import redis as redis_store

    monkeypatch.setattr(redis_store, "FIRST_SYNC_TIMEOUT", 0.1)
    async with trio.open_nursery() as nursery, open_redis(f"redis://127.0.0.1:{free_port()}/0") as client:
        kasd = await nursery.start(_serve_with, RedisStore(client, max_entries=10))
        status, body = await _json(kasd.port("api"), "PUT", finish_path(7), [("job-token", CI_SECRET)])
        assert status == 503
        assert body["message"].startswith("503 Service Unavailable: the job could not be recorded as finished: "
                                          "Redis unreachable: ")
        assert (await _json(kasd.port("api"), "GET", ALLOWED_AGENTS_PATH, [("job-token", CI_SECRET)]))[0] == 200
        kasd.request_shutdown()


async def test_the_redis_store_key_is_hash_tagged(redis_url: str, redis_server: RedisProcess) -> None:
    async with open_redis(redis_url) as client:
        await RedisStore(client, key_prefix="kasd", max_entries=10, clock=lambda: NOW).finish_job(7, int(NOW) + 5)
    assert b"kasd:finished_jobs:{jobs}" in redis_server.command("KEYS", "*")


# ------------------------------------------------------------------ kasd end to end (in process)


async def test_a_finished_jobs_token_is_refused_on_the_proxy_and_the_rest_api() -> None:
    async with running_kasd(_api_config()) as kasd:
        api, proxy = kasd.port("api"), kasd.port("kubernetes_api")
        token = [("job-token", CI_SECRET)]
        # another job's token may not finish this one
        other = AUTH.job_token("group/app", job_id=70, user="alice")
        assert await _json(api, "PUT", finish_path(7), [("job-token", other)]) == \
            (403, {"message": "403 Forbidden: the job token is for job 70, not 7"})
        assert (await _json(api, "GET", finish_path(7), token))[0] == 405
        assert await _json(api, "PUT", finish_path(7), []) == \
            (401, {"message": "401 Unauthorized: send the job's own CI job token in a Job-Token header"})
        assert (await _json(api, "GET", ALLOWED_AGENTS_PATH, token))[0] == 200
        status, body = await _json(api, "PUT", finish_path(7), token)
        assert status == 200 and body["id"] == 7 and body["status"] == "finished"
        assert body["project"] == "group/app" and body["tokens_refused_until"].endswith("Z")
        refused = "bad token: CI job token revoked: job 7 is finished"
        assert await _json(api, "GET", ALLOWED_AGENTS_PATH, token) == (401, {"message": f"401 Unauthorized: {refused}"})
        # a second token of the same job (minted before or after) is refused too
        again = AUTH.job_token("group/app", job_id=7, user="alice")
        assert (await _json(api, "PUT", finish_path(7), [("job-token", again)]))[0] == 401
        reply = await http_request(proxy, "GET", "/api/v1/namespaces", [bearer(CI_TOKEN)])
        status_body = reply.json()
        assert reply.status == 401 and status_body["kind"] == "Status" and status_body["code"] == 401
        assert refused in status_body["message"]
        # other jobs are untouched
        assert (await _json(api, "GET", ALLOWED_AGENTS_PATH, [("job-token", other)]))[0] == 200
        assert b"\nkasd_finished_jobs 1.0\n" in kasd.metrics.render()


async def test_a_grant_remembered_before_the_job_finished_is_forgotten() -> None:
    """The authority remembers grants per token: finishing the job must not leave one behind."""
    from kasd.seams import Credentials

    async with running_kasd(_api_config()) as kasd:
        credentials = Credentials(kind="ci", agent_id=1, secret=CI_SECRET)
        await kasd.authority.authorize(credentials, 1)  # granted, and remembered
        status, _ = await _json(kasd.port("api"), "PUT", finish_path(7), [("job-token", CI_SECRET)])
        assert status == 200
        with pytest.raises(AccessDenied, match="job 7 is finished"):
            await kasd.authority.authorize(credentials, 1)


async def test_a_revocation_on_one_replica_is_refused_by_another_within_a_second(redis_url: str) -> None:
    """Two kasd replicas sharing one real Redis: finished on one, refused by the other at once."""
    async with trio.open_nursery() as nursery, open_redis(redis_url) as client_a, open_redis(redis_url) as client_b:
        one = await nursery.start(_serve_with, RedisStore(client_a, max_entries=100))
        two = await nursery.start(_serve_with, RedisStore(client_b, max_entries=100))
        heard = trio.Event()
        assert two.revocations is not None
        two.revocations.view.on_change.append(heard.set)
        token = [("job-token", CI_SECRET)]
        assert (await _json(two.port("api"), "GET", ALLOWED_AGENTS_PATH, token))[0] == 200
        assert (await _json(one.port("api"), "PUT", finish_path(7), token))[0] == 200
        with trio.fail_after(1):
            await heard.wait()
        assert (await _json(two.port("api"), "GET", ALLOWED_AGENTS_PATH, token))[0] == 401
        reply = await http_request(two.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
        assert reply.status == 401 and "job 7 is finished" in reply.json()["message"]
        one.request_shutdown()
        two.request_shutdown()


async def _serve_with(store: RedisStore, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
    from kasd.server import serve_kasd

    await serve_kasd(_api_config(), store=store, task_status=task_status)


def test_a_revocation_lapses_once_the_tokens_it_covers_have_expired() -> None:
    """With a fake clock: the job's token is refused as revoked while it would otherwise be valid,
    as expired after, and the record goes once no token of the job could be accepted."""
    from kasd.authority import CiAuthority, config_loader

    clock = [NOW]
    config = make_config({"authorization": {**AUTH.kasd_settings()["authorization"],
                                            "tokens": {"public_keys": [str(AUTH.keys.public)],
                                                       "max_job_token_lifetime": 3600, "leeway": 60}}})
    view = FinishedJobs()
    authority = CiAuthority(config_loader(lambda: (config, None)), clock=lambda: clock[0], finished=view)
    snapshot = authority.snapshot
    token = AUTH.job_token("group/app", job_id=7, ttl=timedelta(hours=1), now=NOW)

    async def main() -> None:
        store = SqliteStore.open_sync(":memory:", max_entries=10, clock=lambda: clock[0])
        until = await Revocations(store, view, clock=lambda: clock[0]).finish(7, max_lifetime=3600, leeway=60)
        assert until == NOW + 3600 + 120
        for at, why in ((NOW + 1, "revoked"), (NOW + 3600 + 59, "revoked"), (NOW + 3600 + 61, "expired")):
            with pytest.raises(AccessDenied, match=why):
                snapshot.verify_job(token, now=at)
        clock[0] = until
        assert view.until(7, clock[0]) is None and view.purge(clock[0]) == 1
        assert await store.purge(clock[0]) == 1 and await store.finished_jobs(NOW) == {}
        await store.aclose()

    trio.run(main)
    # a token minted to live longer than kasd accepts is refused outright: no revocation could cover it
    long_lived = AUTH.job_token("group/app", job_id=8, ttl=timedelta(hours=2), now=NOW)
    with pytest.raises(AccessDenied, match=r"lives longer than kasd accepts \(authorization\.tokens\.max_job_token_lifetime: 3600 s\)"):
        snapshot.verify_job(long_lived, now=NOW + 1)


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_each_store_keeps_the_environment_that_first_had_a_slug(kind: str, tmp_path: Path,
                                                                       request: pytest.FixtureRequest) -> None:
    # production- slugs to production: once production has it, the other is refused, also after a restart
    from kasd.store.environments import EnvironmentSlugs, SlugTaken

    async def claims(store: Any) -> None:
        slugs = EnvironmentSlugs(store)
        assert await slugs.claim(42, "production") == "production"
        assert await slugs.claim(43, "production-") == "production"  # another project: its own slugs
        with pytest.raises(SlugTaken, match="environment 'production-' has the slug 'production' of environment "
                                            "'production' of this project"):
            await slugs.claim(42, "production-")
        fresh = EnvironmentSlugs(store)  # a restarted kasd, or another replica: nothing in memory
        with pytest.raises(SlugTaken):
            await fresh.claim(42, "production-")
        assert await fresh.claim(42, "production") == "production"

    if kind == "sqlite":
        for _ in range(2):
            store = SqliteStore.open_sync(tmp_path / "kasd.sqlite3", max_entries=10)
            try:
                await claims(store)
            finally:
                await store.aclose()
    else:
        url = str(request.getfixturevalue("redis_url"))
        async with open_redis(url) as client:
            await claims(RedisStore(client, key_prefix="test", max_entries=10))


async def test_an_environment_name_longer_than_gitlab_allows_is_refused_not_recorded() -> None:
    from kasd.store.environments import MAX_NAME_LENGTH, EnvironmentSlugs, MemorySlugs, NameTooLong

    store = MemorySlugs()
    slugs = EnvironmentSlugs(store)
    assert await slugs.claim(42, "r" * MAX_NAME_LENGTH)
    with pytest.raises(NameTooLong, match="has 5000 characters; GitLab allows at most 255"):
        await slugs.claim(42, "r" * 5000)
    assert len(store._owners) == 1


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_each_store_keeps_what_kasd_made_until_it_is_deleted(kind: str, tmp_path: Path,
                                                                  request: pytest.FixtureRequest) -> None:
    from kasd.store.made import MadeObjects

    async def check(store: Any, first: bool) -> None:
        made = MadeObjects(store)  # fresh each time: a restarted kasd, or another replica
        if first:
            await made.record(7, "uid-1")
            await made.record(7, "uid-2")
            await made.forget(7, "uid-2")
        assert await made.made(7, "uid-1") and not await made.made(8, "uid-1")
        assert not await made.made(7, "uid-2") and not await made.made(7, None)

    if kind == "sqlite":
        for first in (True, False):
            store = SqliteStore.open_sync(tmp_path / "kasd.sqlite3", max_entries=10)
            try:
                await check(store, first)
            finally:
                await store.aclose()
    else:
        url = str(request.getfixturevalue("redis_url"))
        async with open_redis(url) as client:
            for first in (True, False):
                await check(RedisStore(client, key_prefix="test", max_entries=10), first)
