"""Delivering events (``kasd.eventdelivery``): through a router to a fake agentd over real wire
sessions on memory streams, with a real store (SQLite in memory). In order, at least once: a
refusal, no agent, or a lost answer means the same event again, never the next one first; agentd's
``failed`` moves on; a redelivery after a lost answer is agentd's ``duplicate``, acted on once."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from kasd.eventdelivery import EventDelivery
from kasd.seams import AgentNotConnected
from kasd.store.events import QueuedEvent
from kasd.store.sqlite import SqliteStore
from tunnelhttp.head import TunnelCode
from wire.frames import Metadata
from wire.session import MuxStream, Session, StreamRefusedError, connect_session

pytestmark = pytest.mark.timeout(20)


@attrs.define(eq=False)
class Router:
    """The agent's session when it is connected; else AgentNotConnected, at once."""

    session: Session | None = None
    opened: list[Metadata] = attrs.field(factory=list)
    tried: trio.Event = attrs.field(factory=trio.Event)

    async def open_stream(self, agent_id: int, metadata: Metadata, *,
                          avoid: frozenset[Session] = frozenset()) -> MuxStream:
        self.opened.append(metadata)
        self.tried.set()
        self.tried = trio.Event()
        if self.session is None:
            raise AgentNotConnected(agent_id, 0)
        return await self.session.open_stream(metadata)

    def report(self, stream: MuxStream, refusal: StreamRefusedError | None) -> None:
        pass


@attrs.define(eq=False)
class FakeAgentd:
    """Acts on each event once (its ids remembered, as agentd's dedup): ``acted`` is what the
    in-cluster target got. ``plan`` pops one behaviour per stream: "refuse", "bad" (refused as a
    malformed event), "lose" (act, then the answer is lost), "fail"; otherwise done."""

    acted: list[tuple[str, Any]] = attrs.field(factory=list)
    plan: list[str] = attrs.field(factory=list)
    seen: set[str] = attrs.field(factory=set)
    metadata: list[Metadata] = attrs.field(factory=list)
    changed: trio.Event = attrs.field(factory=trio.Event)

    async def serve(self, session: Session) -> None:
        while True:
            stream = await session.accept_stream()
            meta = stream.metadata
            self.metadata.append(meta)
            body = b""
            while chunk := await stream.receive_some(65536):
                body += chunk
            step = self.plan.pop(0) if self.plan else "done"
            if step == "refuse":
                await stream.refuse(message="agentd is draining")
                continue
            if step == "bad":
                await stream.refuse(TunnelCode.BAD_REQUEST, "bad event: payload is over 65536 bytes")
                continue
            if meta["id"] in self.seen:
                await stream.accept({"outcome": "duplicate", "detail": "already acted on", "status": None})
            elif step == "fail":
                await stream.accept({"outcome": "failed", "detail": "webhook answered 500", "status": 500})
            else:
                self.seen.add(meta["id"])
                self.acted.append((meta["id"], json.loads(body)))
                if step == "lose":
                    await stream.reset(TunnelCode.CLIENT_GONE, "tunnel broke")
                    continue
                await stream.accept({"outcome": "done", "detail": "200 OK", "status": 200})
            await stream.aclose()
            self.changed.set()
            self.changed = trio.Event()


@attrs.define(eq=False)
class Counts:
    """What delivery counts; ``changed`` is set at each answer recorded."""

    delivered: list[str] = attrs.field(factory=list)
    changed: trio.Event = attrs.field(factory=trio.Event)

    def event_delivered(self, outcome: str, latency: float) -> None:
        self.delivered.append(outcome)
        self.changed.set()
        self.changed = trio.Event()

    def event_expired(self, count: int) -> None:
        pass

    def event_retried(self, reason: str) -> None:
        pass

    def events_queued(self, count: int) -> None:
        pass


@asynccontextmanager
async def delivering(agentd: FakeAgentd, *, connected: bool = True
                     ) -> AsyncIterator[tuple[EventDelivery, Router, Session]]:
    store = SqliteStore.open_sync(":memory:", max_entries=10)
    left, right = trio.testing.memory_stream_pair()
    router = Router()
    async with trio.open_nursery() as nursery:
        sessions: dict[str, Session] = {}

        async def connect(name: str, transport: trio.abc.Stream, client: bool) -> None:
            sessions[name] = await connect_session(nursery, transport, client=client)

        async with trio.open_nursery() as both:
            both.start_soon(connect, "kasd", left, False)
            both.start_soon(connect, "agent", right, True)
        nursery.start_soon(agentd.serve, sessions["agent"])
        if connected:
            router.session = sessions["kasd"]
        delivery = EventDelivery(store, router, owner="kasd-a", pod_of=lambda _s: "agentd-0", counts=Counts())
        await nursery.start(delivery.run)
        yield delivery, router, sessions["kasd"]
        nursery.cancel_scope.cancel()
    await store.aclose()


async def settled(delivery: EventDelivery, agent_id: int, ids: list[str],
                  done: Callable[[QueuedEvent], bool] = lambda e: e.state in ("delivered", "failed")) -> list[QueuedEvent]:
    counts = delivery._counts
    assert isinstance(counts, Counts)
    with trio.fail_after(10):
        while True:
            changed = counts.changed
            found = [await delivery.store.event(agent_id, i) for i in ids]
            if all(e is not None and done(e) for e in found):
                return [e for e in found if e is not None]
            await changed.wait()


async def test_events_reach_the_agent_in_order_once_with_the_contract_metadata() -> None:
    agentd = FakeAgentd()
    async with delivering(agentd) as (delivery, _router, _session):
        for n in range(5):
            await delivery.post(7, "push", json.dumps({"n": n}), event_id=f"e{n}")
        events = await settled(delivery, 7, [f"e{n}" for n in range(5)])
    assert agentd.acted == [(f"e{n}", {"n": n}) for n in range(5)]
    assert [(e.state, e.outcome, e.pod, e.attempts, e.seq) for e in events] == \
        [("delivered", "done", "agentd-0", 1, n + 1) for n in range(5)]
    meta = agentd.metadata[0]
    assert {k: meta[k] for k in ("v", "kind", "id", "type", "seq")} == \
        {"v": 1, "kind": "event", "id": "e0", "type": "push", "seq": 1}
    assert isinstance(meta["posted_at"], float) and len(meta["request_id"]) == 32


async def test_a_refusal_or_a_lost_answer_retries_the_same_event_first_and_failed_moves_on() -> None:
    agentd = FakeAgentd(plan=["refuse", "done", "lose", "done", "fail"])
    async with delivering(agentd) as (delivery, _router, _session):
        for n in range(4):
            await delivery.post(7, "push", json.dumps({"n": n}), event_id=f"e{n}")
        events = await settled(delivery, 7, [f"e{n}" for n in range(4)])
    # e0 refused then done; e1 acted but its answer lost, then duplicate; e2 failed; e3 done
    assert [m["id"] for m in agentd.metadata] == ["e0", "e0", "e1", "e1", "e2", "e3"]
    assert agentd.acted == [("e0", {"n": 0}), ("e1", {"n": 1}), ("e3", {"n": 3})]
    assert [(e.state, e.outcome, e.attempts) for e in events] == \
        [("delivered", "done", 2), ("delivered", "duplicate", 2), ("failed", "failed", 1), ("delivered", "done", 1)]
    assert events[2].detail == "webhook answered 500"


async def test_an_event_agentd_refuses_as_malformed_fails_at_once_and_the_next_goes_on() -> None:
    """A refusal that would come again (BAD_REQUEST: agentd cannot take this event) is not tried
    again until the event expires: it would hold every later event of the agent that long."""
    agentd = FakeAgentd(plan=["bad"])
    async with delivering(agentd) as (delivery, _router, _session):
        await delivery.post(7, "push", "{}", event_id="poison")
        await delivery.post(7, "push", "{}", event_id="next")
        events = await settled(delivery, 7, ["poison", "next"])
    assert [m["id"] for m in agentd.metadata] == ["poison", "next"]
    assert [(e.state, e.outcome, e.attempts) for e in events] == [("failed", "failed", 1), ("delivered", "done", 1)]
    assert events[0].detail is not None and "payload is over 65536 bytes" in events[0].detail


async def test_events_wait_for_the_agent_and_go_when_it_connects() -> None:
    agentd = FakeAgentd()
    async with delivering(agentd, connected=False) as (delivery, router, session):
        await delivery.post(7, "push", "{}", event_id="early")
        with trio.fail_after(5):
            while len(router.opened) < 2:  # tried, found no agent, tried again after a backoff
                await router.tried.wait()
        queued = await delivery.store.event(7, "early")
        assert queued is not None and queued.state == "delivering" and agentd.acted == []
        router.session = session
        with trio.fail_after(1):  # (well before the backoff's next try: the connection wakes it)
            await delivery.agent_connected(7)
            await settled(delivery, 7, ["early"])
    assert agentd.acted == [("early", {})]


async def test_an_event_posted_to_the_replica_delivering_its_agent_is_handed_over_without_another_take() -> None:
    agentd = FakeAgentd()
    async with delivering(agentd) as (delivery, _router, _session):
        store = delivery.store
        await delivery.post(7, "push", "{}", event_id="first")
        await settled(delivery, 7, ["first"])  # (its deliverer waits on the empty queue, the lease kept)
        takes: list[int] = []
        take, end = store.next_event, store.end_delivery
        recorded, go_on = trio.Event(), trio.Event()

        async def counted(agent_id: int, now: float, ttl: float, **take_: Any) -> Any:
            takes.append(agent_id)
            return await take(agent_id, now, ttl, **take_)

        async def held(agent_id: int, event_id: str, **record: Any) -> Any:
            found = await end(agent_id, event_id, **record)
            if event_id == "second":  # recorded in the store; the deliverer has not seen the answer yet
                recorded.set()
                await go_on.wait()
            return found

        store.next_event = counted  # type: ignore[method-assign]
        store.end_delivery = held  # type: ignore[method-assign]
        posted, _ = await delivery.post(7, "push", '{"n": 1}', event_id="second")  # to the waiting deliverer
        assert (posted.state, posted.attempts) == ("queued", 0)  # the POST's answer
        with trio.fail_after(5):
            await recorded.wait()
        await delivery.post(7, "push", '{"n": 2}', event_id="third")  # to the busy one, the queue empty
        go_on.set()
        await delivery.post(7, "push", '{"n": 3}', event_id="fourth")  # behind: the record's take
        events = await settled(delivery, 7, ["second", "third", "fourth"])
    assert takes == []
    assert agentd.acted == [("first", {}), ("second", {"n": 1}), ("third", {"n": 2}), ("fourth", {"n": 3})]
    assert [(e.state, e.attempts) for e in events] == [("delivered", 1)] * 3


async def test_a_handed_over_event_its_deliverer_took_before_the_hand_off_counts_one_attempt() -> None:
    # the race: the post's store step starts the event for the waiting deliverer, whose own take
    # finds it before the POST hands it over in memory; sent once, so one attempt
    agentd = FakeAgentd()
    async with delivering(agentd) as (delivery, _router, _session):
        store = delivery.store
        await delivery.post(7, "push", "{}", event_id="first")
        await settled(delivery, 7, ["first"])  # (its deliverer waits on the empty queue, the lease kept)
        post, take = store.post_event, store.next_event
        took = trio.Event()

        async def taken(agent_id: int, now: float, ttl: float, **take_: Any) -> Any:
            found = await take(agent_id, now, ttl, **take_)
            took.set()
            return found

        async def posted_then_taken(event: QueuedEvent, **post_: Any) -> Any:
            answer = await post(event, **post_)
            delivery.wake(7)  # (its notice, before the POST goes on)
            await took.wait()
            return answer

        store.next_event = taken  # type: ignore[method-assign]
        store.post_event = posted_then_taken  # type: ignore[method-assign]
        with trio.fail_after(5):
            await delivery.post(7, "push", '{"n": 1}', event_id="second")
        (second,) = await settled(delivery, 7, ["second"])
    assert agentd.acted == [("first", {}), ("second", {"n": 1})]
    assert (second.state, second.attempts) == ("delivered", 1)


async def test_an_event_handed_over_while_the_one_retried_expired_is_sent_once_and_counted_once() -> None:
    # the only waiting event, retried while agentd is away, expires in the step that posts the next:
    # that one is handed over in memory, and the retry's take finds it in the store too
    agentd = FakeAgentd()
    async with delivering(agentd, connected=False) as (delivery, router, session):
        await delivery.post(7, "push", "{}", event_id="stale")
        with trio.fail_after(5):
            while len(router.opened) < 2:  # tried, found no agent, waits for the next try
                await router.tried.wait()
        delivery._clock = lambda: time.time() + 2 * delivery.settings.ttl
        router.session = session
        await delivery.post(7, "push", '{"n": 1}', event_id="fresh")  # (its notice cuts the backoff)
        (fresh,) = await settled(delivery, 7, ["fresh"])
        await delivery.post(7, "push", '{"n": 2}', event_id="after")  # (behind whatever its deliverer does next)
        await settled(delivery, 7, ["after"])
        stale = await delivery.store.event(7, "stale")
    assert [m["id"] for m in agentd.metadata] == ["fresh", "after"]
    assert stale is not None and (stale.state, fresh.state, fresh.attempts) == ("expired", "delivered", 1)


async def test_a_known_id_is_not_queued_again() -> None:
    agentd = FakeAgentd()
    async with delivering(agentd) as (delivery, _router, _session):
        first, new = await delivery.post(7, "push", '{"a": 1}', event_id="same")
        again, new_again = await delivery.post(7, "push", '{"a": 2}', event_id="same")
        # the same event, not a new one; its payload the first post's (or none: a delivered event
        # keeps none, and the delivery may already have happened between the two posts)
        assert new and not new_again and again.seq == first.seq and again.payload in ('{"a": 1}', "")
        await settled(delivery, 7, ["same"])
    assert agentd.acted == [("same", {"a": 1})]


async def test_delivery_is_counted_in_kasds_metrics() -> None:
    from kasd.metrics import EventMetrics, Metrics
    from routing.local import TunnelRegistry

    class Observed(EventMetrics):
        answered = 0
        changed = trio.Event()

        def event_delivered(self, outcome: str, latency: float) -> None:
            super().event_delivered(outcome, latency)
            self.answered += 1
            self.changed.set()
            self.changed = trio.Event()

    metrics = Metrics(TunnelRegistry())
    observed = Observed(metrics.registry)
    agentd = FakeAgentd(plan=["refuse", "done", "fail"])
    async with delivering(agentd) as (delivery, _router, _session):
        delivery._counts = observed
        for n in range(2):
            await delivery.post(7, "push", "{}", event_id=f"m{n}")
        with trio.fail_after(10):
            while observed.answered < 2:
                await observed.changed.wait()
    text = metrics.render().decode()
    assert 'kasd_events_delivered_total{outcome="done"} 1.0' in text
    assert 'kasd_events_delivered_total{outcome="failed"} 1.0' in text
    assert 'kasd_event_delivery_retries_total{reason="refused"} 1.0' in text
    assert "kasd_event_delivery_seconds_count 2.0" in text


def test_an_event_handed_over_after_a_take_found_it_is_not_delivered_again() -> None:
    """The POST that hands its event to this replica's deliverer may finish after the deliverer's
    own take found that event in the store: the hand-over must not deliver it a second time."""
    from kasd.eventdelivery import _Deliverer

    def queued(seq: int) -> QueuedEvent:
        return QueuedEvent(agent_id=7, id=f"e{seq}", seq=seq, type="push", payload="{}", state="delivering",
                           posted_at=0.0, delivered_at=None, attempts=1, outcome=None, detail=None, pod=None)

    me = _Deliverer()
    assert me.took((queued(2), 0)) == (queued(2), 0)  # the take found it (and delivers it)
    me.handed = queued(2)  # the POST's hand-over, late
    assert me.took((None, 0)) == (None, 0) and me.handed is None  # not again
    me.handed = queued(3)  # a new one handed over: given
    assert me.took((None, 0)) == (queued(3), 0)
