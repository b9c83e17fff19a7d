"""Drains and handovers: kasd's drain ends watches between two events, over HTTP/1.1 and HTTP/2, long
before its timeout; a request that crossed an agentd's GOAWAY goes to another session."""

from __future__ import annotations

import json
import logging

import h2.events
import pytest
import trio

from kasd.server import Runtime
from tests.kasd.helpers import (
    CI_TOKEN,
    H1Client,
    Handler,
    accept,
    bearer,
    fake_agent,
    http_request,
    json_handler,
    running_kasd,
)
from tests.kasd.test_http2_tls import H2Client
from tunnelhttp.head import RequestHead, ResponseHead
from wire.errors import ErrorCode
from wire.session import MuxStream, Session

pytestmark = pytest.mark.timeout(20)

FIRST = b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\n'
SECOND = b'{"type":"MODIFIED","object":{"metadata":{"name":"a"}}}\n'


def event_and_a_half(rest: trio.Event) -> Handler:
    """A watch that sends one event and half of the next; the other half once ``rest`` is set (kasd
    is draining by then); then, like a watch, nothing more, ever."""

    async def handler(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await accept(stream, ResponseHead(status=200, headers=(("content-type", "application/json"),)))
        await stream.send_all(FIRST + SECOND[:10])
        await rest.wait()
        await stream.send_all(SECOND[10:])
        await trio.sleep_forever()

    return handler


async def _drain(kasd: Runtime, rest: trio.Event) -> None:
    kasd.request_shutdown()
    await kasd.health.drain_started.wait()
    rest.set()


async def test_http1_watch_ends_with_its_last_whole_event(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kasd.access")
    rest = trio.Event()
    with trio.fail_after(5):  # kasd's drain timeout is 20 s: the watch does not wait for it
        async with running_kasd() as kasd, fake_agent(kasd, event_and_a_half(rest)):
            client = await H1Client.connect(kasd.port("kubernetes_api"))
            await client.request("GET", "/api/v1/pods?watch=1", [bearer(CI_TOKEN)])
            assert (await client.response()).status_code == 200
            body = await client.chunk() or b""
            await _drain(kasd, rest)
            body += await client.body()  # ends with the last chunk: a whole body, not a cut one
            await client.aclose()
    assert body == FIRST + SECOND
    assert "outcome=drained" in caplog.text


async def test_http2_watch_ends_with_its_last_whole_event() -> None:
    rest = trio.Event()
    with trio.fail_after(5):
        async with running_kasd() as kasd, fake_agent(kasd, event_and_a_half(rest)):
            tcp = await trio.open_tcp_stream("127.0.0.1", kasd.port("kubernetes_api"))
            client = H2Client(tcp)
            sid = await client.request("GET", "/api/v1/pods?watch=true", [bearer(CI_TOKEN)])
            assert isinstance(await client.next_event(sid), h2.events.ResponseReceived)
            body = b""
            while not body.startswith(FIRST):
                event = await client.next_event(sid)
                assert isinstance(event, h2.events.DataReceived)
                body += event.data
            await _drain(kasd, rest)
            _, rest_of_body = await client.response(sid)  # END_STREAM, not RST_STREAM
            await tcp.aclose()
    assert body + rest_of_body == FIRST + SECOND


def refuse_first_then_answer(answer: Handler = json_handler) -> tuple[Handler, list[str]]:
    """The first request is refused as a draining agentd refuses what crossed its GOAWAY; later
    ones get ``answer``. Returns the handler and the methods it saw."""
    seen: list[str] = []

    async def handler(stream: MuxStream, head: RequestHead, session: Session) -> None:
        seen.append(head.method)
        if len(seen) == 1:
            await stream.refuse(ErrorCode.REFUSED_STREAM, "not processed before GOAWAY")
            return
        await answer(stream, head, session)

    return handler, seen


async def test_a_get_the_agent_did_not_take_goes_to_another_session_http1() -> None:
    handler, seen = refuse_first_then_answer()
    async with running_kasd() as kasd, fake_agent(kasd, handler):
        reply = await http_request(kasd.port("kubernetes_api"), "GET", "/api/v1/pods?watch=1", [bearer(CI_TOKEN)])
    assert reply.status == 200 and reply.json()["target"] == "/api/v1/pods?watch=1"
    assert seen == ["GET", "GET"]


async def test_a_get_the_agent_did_not_take_goes_to_another_session_http2() -> None:
    handler, seen = refuse_first_then_answer()
    async with running_kasd() as kasd, fake_agent(kasd, handler):
        tcp = await trio.open_tcp_stream("127.0.0.1", kasd.port("kubernetes_api"))
        client = H2Client(tcp)
        headers, body = await client.response(await client.request("GET", "/api/v1/pods", [bearer(CI_TOKEN)]))
        await tcp.aclose()
    assert headers[":status"] == "200" and json.loads(body)["target"] == "/api/v1/pods"
    assert seen == ["GET", "GET"]


async def test_a_request_with_a_body_is_not_repeated() -> None:
    # kasd has already passed (part of) the body on: it cannot send it again, so the client is told.
    handler, seen = refuse_first_then_answer()
    async with running_kasd() as kasd, fake_agent(kasd, handler):
        reply = await http_request(kasd.port("kubernetes_api"), "POST", "/api/v1/namespaces/default/configmaps",
                                   [bearer(CI_TOKEN)], b'{"kind": "ConfigMap"}')
    assert reply.status == 503 and "not processed before GOAWAY" in reply.json()["message"]
    assert seen == ["POST"]


async def test_a_retry_that_fails_frees_its_stream() -> None:
    # The second attempt answers with a head kasd cannot read: 502, and neither stream stays open.
    async def unreadable_head(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await stream.accept({"status": "not a status"})
        await trio.sleep_forever()

    handler, seen = refuse_first_then_answer(unreadable_head)
    async with running_kasd() as kasd, fake_agent(kasd, handler):
        reply = await http_request(kasd.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
        assert reply.status == 502 and "invalid response head" in reply.json()["message"]
        assert seen == ["GET", "GET"]
        assert [t.session.active_streams for t in kasd.registry.tunnels()] == [0]
