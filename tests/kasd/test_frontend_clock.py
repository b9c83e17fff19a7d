"""kasd.k8sproxy.frontend.ConnectionClock: the one clock both front ends keep — its rules sans-I/O,
then the HTTP/1.1 side of each over an in-memory connection with trio's MockClock (autojump). The
HTTP/2 side is tested end to end in test_hostile_h2.py (the same rules, the same clock)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from kasd.k8sproxy import http1, http2
from kasd.k8sproxy.accesslog import RequestRecord
from kasd.k8sproxy.exchange import Exchange
from kasd.k8sproxy.frontend import UNAUTHORIZED_ANSWERS, ConnectionClock, FrontEndContext
from kasd.k8sproxy.http1 import Http1Connection
from kasd.k8sproxy.status import ProxyError, status_body, status_headers

pytestmark = pytest.mark.timeout(10)

HEADER_TIMEOUT = 30.0
IDLE_TIMEOUT = 120.0


def _record(*, agent_id: int | None = None, dropped: bool = False) -> RequestRecord:
    record = RequestRecord(request_id="r", method="GET", path="/api", protocol="HTTP/1.1", peer="127.0.0.1:1",
                           agent_id=agent_id, status=0 if dropped else 401, started=0.0)
    if dropped:
        record.outcome = "client-gone"
    return record


def _clock(*, gated: bool = True) -> ConnectionClock:
    return ConnectionClock(head_deadline=HEADER_TIMEOUT, header_timeout=HEADER_TIMEOUT, idle_timeout=IDLE_TIMEOUT,
                           gated=gated, idle_since=0.0)


def _serve(clock: ConnectionClock, record: RequestRecord | None, now: float) -> None:
    clock.request_started()
    assert clock.next_request_deadline() == math.inf  # no clock while a request runs
    clock.request_ended(record, now)


def test_until_a_request_passes_the_head_deadline_is_hard_and_four_refusals_close() -> None:
    clock = _clock()
    assert (clock.next_request_deadline(), clock.head_due(5.0), clock.answer_deadline()) == (30.0,) * 3
    _serve(clock, _record(dropped=True), 1.0)  # a request the client dropped is no answer
    _serve(clock, None, 1.5)  # nor one that never reached the pipeline
    for n in range(1, UNAUTHORIZED_ANSWERS):
        _serve(clock, _record(), 2.0 * n)
        # refused: still the head deadline from accept, never the idle clock from the answer
        assert (clock.next_request_deadline(), clock.head_due(2.0 * n + 1), clock.answer_deadline()) == (30.0,) * 3
        assert clock.takes_requests(draining=False) and not clock.over(draining=False)
    assert clock.answer_may_be_last
    clock.request_started()
    clock.request_ended(_record(), 10.0)
    assert not clock.takes_requests(draining=False) and clock.over(draining=False)
    assert not clock.past_head_deadline(29.9) and clock.past_head_deadline(30.0)
    assert clock.expiry() == "sent no authorized request in time"
    assert _clock().expiry() == "sent no request in time"


def test_once_a_request_passed_the_idle_clock_counts_from_the_last_request_and_refusals_do_not_close() -> None:
    clock = _clock()
    _serve(clock, _record(agent_id=1), 5.0)
    assert clock.next_request_deadline() == 5.0 + IDLE_TIMEOUT
    assert (clock.head_due(50.0), clock.answer_deadline()) == (50.0 + HEADER_TIMEOUT, math.inf)
    for n in range(2 * UNAUTHORIZED_ANSWERS):
        _serve(clock, _record(), 10.0 + n)
    assert clock.takes_requests(draining=False) and not clock.answer_may_be_last
    assert clock.next_request_deadline() == 10.0 + 2 * UNAUTHORIZED_ANSWERS - 1 + IDLE_TIMEOUT
    assert not clock.past_head_deadline(1000.0)  # the idle clock closes it, not the head deadline


def test_draining_a_connection_takes_no_request_and_closes_once_none_runs() -> None:
    clock = _clock()
    clock.request_started()
    assert not clock.takes_requests(draining=True) and not clock.over(draining=True)
    clock.request_ended(_record(agent_id=1), 3.0)
    assert clock.over(draining=True) and not clock.over(draining=False)


def test_a_port_without_verdicts_keeps_only_the_head_and_idle_clocks() -> None:
    """The REST API port: its app checks a job token per call, and the front end is told nothing."""
    clock = _clock(gated=False)
    assert clock.next_request_deadline() == HEADER_TIMEOUT  # the first head: from accept
    for n in range(2 * UNAUTHORIZED_ANSWERS):
        _serve(clock, _record(), 1.0 + n)
        assert (clock.next_request_deadline(), clock.head_due(50.0)) == (1.0 + n + IDLE_TIMEOUT, 50.0 + HEADER_TIMEOUT)
    assert clock.takes_requests(draining=False) and clock.answer_deadline() == math.inf
    assert not clock.answer_may_be_last and not clock.past_head_deadline(1000.0)


# ---------------------------------------------------------------------- the HTTP/1.1 side


@attrs.frozen
class _Limits:
    max_header_bytes: int = 16 * 1024
    header_timeout: float = HEADER_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    http2: Any = None


def _request(token: str, *, close: bool = False) -> bytes:
    extra = b"Connection: close\r\n" if close else b""
    return b"GET /api HTTP/1.1\r\nHost: k\r\nAuthorization: Bearer %s\r\n%s\r\n" % (token.encode(), extra)


async def _fake_pipeline(ex: Exchange, *, refusal: ProxyError | None = None, log_dropped: bool = True,
                         done: Callable[[RequestRecord], object] | None = None,
                         proven: Callable[[], object] | None = None) -> None:
    """The pipeline's part the clock hears of: ``good`` passes (the agent answers), others are 401."""
    request = ex.request
    record = RequestRecord(request_id="r", method=request.method, path=request.target, protocol=request.protocol,
                           peer=request.peer)
    try:
        assert ex.take_empty_body()
        if ("authorization", "Bearer good") in request.headers:
            record.agent_id, record.status = 1, 200
            await ex.respond(200, [("content-length", "2")], b"{}", end=True)
        elif ("authorization", "Bearer slow") in request.headers:  # passes, then its agent is late
            record.agent_id, record.status = 1, 503
            if proven is not None:
                proven()
            await trio.sleep(HEADER_TIMEOUT + 10)
            body = status_body(503, "agent 1 is not connected")
            await ex.send_error(503, status_headers(body), body)
        else:
            record.status = 401
            body = status_body(401, "bad token")
            await ex.send_error(401, status_headers(body), body)
    finally:
        if done is not None:
            done(record)


@attrs.define
class _Ended:
    port: FrontEndContext
    at: list[float] = attrs.field(factory=list)
    event: trio.Event = attrs.field(factory=trio.Event)


async def _connect(*, lockstep: bool = False) -> tuple[trio.abc.Stream, Callable[[trio.Nursery], None], _Ended]:
    """A client stream to an HTTP/1.1 connection of the proxy port (with the fake pipeline), a
    starter for it, and when it ended."""
    pair = trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair
    client, server = pair()
    port = FrontEndContext(limits=_Limits(), serve=_fake_pipeline, count_rejected=lambda status: None)
    ended = _Ended(port)

    async def run() -> None:
        connection = Http1Connection(server, port, initial=b"", peer="127.0.0.1:1",
                                     head_deadline=trio.current_time() + HEADER_TIMEOUT)
        try:
            await connection.run()
        finally:
            ended.at.append(trio.current_time())
            ended.event.set()
            await server.aclose()

    return client, lambda nursery: nursery.start_soon(run), ended


async def _read_until_closed(client: trio.abc.Stream) -> bytes:
    out = b""
    while chunk := await client.receive_some(65536):
        out += chunk
    return out


def _answers(raw: bytes) -> list[bytes]:
    """The response heads in ``raw``."""
    return [b"HTTP/1.1" + part.split(b"\r\n\r\n", 1)[0] for part in raw.split(b"HTTP/1.1")[1:]]


async def test_http1_closes_after_four_refused_answers_and_the_fourth_says_so(
        autojump_clock: trio.testing.MockClock) -> None:
    client, start, ended = await _connect()
    async with trio.open_nursery() as nursery:
        start(nursery)
        await client.send_all(_request("wrong") * (UNAUTHORIZED_ANSWERS + 2))
        heads = _answers(await _read_until_closed(client))
    assert [head.split(b" ")[1] for head in heads] == [b"401"] * UNAUTHORIZED_ANSWERS  # the 5th is never read
    assert [b"connection: close" in head for head in heads] == [False] * (UNAUTHORIZED_ANSWERS - 1) + [True]
    assert ended.at == [0.0]  # at once, not at a deadline


async def test_http1_after_a_refusal_closes_at_the_head_deadline_from_accept(
        autojump_clock: trio.testing.MockClock) -> None:
    """Before, a 401 gave the connection the idle clock (120 s) afresh, so a stranger could hold
    it for ever with one refused request per 2 minutes."""
    client, start, ended = await _connect()
    async with trio.open_nursery() as nursery:
        start(nursery)
        await trio.sleep(10)
        await client.send_all(_request("wrong"))
        heads = _answers(await _read_until_closed(client))
    assert len(heads) == 1 and b"401" in heads[0]
    assert ended.at == [HEADER_TIMEOUT]


async def test_http1_once_a_request_passed_the_idle_clock_rules_and_refusals_do_not_close(
        autojump_clock: trio.testing.MockClock) -> None:
    client, start, ended = await _connect()
    async with trio.open_nursery() as nursery:
        start(nursery)
        await client.send_all(_request("good") + _request("wrong") * 2 * UNAUTHORIZED_ANSWERS)
        await trio.sleep(100)  # past the head deadline: the connection passed
        await client.send_all(_request("good"))
        heads = _answers(await _read_until_closed(client))
    assert [head.split(b" ")[1] for head in heads] == [b"200"] + [b"401"] * 2 * UNAUTHORIZED_ANSWERS + [b"200"]
    assert not any(b"connection: close" in head for head in heads)
    assert ended.at == [100.0 + IDLE_TIMEOUT]  # idle from the end of the last request


async def test_http1_a_refused_answer_left_unread_ends_at_the_head_deadline(
        autojump_clock: trio.testing.MockClock) -> None:
    """A client that never reads its 401 does not hold the connection past its head deadline (as
    an HTTP/2 client that leaves its window shut)."""
    client, start, ended = await _connect(lockstep=True)
    async with trio.open_nursery() as nursery:
        start(nursery)
        await client.send_all(_request("wrong"))
        with trio.fail_after(HEADER_TIMEOUT + 1):
            await ended.event.wait()
        nursery.cancel_scope.cancel()
    assert ended.at == [HEADER_TIMEOUT]


async def test_http1_a_first_request_proved_then_answered_late_is_answered_not_cut(
        autojump_clock: trio.testing.MockClock) -> None:
    """The head deadline holds connections none of whose requests was authorized; a request
    authorized at once whose Status comes later (an agent that is slow to connect, a managed
    namespace that takes long) is answered whole: the pipeline tells the clock at authorization."""
    client, start, _ended = await _connect()
    async with trio.open_nursery() as nursery:
        start(nursery)
        await client.send_all(_request("slow"))
        with trio.fail_after(HEADER_TIMEOUT + 20):
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = await client.receive_some(65536)
                assert chunk, head
                head += chunk
        nursery.cancel_scope.cancel()
    assert head.startswith(b"HTTP/1.1 503 "), head


async def test_http1_draining_closes_an_idle_connection_at_once(
        autojump_clock: trio.testing.MockClock) -> None:
    client, start, ended = await _connect()
    async with trio.open_nursery() as nursery:
        start(nursery)
        await client.send_all(_request("good"))
        assert b"connection: close" not in await client.receive_some(65536)
        await trio.sleep(5)
        ended.port.draining = True  # what ProxyServer.start_drain does
        for scope in list(ended.port.idle_scopes):
            scope.cancel()
        assert await _read_until_closed(client) == b""
    assert ended.at == [5.0]  # at once, not at the idle deadline


def test_the_front_ends_name_no_verdict_router_tunnel_or_grant() -> None:
    """docs/architecture.md, rule 2: "grep them for ``authoriz``, ``router``, ``tunnel``, ``grant``
    and find nothing" — what a request means is decided in the pipeline (and what a verdict does
    to a connection, in ``frontend.ConnectionClock``)."""
    for module in (http1, http2):
        assert module.__file__ is not None
        text = Path(module.__file__).read_text()
        assert not re.findall(r"(?i)authoriz|router|tunnel|grant", text), module.__name__
