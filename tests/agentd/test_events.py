"""agentd's event handler: kasd's side is a session over a memory stream opening ``event`` streams;
webhooks go to tests/webhooks.py's receiver on 127.0.0.1 (real clock, short retry_for)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from agentd.events import EventHandler, EventRecord
from agentd.events.settings import EventsSettings, HandlerSettings, WebhookSettings
from agentd.kubeapi import KubeTarget
from agentd.upstream import UpstreamPool
from tests.agentd.harness import EVENT_POSTED_AT, event_metadata, send_event
from tests.webhooks import WebhookReceiver, open_webhook_receiver, verify_signature
from tunnelhttp.head import TunnelCode
from wire.session import MuxStream, Session, StreamRefusedError, connect_session

pytestmark = pytest.mark.timeout(20)

SECRET = b"hook-secret-\xe2\x9c\x93"


@attrs.define(eq=False)
class Setup:
    kasd: Session
    handler: EventHandler
    hooks: WebhookReceiver
    records: list[EventRecord]
    #: each stream's handler task, to cancel it as agentd does when its tunnel ends
    scopes: list[trio.CancelScope]


def webhook_handler(url: str, secret_file: Path, event_type: str = "push") -> HandlerSettings:
    return HandlerSettings(type=event_type, webhook=WebhookSettings(url=url, secret_file=secret_file))


async def serve_streams(session: Session, handler: EventHandler, scopes: list[trio.CancelScope]) -> None:
    async def serve(stream: MuxStream, scope: trio.CancelScope) -> None:
        with scope:
            await handler.handle(stream)

    async with trio.open_nursery() as nursery:
        while True:
            stream = await session.accept_stream()
            scopes.append(trio.CancelScope())
            nursery.start_soon(serve, stream, scopes[-1])


@pytest.fixture
async def setup(nursery: trio.Nursery, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Setup]:
    options: dict[str, Any] = getattr(request, "param", {})
    secret_file = tmp_path / "hook-secret"
    secret_file.write_bytes(SECRET + b"\n")
    async with open_webhook_receiver(SECRET) as hooks:
        settings = EventsSettings(retry_for=options.pop("retry_for", 5.0),
                                  handlers=(webhook_handler(hooks.url, secret_file),))
        left, right = trio.testing.memory_stream_pair()
        kasd, agent = await _sessions(nursery, left, right)
        records: list[EventRecord] = []
        # nothing in these tests talks to the API server
        kube = UpstreamPool(KubeTarget(scheme="http", host="127.0.0.1", port=9))
        handler = EventHandler(settings, kube=kube, agent_id="7", first_backoff=0.05, on_done=records.append,
                               **options)
        await nursery.start(handler.run)
        scopes: list[trio.CancelScope] = []
        nursery.start_soon(serve_streams, agent, handler, scopes)
        yield Setup(kasd=kasd, handler=handler, hooks=hooks, records=records, scopes=scopes)


async def _sessions(nursery: trio.Nursery, left: trio.abc.Stream, right: trio.abc.Stream) -> tuple[Session, Session]:
    found: dict[str, Session] = {}

    async def start(name: str, transport: trio.abc.Stream, client: bool) -> None:
        found[name] = await connect_session(nursery, transport, client=client, name=name)

    async with trio.open_nursery() as starter:
        starter.start_soon(start, "kasd", left, False)
        starter.start_soon(start, "agentd", right, True)
    return found["kasd"], found["agentd"]


async def test_webhook_is_posted_once_signed_with_the_contract_s_body_and_headers(setup: Setup) -> None:
    answer = await send_event(setup.kasd, event_metadata("e-1"), b'{"ref": "main", "url": "https://x/y.git"}')
    assert answer == {"outcome": "done", "status": 200, "detail": f"webhook POST {setup.hooks.url}: 200"}
    [got] = setup.hooks.requests
    assert got.method == "POST" and got.target == "/hooks/kasd"
    assert got.headers["content-type"] == "application/json"
    assert got.headers["x-kasd-event"] == "push" and got.headers["x-kasd-event-id"] == "e-1"
    assert got.headers["x-kasd-signature-256"].startswith("sha256=")
    assert got.signature_ok  # the receiver recomputed it from the raw body and the shared secret
    assert not verify_signature(b"another secret", got.raw_body, got.headers["x-kasd-signature-256"])
    assert got.body == {"id": "e-1", "type": "push", "agent_id": "7", "posted_at": EVENT_POSTED_AT,
                        "payload": {"ref": "main", "url": "https://x/y.git"}}


async def test_the_same_id_twice_posts_once_and_is_answered_duplicate(setup: Setup) -> None:
    first = await send_event(setup.kasd, event_metadata("e-1", seq=1))
    again = await send_event(setup.kasd, event_metadata("e-1", seq=1))
    assert first["outcome"] == "done"
    assert again == {"outcome": "duplicate", "detail": "agentd already acted on event e-1", "status": None}
    assert len(setup.hooks.requests) == 1


@pytest.mark.parametrize("setup", [{"recent_ids": 2}], indirect=True)
async def test_the_memory_of_ids_is_bounded(setup: Setup) -> None:
    for event_id in ("a", "b", "c", "a"):
        assert (await send_event(setup.kasd, event_metadata(event_id)))["outcome"] == "done"
    assert [r.headers["x-kasd-event-id"] for r in setup.hooks.requests] == ["a", "b", "c", "a"]


async def test_a_failing_receiver_is_retried_and_events_keep_their_order(setup: Setup, nursery: trio.Nursery) -> None:
    setup.hooks.fail_next(2, status=503)
    answers: dict[str, dict[str, Any]] = {}

    async def deliver(event_id: str, seq: int) -> None:
        answers[event_id] = await send_event(setup.kasd, event_metadata(event_id, seq=seq))

    async with trio.open_nursery() as senders:
        senders.start_soon(deliver, "first", 1)
        # the second arrives while the first is still being retried
        await setup.hooks.wait_for(1, of=lambda hooks: hooks.requests)
        senders.start_soon(deliver, "second", 2)
    assert answers["first"]["outcome"] == "done" and answers["second"]["outcome"] == "done"
    assert [(r.headers["x-kasd-event-id"], r.status) for r in setup.hooks.requests] == [
        ("first", 503), ("first", 503), ("first", 200), ("second", 200)]
    assert all(r.signature_ok for r in setup.hooks.requests)


async def test_an_action_outlives_its_tunnel_and_the_redelivery_is_answered_duplicate(setup: Setup) -> None:
    setup.hooks.fail_next(1, status=503)
    stream = await setup.kasd.open_stream(event_metadata("e-1"))
    await stream.send_all(b"{}")
    await stream.send_eof()
    await setup.hooks.wait_for(1, of=lambda hooks: hooks.requests)  # the first try failed; a retry is due
    setup.scopes[0].cancel()  # the tunnel ended: agentd cancels the stream's task, kasd got no answer
    await stream.reset()
    # kasd delivers it again (over another tunnel); agentd finishes the first delivery, then answers
    answer = await send_event(setup.kasd, event_metadata("e-1"))
    assert answer["outcome"] == "duplicate"
    assert [(r.headers["x-kasd-event-id"], r.status) for r in setup.hooks.requests] == [("e-1", 503), ("e-1", 200)]


@pytest.mark.parametrize("setup", [{"retry_for": 0.6}], indirect=True)
async def test_a_receiver_that_keeps_failing_is_answered_failed_within_retry_for(setup: Setup) -> None:
    setup.hooks.fail_next(100, status=500)
    started = trio.current_time()
    answer = await send_event(setup.kasd, event_metadata("e-1"))
    elapsed = trio.current_time() - started
    assert answer["outcome"] == "failed" and answer["status"] == 500
    assert "answered 500" in answer["detail"] and "gave up after" in answer["detail"]
    assert len(setup.hooks.requests) >= 3  # 0.05 s, then 0.1 s, 0.2 s ... apart
    assert elapsed < 0.6 + 0.5


@pytest.mark.parametrize("setup", [{"retry_for": 0.5}], indirect=True)
async def test_a_receiver_that_never_answers_is_answered_failed_within_retry_for(setup: Setup) -> None:
    setup.hooks.hang_next(100)
    started = trio.current_time()
    answer = await send_event(setup.kasd, event_metadata("e-1"))
    assert trio.current_time() - started < 0.5 + 0.5
    assert answer["outcome"] == "failed" and answer["status"] is None
    assert "no answer within" in answer["detail"]


async def test_a_redirect_is_not_followed_nor_retried(setup: Setup) -> None:
    setup.hooks.fail_next(1, status=302)
    answer = await send_event(setup.kasd, event_metadata("e-1"))
    assert answer["outcome"] == "failed" and answer["status"] == 302
    assert "redirect" in answer["detail"]
    assert len(setup.hooks.requests) == 1


async def test_an_event_type_without_a_handler_is_ignored(setup: Setup) -> None:
    answer = await send_event(setup.kasd, event_metadata("e-1", event_type="tag"))
    assert answer == {"outcome": "ignored", "detail": "agentd has no handler for type 'tag'", "status": None}
    assert setup.hooks.requests == []


@pytest.mark.parametrize(("overrides", "named"), [
    ({"v": 2}, "version"),
    ({"id": ...}, "id"),
    ({"id": "a/b"}, "id"),
    ({"type": "Push"}, "type"),
    ({"seq": -1}, "seq"),
    ({"seq": True}, "seq"),
    ({"posted_at": "yesterday"}, "posted_at"),
    ({"posted_at": float("inf")}, "posted_at"),
])
async def test_a_bad_open_is_refused_naming_the_field(setup: Setup, overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(StreamRefusedError) as refused:
        await send_event(setup.kasd, event_metadata("e-1", **overrides))
    assert refused.value.code == TunnelCode.BAD_REQUEST
    assert refused.value.message.startswith(f"bad event: {named}") or named in refused.value.message
    assert setup.hooks.requests == []


@pytest.mark.parametrize(("payload", "problem"), [
    (b'"' + b"x" * (64 * 1024) + b'"', "payload is over 65536 bytes"),
    (b'{"ref": ', "payload is not JSON"),
    (b"[" * 30000 + b"]" * 30000, "payload is nested too deeply"),
    (b'"\xff"', "payload is not UTF-8"),
])
async def test_a_bad_payload_is_refused(setup: Setup, payload: bytes, problem: str) -> None:
    with pytest.raises(StreamRefusedError) as refused:
        await send_event(setup.kasd, event_metadata("e-1"), payload)
    assert refused.value.code == TunnelCode.BAD_REQUEST
    assert problem in refused.value.message
    assert setup.hooks.requests == []


async def test_a_payload_of_64_kib_is_taken(setup: Setup) -> None:
    payload = json.dumps({"blob": "x" * (64 * 1024 - 20)}).encode()
    payload += b" " * (64 * 1024 - len(payload))
    assert (await send_event(setup.kasd, event_metadata("e-1"), payload))["outcome"] == "done"


async def test_a_draining_agentd_refuses_new_events(setup: Setup) -> None:
    setup.handler.draining = True
    with pytest.raises(StreamRefusedError) as refused:
        await send_event(setup.kasd, event_metadata("e-1"))
    assert refused.value.code == TunnelCode.UPSTREAM_UNREACHABLE
    assert "shutting down" in refused.value.message
