"""Events' queues in kasd's store (``kasd.store.events``): per agent ordered by seq, deduplicated by
id, bounded (QueueFull), expiring, the ended kept for status within bounds; the delivery lease and
the notices. SQLite (a lone kasd, surviving a restart) and Redis (another replica's client reads
what one wrote), each test against both."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from kasd.store import events_sqlite
from kasd.store.events import QueuedEvent, QueueFull
from kasd.store.redis import RedisStore
from kasd.store.sqlite import SqliteStore
from tests.kasd.storeopeners import Opener, store_opener

pytestmark = pytest.mark.timeout(30)

NOW = 1_800_000_000.25
LIMITS: dict[str, Any] = {"max_queued": 3, "ttl": 3600.0, "keep_for": 3600.0, "max_kept": 2}



@pytest.fixture(params=["sqlite", "redis", "redis-cluster"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    return store_opener(request, request.param, tmp_path, max_entries=10)


def event(n: int, agent_id: int = 5, at: float = NOW) -> QueuedEvent:
    return QueuedEvent(agent_id=agent_id, id=f"ev-{n}", type="push", payload=f'{{"n": {n}, "ü": "x"}}', posted_at=at + n)


async def test_events_queue_in_order_dedup_by_id_and_end_with_their_outcome(opener: Opener) -> None:
    async with opener() as store:
        for n in (1, 2):
            posted, new = await store.post_event(event(n), **LIMITS)
            assert new and posted.seq == n and posted.state == "queued"
        again, new = await store.post_event(event(1), **LIMITS)
        assert not new and again.seq == 1  # the existing event, nothing queued
        await store.post_event(event(1, agent_id=6), **LIMITS)  # another agent's own queue and seq
    async with opener() as store:  # (a restart, or another replica)
        first, expired = await store.next_event(5, NOW + 10, 3600.0)
        assert first is not None and first.id == "ev-1" and expired == 0 and first.payload == '{"n": 1, "ü": "x"}'
        await store.start_delivery(5, "ev-1")
        assert (await store.event(5, "ev-1")).state == "delivering"
        await store.end_delivery(5, "ev-1", state="delivered", outcome="done", detail="200", pod="agentd-0",
                                 at=NOW + 11)
        done = await store.event(5, "ev-1")
        assert done is not None and (done.state, done.outcome, done.pod, done.attempts) == \
            ("delivered", "done", "agentd-0", 1) and done.delivered_at == NOW + 11
        assert done.payload == ""  # (an ended event's status is kept, its payload is not)
        second, _ = await store.next_event(5, NOW + 12, 3600.0, start=True)
        assert second is not None and (second.id, second.state, second.attempts) == ("ev-2", "delivering", 1)
        assert [e.id for e in await store.events(5)] == ["ev-2", "ev-1"]
        assert [e.id for e in await store.events(5, state="delivering")] == ["ev-2"]
        assert await store.pending_agents() == {5: 1, 6: 1}
        # a delivery that ended twice (a lost ack, redelivered) changes nothing the second time
        await store.end_delivery(5, "ev-1", state="failed", outcome="failed", detail="", pod="", at=NOW + 13)
        assert (await store.event(5, "ev-1")).state == "delivered"


async def test_a_full_queue_refuses_until_delivered_and_old_events_expire(opener: Opener) -> None:
    async with opener() as store:
        for n in (1, 2, 3):
            await store.post_event(event(n), **LIMITS)
        with pytest.raises(QueueFull, match="3 undelivered events"):
            await store.post_event(event(4), **LIMITS)
        following = await store.end_delivery(5, "ev-1", state="delivered", outcome="done", detail="", pod="",
                                             at=NOW + 5, next_ttl=3600.0)  # (and the next, in the same step)
        assert following[0] is not None and (following[0].id, following[0].state, following[0].attempts) == \
            ("ev-2", "delivering", 1)
        assert (await store.post_event(event(4), **LIMITS))[0].seq == 4
        # an hour later the waiting ones expired: the queue is empty, their status says so
        nothing, expired = await store.next_event(5, NOW + 3600 + 3.5, 3600.0)
        assert nothing is not None and nothing.id == "ev-4" and expired == 2
        assert (await store.event(5, "ev-2")).state == "expired"  # (delivering, too)
        # a post past the expiry finds room; ended events beyond max_kept (2) are forgotten, oldest first
        await store.post_event(event(5000), **LIMITS)
        assert await store.event(5, "ev-1") is None
        kept = [e.id for e in await store.events(5)]
        assert len(kept) == 3 and kept[:2] == ["ev-5000", "ev-4"]  # (ev-4 expired by this post: the newest ended)


async def test_one_owner_holds_the_lease_until_it_releases_or_it_lapses(opener: Opener) -> None:
    async with opener() as store:
        assert await store.take_lease(5, "kasd-a", 5.0)
        assert not await store.take_lease(5, "kasd-b", 5.0)
        assert await store.take_lease(5, "kasd-a", 5.0)  # renewed
        assert await store.take_lease(6, "kasd-b", 0.05)  # another agent's
        await store.release_lease(5, "kasd-b")  # not b's: nothing
        assert not await store.take_lease(5, "kasd-b", 5.0)
        await store.release_lease(5, "kasd-a")
        assert await store.take_lease(5, "kasd-b", 5.0)
        await trio.sleep(0.1)  # (the lease's own time: lapsed, as a dead replica's)
        assert await store.take_lease(6, "kasd-a", 5.0)


async def test_a_post_starts_the_delivery_for_the_lease_holder_only_of_the_queues_head(opener: Opener) -> None:
    async with opener() as store:
        assert await store.take_lease(5, "kasd-a", 5.0)
        first, new = await store.post_event(event(1), **LIMITS, deliverer="kasd-a")  # alone, the holder's
        second, _ = await store.post_event(event(2), **LIMITS, deliverer="kasd-a")  # behind the first
        third, _ = await store.post_event(event(1, agent_id=6), **LIMITS, deliverer="kasd-a")  # no lease
        assert new and (first.state, first.attempts) == ("delivering", 1)
        assert [(e.state, e.attempts) for e in (second, third)] == [("queued", 0), ("queued", 0)]
        assert [(e.id, e.state, e.attempts) for e in await store.events(5)] == \
            [("ev-2", "queued", 0), ("ev-1", "delivering", 1)]
        await store.end_delivery(5, "ev-1", state="delivered", outcome="done", detail=None, pod=None, at=NOW + 9)
        await store.end_delivery(5, "ev-2", state="delivered", outcome="done", detail=None, pod=None, at=NOW + 9)
        assert await store.take_lease(6, "kasd-b", 5.0)
        other, _ = await store.post_event(event(3), **LIMITS, deliverer="kasd-b")  # kasd-a's lease
        theirs, _ = await store.post_event(event(2, agent_id=6), **LIMITS, deliverer="kasd-a")  # kasd-b's
        assert [(e.state, e.attempts) for e in (other, theirs)] == [("queued", 0), ("queued", 0)]


async def test_attempts_count_sends_not_the_take_that_finds_an_event_a_post_handed_over(opener: Opener) -> None:
    async with opener() as store:
        assert await store.take_lease(5, "kasd-a", 5.0)
        posted, _ = await store.post_event(event(1), **LIMITS, deliverer="kasd-a", handed_to="d1")
        assert (posted.state, posted.attempts) == ("delivering", 1)  # handed to d1 in memory
        # d1's own first take found it before the hand-off: the same (first) send
        found, _ = await store.next_event(5, NOW + 5, 3600.0, start=True, handed_to="d1")
        assert found is not None and (found.id, found.state, found.attempts) == ("ev-1", "delivering", 1)
        # sent, not answered: the take to send it again is another attempt; so is d1's next first
        # take (the mark went with the first: it may have been sent since)
        again, _ = await store.next_event(5, NOW + 6, 3600.0, start=True)
        later, _ = await store.next_event(5, NOW + 7, 3600.0, start=True, handed_to="d1")
        assert [e.attempts for e in (again, later) if e is not None] == [2, 3]
        await store.end_delivery(5, "ev-1", state="delivered", outcome="done", detail=None, pod=None, at=NOW + 8)
        # handed to d1, sent by d1 from memory, not answered: a take to send again counts
        await store.post_event(event(2), **LIMITS, deliverer="kasd-a", handed_to="d1")
        retried, _ = await store.next_event(5, NOW + 9, 3600.0, start=True)
        assert retried is not None and (retried.id, retried.attempts) == ("ev-2", 2)
        await store.end_delivery(5, "ev-2", state="delivered", outcome="done", detail=None, pod=None, at=NOW + 9)
        # handed to d1; taken by another deliverer (d1 gone, the lease taken again): it may have been sent
        await store.post_event(event(3), **LIMITS, deliverer="kasd-a", handed_to="d1")
        other, _ = await store.next_event(5, NOW + 10, 3600.0, start=True, handed_to="d2")
        assert other is not None and (other.id, other.attempts) == ("ev-3", 2)
        await store.end_delivery(5, "ev-3", state="delivered", outcome="done", detail=None, pod=None, at=NOW + 10)
        # the take in an end's step (an end of an event that had left the queue) is a first take too
        await store.post_event(event(4), **LIMITS, deliverer="kasd-a", handed_to="d1")
        following, _ = await store.end_delivery(5, "ev-3", state="delivered", outcome="done", detail=None, pod=None,
                                                at=NOW + 11, next_ttl=3600.0, handed_to="d1")
        assert following is not None and (following.id, following.attempts) == ("ev-4", 1)
        assert [(e.id, e.attempts) for e in await store.events(5)] == [("ev-4", 1), ("ev-3", 2), ("ev-2", 2)]


async def test_an_events_table_made_by_an_older_kasd_gets_the_columns_added_since(tmp_path: Path) -> None:
    path = tmp_path / "kasd.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(events_sqlite._SCHEMA.replace("    handed TEXT,\n", ""))  # (as it was before the mark)
    old.execute("INSERT INTO events (agent_id, id, seq, type, payload, state, posted_at, attempts) "
                "VALUES (5, 'ev-1', 1, 'push', '{}', 'queued', ?, 0)", (NOW,))
    old.execute("INSERT INTO event_seq (agent_id, seq) VALUES (5, 1)")
    old.commit()
    old.close()
    store = SqliteStore.open_sync(path, max_entries=10)
    try:
        assert await store.take_lease(5, "kasd-a", 5.0)
        found, _ = await store.next_event(5, NOW + 1, 3600.0, start=True, handed_to="d1")
        assert found is not None and (found.id, found.attempts) == ("ev-1", 1)
        await store.end_delivery(5, "ev-1", state="delivered", outcome="done", detail=None, pod=None, at=NOW + 2)
        posted, _ = await store.post_event(event(2), **LIMITS, deliverer="kasd-a", handed_to="d1")
        assert (posted.seq, posted.state, posted.attempts) == (2, "delivering", 1)
        taken, _ = await store.next_event(5, NOW + 3, 3600.0, start=True, handed_to="d1")
        assert taken is not None and (taken.id, taken.attempts) == ("ev-2", 1)
    finally:
        await store.aclose()


async def test_a_lone_kasds_event_commits_do_not_wait_for_the_disk_and_survive_its_restart(tmp_path: Path) -> None:
    path = tmp_path / "kasd.sqlite3"
    store = SqliteStore.open_sync(path, max_entries=10)
    levels: list[int] = []
    store._db.set_trace_callback(
        lambda sql: levels.append(store._db.execute("PRAGMA synchronous").fetchone()[0]) if sql == "COMMIT" else None)
    try:
        await store.post_event(event(1), **LIMITS)
        await store.end_delivery(5, "ev-1", state="delivered", outcome="done", detail=None, pod=None, at=NOW + 9,
                                 next_ttl=3600.0)
        await store.finish_job(42, 1_900_000_000)  # (not an event's: as it was)
    finally:
        store._db.set_trace_callback(None)
        await store.aclose()
    assert levels == [1, 1, 2]  # NORMAL (the WAL written, no fsync), then FULL again
    again = SqliteStore.open_sync(path, max_entries=10)
    try:
        assert [(e.id, e.state) for e in await again.events(5)] == [("ev-1", "delivered")]
    finally:
        await again.aclose()


async def test_a_notice_wakes_every_listener(opener: Opener) -> None:
    async with opener() as store, opener() as other:
        woken: list[int] = []
        heard = trio.Event()

        def wake(agent_id: int) -> None:
            woken.append(agent_id)
            heard.set()

        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: store.listen_events(wake, task_status=task_status))
            teller = other if isinstance(store, RedisStore) else store  # (SQLite: one process)
            await teller.announce_events(42)
            with trio.fail_after(5):
                await heard.wait()
            nursery.cancel_scope.cancel()
        assert woken == [42]
