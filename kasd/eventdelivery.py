"""Delivering events to agents (issue 28; docs/events.md): ``EventDelivery`` posts events to the
store's queues (``kasd.store.events``) and, on whichever replica holds an agent's delivery lease,
sends them one at a time, in seq order, through the ``Router`` as streams of kind ``event``.

- One replica delivers an agent's events at a time: the lease in the store (``take_lease``, renewed
  every third of ``LEASE_SECONDS``; a replica that dies loses it within ``LEASE_SECONDS``). A replica
  that holds a tunnel of the agent tries for it at once; the others after ``HOP_GRACE`` (so the
  events go without a hop when they can, and still go when no holder is alive).
- Woken, never polling: a post announces its agent (Redis pub/sub among replicas), and so does an
  agent connecting here; a sweep every ``SWEEP_INTERVAL`` finds the queues whose deliverer died.
- One event: OPEN ``{"v": 1, "kind": "event", "id", "type", "seq", "posted_at", "request_id"}``, the
  payload as DATA, HALF_CLOSE; agentd's ACCEPT says ``outcome`` (done, duplicate, ignored: delivered;
  failed: failed). Recorded, the queue moves on. A refusal, a broken tunnel, no agent, no answer
  within ``events.delivery_timeout``: the same event again after a backoff (order kept: at least once;
  agentd answers ``duplicate`` to an id it already acted on). A queue whose events expire moves on.

May import: ``kasd.seams``, ``kasd.agentstream``, ``kasd.store``, ``kasd.config``, ``tunnelhttp``,
``wire``, trio, attrs, the standard library.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import trio

from daemonkit.logs import logfmt
from kasd.agentclient import TUNNEL_FAILURES
from kasd.agentstream import AgentStreamError, open_stream
from kasd.config.events import EventSettings
from kasd.seams import Router
from kasd.store.errors import StoreError
from kasd.store.events import MAX_DETAIL, MAX_LISTED, OUTCOMES, QueuedEvent, ended_state
from kasd.store.protocol import EventStore
from tunnelhttp.head import TunnelCode
from tunnelhttp.kinds import KIND_EVENT
from wire.session import MuxStream, StreamRefusedError

log = logging.getLogger("kasd.events")

#: seconds a delivery lease lasts unless renewed (a dead replica's lapses within this)
LEASE_SECONDS = 5.0
#: seconds a replica without a tunnel of the agent waits before trying for the lease
HOP_GRACE = 0.5
#: seconds a deliverer with nothing to send keeps its lease, waiting for more
IDLE_SECONDS = 10.0
#: seconds between two looks for queues nobody delivers (a replica died holding them)
SWEEP_INTERVAL = 5.0
#: a failed delivery is tried again after this, doubled each time up to ``MAX_BACKOFF``
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 5.0


class EventCounts(Protocol):
    """Where delivery is counted (``kasd.metrics.Metrics``' events block)."""

    def event_delivered(self, outcome: str, latency: float) -> None: ...
    def event_expired(self, count: int) -> None: ...
    def event_retried(self, reason: str) -> None: ...
    def events_queued(self, count: int) -> None: ...


class _NoCounts:
    def event_delivered(self, outcome: str, latency: float) -> None:
        pass

    def event_expired(self, count: int) -> None:
        pass

    def event_retried(self, reason: str) -> None:
        pass

    def events_queued(self, count: int) -> None:
        pass


class _Retry(Exception):
    """This attempt did not reach agentd, or agentd could not take it: try again later."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@attrs.define(eq=False)
class _Deliverer:
    """One agent's delivery task on this replica; ``wakeup`` is set by each notice. ``handed``: an
    event posted here whose delivery the store started for this replica's lease (the queue's head
    then: ``post_event(deliverer=…)``), to send when its own take finds the queue empty, without
    taking it from the store again. ``token``: this deliverer's name in the store's mark on an event
    handed to it (``post_event(handed_to=…)``): its own first take finding that event before the
    hand-off does not count a second attempt. Per deliverer, not per replica: one that follows it
    here (the lease lost and taken again) may find an event its predecessor sent, and counts."""

    wakeup: trio.Event = attrs.field(factory=trio.Event)
    handed: QueuedEvent | None = None
    token: str = attrs.field(factory=lambda: uuid.uuid4().hex)
    #: the newest event this deliverer took (from the store, or handed): an event handed at or
    #: before it was taken already (the POST that hands it over may finish after a take found it)
    taken_seq: int = 0

    def took(self, taken: tuple[QueuedEvent | None, int]) -> tuple[QueuedEvent | None, int]:
        """A take from the store: what it found (an event handed is dropped once a take found it
        or one after it in the store — it was taken there), else the event handed."""
        event, expired = taken
        handed = self.handed
        if handed is not None and (handed.seq <= self.taken_seq or event is None or handed.seq <= event.seq):
            self.handed = None
            if event is None and handed.seq > self.taken_seq:
                event = handed
        if event is not None:
            self.taken_seq = max(self.taken_seq, event.seq)
        return event, expired


class EventDelivery:
    """Posts events and delivers the queues this replica holds the lease of. ``owner``: this
    replica's name (the lease's holder); ``holds(agent_id)``: whether a tunnel of the agent is
    connected here; ``pod_of(stream)``: the agentd pod a stream went to, when known here."""

    def __init__(self, store: EventStore, router: Router, settings: EventSettings = EventSettings(), *,
                 owner: str = "", holds: Callable[[int], bool] = lambda _agent: True,
                 pod_of: Callable[[MuxStream], str | None] = lambda _stream: None,
                 counts: EventCounts | None = None, clock: Callable[[], float] = time.time,
                 lease_seconds: float = LEASE_SECONDS, hop_grace: float = HOP_GRACE,
                 idle_seconds: float = IDLE_SECONDS, sweep_interval: float = SWEEP_INTERVAL) -> None:
        self.store = store
        self.router = router
        self.settings = settings
        self.owner = owner or uuid.uuid4().hex
        self._holds = holds
        self._pod_of = pod_of
        self._counts: EventCounts = counts or _NoCounts()
        self._clock = clock
        self._lease = lease_seconds
        self._hop_grace = hop_grace
        self._idle = idle_seconds
        self._sweep_interval = sweep_interval
        self._deliverers: dict[int, _Deliverer] = {}
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ posting

    async def post(self, agent_id: int, event_type: str, payload: str, event_id: str | None = None) -> tuple[QueuedEvent, bool]:
        """Queue an event (``payload``: its JSON text): (the event, True), or (the one already known
        by that id, False). ``QueueFull``; ``StoreError``."""
        s = self.settings
        event = QueuedEvent(agent_id=agent_id, id=event_id or uuid.uuid4().hex, type=event_type, payload=payload,
                      posted_at=self._clock())
        # (the store announces a new event to every replica in the same step; this one's deliverer
        # is woken at once, without waiting for the notice to come back). When this replica has a
        # deliverer of the agent, the store also starts the event's delivery for it if it holds the
        # lease and the event is the only one waiting: it is then the queue's head, handed over in
        # memory — the store has it first, so a replica that dies now loses nothing (the lease
        # lapses, another takes the event from the store)
        deliverer = self._deliverers.get(agent_id)
        posted, new = await self.store.post_event(
            event, max_queued=s.max_queued_per_agent, ttl=s.ttl, keep_for=s.keep_for,
            max_kept=s.max_kept_per_agent, deliverer=None if deliverer is None else self.owner,
            handed_to=None if deliverer is None else deliverer.token)
        if not new:
            return posted, new
        if posted.state == "delivering":
            deliverer = self._deliverers.get(agent_id)
            if deliverer is not None and deliverer.handed is None:
                deliverer.handed = posted
            # (else a new deliverer takes it from the store, its delivery started: one attempt more)
            posted = attrs.evolve(posted, state="queued", attempts=0)  # (the POST's answer: as it was queued)
        self.wake(agent_id)
        return posted, new

    async def status(self, agent_id: int, event_id: str) -> QueuedEvent | None:
        return await self.store.event(agent_id, event_id)

    async def listing(self, agent_id: int, state: str | None) -> list[QueuedEvent]:
        return await self.store.events(agent_id, state=state, limit=MAX_LISTED)

    # ------------------------------------------------------------------ running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen for notices and deliver, until cancelled. ``started()`` at once: a store that is
        away (Redis) delays delivery, never kasd's start (the listener and the sweep keep trying)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._listen)
            nursery.start_soon(self._sweep)
            task_status.started()

    async def _listen(self) -> None:
        await self.store.listen_events(self.wake)

    async def agent_connected(self, agent_id: int) -> None:
        """An agent's tunnel came up here: whoever delivers its events (any replica) tries at once."""
        self.wake(agent_id)
        try:
            await self.store.announce_events(agent_id)
        except StoreError:
            pass

    async def watch_connections(self, changed: Callable[[], trio.Event], connected: Callable[[], set[int]]) -> None:
        """``agent_connected`` for each agent whose first tunnel here comes up (``changed()``: the
        registry's event for its next change; ``connected()``: the agents with a tunnel here)."""
        known = connected()
        while True:
            await changed().wait()
            now = connected()
            for agent_id in sorted(now - known):
                await self.agent_connected(agent_id)
            known = now

    def wake(self, agent_id: int) -> None:
        """Deliver ``agent_id``'s events: its deliverer here is woken, or one is started."""
        deliverer = self._deliverers.get(agent_id)
        if deliverer is not None:
            deliverer.wakeup.set()
        elif self._nursery is not None:
            self._deliverers[agent_id] = _Deliverer()
            self._nursery.start_soon(self._deliver_agent, agent_id)

    async def _sweep(self) -> None:
        while True:
            try:
                pending = await self.store.pending_agents()
                self._counts.events_queued(sum(pending.values()))
                for agent_id in pending:
                    self.wake(agent_id)
            except StoreError as exc:
                log.warning("events: cannot look for waiting events error=%s", logfmt(str(exc)))
            await trio.sleep(self._sweep_interval)

    # ------------------------------------------------------------------ one agent's queue

    async def _deliver_agent(self, agent_id: int) -> None:
        me = self._deliverers[agent_id]
        try:
            if not self._holds(agent_id):
                await trio.sleep(self._hop_grace)  # a replica holding its tunnel goes first
            if not await self.store.take_lease(agent_id, self.owner, self._lease):
                return
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._keep_lease, agent_id, nursery.cancel_scope)
                    await self._drain(agent_id, me)
                    nursery.cancel_scope.cancel()
            finally:
                with trio.move_on_after(2, shield=True):
                    try:
                        await self.store.release_lease(agent_id, self.owner)
                    except StoreError:
                        pass  # (it lapses)
        except StoreError as exc:
            log.warning("events: delivery paused, the store failed agent_id=%d error=%s", agent_id, logfmt(str(exc)))
        finally:
            del self._deliverers[agent_id]
            if me.wakeup.is_set():  # woken while it was leaving: someone must look again
                self.wake(agent_id)

    async def _keep_lease(self, agent_id: int, work: trio.CancelScope) -> None:
        while True:
            await trio.sleep(self._lease / 3)
            try:
                kept = await self.store.take_lease(agent_id, self.owner, self._lease)
            except StoreError:
                kept = False
            if not kept:  # (another replica may deliver now: this one stops)
                log.warning("events: lost the delivery lease agent_id=%d", agent_id)
                work.cancel()
                return

    async def _drain(self, agent_id: int, me: _Deliverer) -> None:
        taken: tuple[QueuedEvent | None, int] | None = None  # the next event, as the last delivery's record took it
        while True:
            if taken is None:
                me.wakeup = trio.Event()  # (before looking: a post after the look wakes it)
                # (a first take: an event a post started for this deliverer is the attempt it counted)
                taken = await self.store.next_event(agent_id, self._clock(), self.settings.ttl, start=True,
                                                    handed_to=me.token)
            handed = me.handed
            (event, expired), taken = me.took(taken), None
            if expired:
                self._counts.event_expired(expired)
                log.info("events: expired undelivered agent_id=%d count=%d", agent_id, expired)
            if event is None:
                with trio.move_on_after(self._idle):
                    await me.wakeup.wait()
                if me.handed is not None:  # posted here, the queue's head, its delivery started
                    taken = (None, 0)  # (took() gives it)
                elif not me.wakeup.is_set():
                    return
                continue
            taken = await self._deliver_event(event, me, marked=event is handed)

    async def _deliver_event(self, event: QueuedEvent, me: _Deliverer, *, marked: bool = False
                             ) -> tuple[QueuedEvent | None, int] | None:
        """Until agentd answers for ``event`` (or it expires; then None); its delivery started
        (``next_event(start=True)``). The next event, taken in the step that records the answer.
        ``marked``: ``event`` is the copy a post handed over, still marked for ``me`` in the store."""
        backoff = FIRST_BACKOFF
        while True:
            try:
                with trio.fail_after(self.settings.delivery_timeout):
                    answer, pod = await self._send(event)
            except (_Retry, trio.TooSlowError) as exc:
                reason = exc.reason if isinstance(exc, _Retry) else "timeout"
                self._counts.event_retried(reason)
                log.info("events: not delivered, retrying agent_id=%d id=%s seq=%d reason=%s in=%.1fs error=%s",
                         event.agent_id, logfmt(event.id), event.seq, reason, backoff,
                         logfmt(str(exc) or "no answer within events.delivery_timeout"))
                # a notice (the agent connected, another post) cuts the wait, never below the first step
                await trio.sleep(FIRST_BACKOFF)
                me.wakeup = trio.Event()
                with trio.move_on_after(backoff - FIRST_BACKOFF):
                    await me.wakeup.wait()
                backoff = min(backoff * 2, MAX_BACKOFF)
                # A send again: another attempt. An event still marked for this deliverer is not this
                # one then (taken, its mark went; sent from memory, it still has it: no handed_to) but
                # the next, handed over since this one expired: its first send. Through took(), as
                # any take: a copy of it handed over is dropped, or given when the take came first
                handed = me.handed
                current, expired = me.took(await self.store.next_event(
                    event.agent_id, self._clock(), self.settings.ttl, start=True,
                    handed_to=None if marked else me.token))
                marked = current is not None and current is handed
                if expired:
                    self._counts.event_expired(expired)
                if current is None:
                    return None
                if current.id != event.id:  # (it expired: the next one, in order, its delivery started)
                    event, backoff = current, FIRST_BACKOFF
                continue
            outcome = answer.get("outcome")
            detail = answer.get("detail")
            text = str(outcome) if outcome in OUTCOMES else "failed"
            if outcome not in OUTCOMES:
                detail = f"agentd answered an unknown outcome {str(outcome)[:40]!r}"
            now = self._clock()
            me.wakeup = trio.Event()  # (before the record looks for the next: a post after it wakes it)
            taken = await self.store.end_delivery(
                event.agent_id, event.id, state=ended_state(text), outcome=text,
                detail=str(detail)[:MAX_DETAIL] if detail is not None else None, pod=pod, at=now,
                next_ttl=self.settings.ttl, handed_to=me.token)
            self._counts.event_delivered(text, max(0.0, now - event.posted_at))
            log.info("event delivered agent_id=%d id=%s seq=%d type=%s outcome=%s pod=%s", event.agent_id,
                     logfmt(event.id), event.seq, logfmt(event.type), text, logfmt(pod or "-"))
            return taken

    async def _send(self, event: QueuedEvent) -> tuple[dict[str, Any], str | None]:
        """One attempt: agentd's ACCEPT metadata and the pod it came from; ``_Retry`` otherwise."""
        metadata = {"v": 1, "kind": KIND_EVENT, "id": event.id, "type": event.type, "seq": event.seq,
                    "posted_at": event.posted_at, "request_id": os.urandom(16).hex()}
        try:
            stream = await open_stream(self.router, event.agent_id, metadata)
        except AgentStreamError as exc:
            raise _Retry("no_agent" if exc.status in (503, 504) else "route", exc.message) from None
        except TUNNEL_FAILURES as exc:
            raise _Retry("tunnel", str(exc)) from None
        answered = False
        try:
            try:
                await stream.send_all(event.payload.encode())
                await stream.send_eof()
                try:
                    accepted = await stream.wait_accepted()
                except StreamRefusedError as exc:
                    self.router.report(stream, exc)
                    if exc.code in _FINAL_REFUSALS:
                        # agentd will refuse this event whenever it comes (a payload it cannot take, an
                        # agentd without events): failed now, so the agent's later events go on
                        answered = True
                        return {"outcome": "failed", "detail": f"agentd refused the event: {exc.message or exc}"[:1024],
                                "status": None}, self._pod_of(stream)
                    raise _Retry("refused", str(exc)) from None
                self.router.report(stream, None)
            except TUNNEL_FAILURES as exc:
                raise _Retry("tunnel", str(exc)) from None
            answered = True
            return dict(accepted), self._pod_of(stream)
        finally:
            with trio.move_on_after(2, shield=True):
                try:
                    if answered:
                        await stream.aclose()
                    else:
                        await stream.reset(TunnelCode.CLIENT_GONE, "kasd gave up this delivery")
                except TUNNEL_FAILURES:
                    pass


#: refusals that would come again for the same event, whoever delivered it: not tried again
_FINAL_REFUSALS = frozenset({TunnelCode.BAD_REQUEST, TunnelCode.UNKNOWN_TARGET})


__all__ = ["HOP_GRACE", "LEASE_SECONDS", "EventCounts", "EventDelivery"]
