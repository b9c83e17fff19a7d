"""``EventHandler``: serves the ``event`` streams kasd opens (one event each) and acts on them.

``handle(stream)`` reads the OPEN metadata and the payload (at most ``MAX_PAYLOAD`` bytes, until
kasd's HALF_CLOSE), REFUSEs a malformed one with ``BAD_REQUEST``, hands the event to the one worker
task (``run``), and ACCEPTs with the outcome once the worker is done, then closes the stream.

The worker takes events one at a time in the order they arrived, so agentd acts on them in kasd's
order, and it — not the stream's task — owns an action: if the tunnel drops mid-action, the action
still finishes and is remembered, so kasd's redelivery of the same id is answered ``duplicate``.

Deduplication keeps the ids of the last ``RECENT_IDS`` events acted on (with which of the matching
handlers succeeded: a redelivery of an event whose webhook failed but whose annotate succeeded runs
the webhook only). kasd redelivers an id only when it got no answer for it — the event that was in
flight when a tunnel, a kasd replica or the network failed — and then at once, with the events after
it still queued behind it; 4096 ids span that window many times over, in at most about 1 MiB.
The memory is per agentd process: a redelivery after agentd restarts acts again (the receiver has
``X-Kasd-Event-Id``; an annotate writes the same value again, which Flux ignores).

All handlers matching an event run at once, under one deadline, ``events.retry_for`` seconds: each
retries its failing action with exponential backoff (0.5 s doubling to 5 s), each attempt bounded
by ``ATTEMPT_TIMEOUT`` and the deadline, so the answer comes within ``retry_for`` of the start.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

import attrs
import trio

from agentd.events.annotate import Annotator
from agentd.events.exchange import Attempt
from agentd.events.model import MAX_PAYLOAD, BadEvent, Event, EventHead, Outcome, parse_payload
from agentd.events.settings import EventsSettings, HandlerSettings
from agentd.events.webhook import WebhookSender
from agentd.upstream import UpstreamPool
from tunnelhttp.head import TunnelCode
from wire.errors import RemoteProtocolError
from wire.session import MuxStream

log = logging.getLogger("agentd.events")

RECENT_IDS = 4096
#: one try of one action (connect, request, answer); a deadline nearer than this cuts it shorter
ATTEMPT_TIMEOUT = 10.0
#: kasd sends the payload right after the OPEN; a stream whose payload does not come is refused
PAYLOAD_TIMEOUT = 30.0
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 5.0
#: events waiting for the worker; kasd sends one at a time per agent, so this only absorbs a
#: redelivery racing its original
_QUEUE = 16


@attrs.frozen(kw_only=True)
class EventRecord:
    """What one event stream came to (the log line, and a hook for tests)."""

    id: str
    type: str
    seq: int
    outcome: str
    detail: str
    status: int | None
    duration: float
    request_id: str


@attrs.define(eq=False)
class _Job:
    event: Event
    outcome: Outcome | None = None
    done: trio.Event = attrs.field(factory=trio.Event)


class EventHandler:
    """Handles logical streams of kind ``event``; ``run`` is its worker (start it first)."""

    def __init__(self, settings: EventsSettings, *, kube: UpstreamPool, agent_id: str,
                 recent_ids: int = RECENT_IDS, attempt_timeout: float = ATTEMPT_TIMEOUT,
                 first_backoff: float = FIRST_BACKOFF, on_done: Callable[[EventRecord], None] | None = None) -> None:
        self.settings = settings
        self.attempt_timeout = attempt_timeout
        self.first_backoff = first_backoff
        self.agent_id = agent_id
        self.on_done = on_done
        self.recent_ids = recent_ids
        #: set when agentd starts to shut down: new events are refused (kasd delivers them later)
        self.draining = False
        self._annotator = Annotator(kube)
        self._webhooks = {index: WebhookSender(handler.webhook, agent_id=agent_id)
                          for index, handler in enumerate(settings.handlers) if handler.webhook is not None}
        #: id → indexes of the handlers that acted on it, oldest first
        self._recent: OrderedDict[str, frozenset[int]] = OrderedDict()
        self._send, self._receive = trio.open_memory_channel[_Job](_QUEUE)

    # ---- the worker

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Act on events one at a time, in order, until cancelled."""
        try:
            task_status.started()
            async for job in self._receive:
                try:
                    job.outcome = await self._act(job.event)
                finally:
                    job.done.set()
        finally:
            with trio.move_on_after(1, shield=True):
                for sender in self._webhooks.values():
                    await sender.aclose()

    async def _act(self, event: Event) -> Outcome:
        matching = [i for i, handler in enumerate(self.settings.handlers) if handler.matches(event.head.type)]
        if not matching:
            return Outcome(outcome="ignored", detail=f"agentd has no handler for type {event.head.type!r}")
        before = self._recent.get(event.head.id, frozenset())
        todo = [i for i in matching if i not in before]
        if not todo:
            self._recent.move_to_end(event.head.id)
            return Outcome(outcome="duplicate", detail=f"agentd already acted on event {event.head.id}")
        deadline = trio.current_time() + self.settings.retry_for
        results: dict[int, Attempt] = {}

        async def run_one(index: int) -> None:
            results[index] = await self._with_retries(index, self.settings.handlers[index], event, deadline)

        async with trio.open_nursery() as nursery:
            for index in todo:
                nursery.start_soon(run_one, index)
        succeeded = before | {i for i in todo if results[i].ok}
        if succeeded:
            self._remember(event.head.id, succeeded)
        failed = [results[i] for i in todo if not results[i].ok]
        ordered = failed + [results[i] for i in todo if results[i].ok]
        detail = "; ".join(result.detail for result in ordered)
        status = ordered[0].status if ordered else None
        return Outcome(outcome="failed" if failed else "done", detail=detail, status=status)

    def _remember(self, event_id: str, handlers: frozenset[int]) -> None:
        self._recent[event_id] = handlers
        self._recent.move_to_end(event_id)
        while len(self._recent) > self.recent_ids:
            self._recent.popitem(last=False)

    async def _with_retries(self, index: int, handler: HandlerSettings, event: Event, deadline: float) -> Attempt:
        backoff = self.first_backoff
        attempts = 0
        while True:
            attempts += 1
            budget = min(self.attempt_timeout, deadline - trio.current_time())
            result: Attempt | None = None
            with trio.move_on_after(budget):
                result = await self._attempt(index, handler, event)
            if result is None:
                result = Attempt(ok=False, detail=f"{handler.action} handlers[{index}]: no answer within {budget:.3g}s")
            if result.ok or result.final:
                return result
            log.info("event action failed id=%s handler=%d action=%s attempt=%d detail=%r",
                     event.head.id, index, handler.action, attempts, result.detail)
            if trio.current_time() + backoff >= deadline:
                return attrs.evolve(result, detail=f"{result.detail} (gave up after {attempts} attempt"
                                                   f"{'s' if attempts > 1 else ''} in {self.settings.retry_for:g}s)")
            await trio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    async def _attempt(self, index: int, handler: HandlerSettings, event: Event) -> Attempt:
        if handler.webhook is not None:
            return await self._webhooks[index].attempt(event)
        assert handler.annotate is not None
        return await self._annotator.attempt(handler.annotate, event)

    # ---- the streams

    async def handle(self, stream: MuxStream) -> None:
        started = trio.current_time()
        head: EventHead | None = None
        outcome: Outcome | None = None
        try:
            if self.draining:
                outcome = Outcome(outcome="failed", detail="refused: agentd is shutting down")
                await _refuse(stream, TunnelCode.UPSTREAM_UNREACHABLE, "agentd is shutting down; deliver it later")
                return
            try:
                head = EventHead.from_metadata(stream.metadata)
                event = Event(head=head, payload=parse_payload(await _read_payload(stream)))
            except BadEvent as exc:
                outcome = Outcome(outcome="failed", detail=f"refused: {exc}")
                await _refuse(stream, TunnelCode.BAD_REQUEST, f"bad event: {exc}")
                return
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                outcome = Outcome(outcome="failed", detail="kasd reset the stream before the payload ended")
                return
            job = _Job(event=event)
            await self._send.send(job)
            await job.done.wait()
            outcome = job.outcome or Outcome(outcome="failed", detail="agentd stopped while acting on it")
            try:
                await stream.accept(outcome.to_metadata())
                await stream.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError, RemoteProtocolError):
                log.info("event answer lost id=%s: kasd's stream is gone (kasd delivers it again; agentd "
                         "answers duplicate)", head.id)
        finally:
            with trio.move_on_after(1, shield=True):
                await stream.aclose()
            self._finish(stream, head, outcome, trio.current_time() - started)

    def _finish(self, stream: MuxStream, head: EventHead | None, outcome: Outcome | None, duration: float) -> None:
        if outcome is None:
            outcome = Outcome(outcome="failed", detail="cancelled")
        record = EventRecord(id=head.id if head else "?", type=head.type if head else "?",
                             seq=head.seq if head else -1, outcome=outcome.outcome, detail=outcome.detail,
                             status=outcome.status, duration=duration, request_id=head.request_id if head else "")
        level = logging.WARNING if record.outcome == "failed" else logging.INFO
        log.log(level, "event id=%s type=%s seq=%d outcome=%s status=%s duration=%.3f request_id=%s stream=%d detail=%r",
                record.id, record.type, record.seq, record.outcome,
                record.status if record.status is not None else "-", record.duration, record.request_id or "-",
                stream.stream_id, record.detail[:300])
        if self.on_done is not None:
            self.on_done(record)


async def _read_payload(stream: MuxStream) -> bytes:
    """DATA until kasd's HALF_CLOSE; ``BadEvent`` past ``MAX_PAYLOAD`` bytes (nothing more is read)
    or when it does not end within ``PAYLOAD_TIMEOUT``."""
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(PAYLOAD_TIMEOUT) as scope:
        while chunk := await stream.receive_some(MAX_PAYLOAD + 1 - size):
            size += len(chunk)
            if size > MAX_PAYLOAD:
                raise BadEvent(f"payload is over {MAX_PAYLOAD} bytes")
            chunks.append(chunk)
    if scope.cancelled_caught:
        raise BadEvent(f"payload did not end within {PAYLOAD_TIMEOUT:g}s")
    return b"".join(chunks)


async def _refuse(stream: MuxStream, code: int, message: str) -> None:
    log.warning("refusing event stream stream=%d code=%s reason=%r", stream.stream_id, TunnelCode(code).name, message)
    try:
        await stream.refuse(code, message)
    except (trio.BrokenResourceError, trio.ClosedResourceError, RemoteProtocolError):
        pass


__all__ = ["ATTEMPT_TIMEOUT", "RECENT_IDS", "EventHandler", "EventRecord"]
