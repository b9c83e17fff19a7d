"""The retry policy (``routing.retry``) alone: fake streams and a fake router, no session, no clock."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from routing.errors import NoOtherSession
from routing.retry import SAFE_METHODS, repeatable, take_or_retry
from tunnelhttp.head import TunnelCode
from wire.errors import ErrorCode
from wire.session import SessionClosedError, StreamRefusedError, StreamResetError

pytestmark = pytest.mark.timeout(10)


@attrs.define(eq=False)
class FakeStream:
    session: str
    #: what ``wait_accepted`` raises, or the ACCEPT metadata
    answer: Any
    closed: bool = False
    eof: bool = False

    async def wait_accepted(self) -> Any:
        await trio.lowlevel.checkpoint()
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    async def aclose(self) -> None:
        self.closed = True
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        self.eof = True
        await trio.lowlevel.checkpoint()


class FakeRouter:
    """Opens the next of ``streams`` for each call; ``NoOtherSession`` when ``avoid`` covers all."""

    def __init__(self, streams: list[FakeStream], sessions: set[str]) -> None:
        self.streams = streams
        self.sessions = sessions
        self.avoided: list[frozenset[Any]] = []
        self.reports: list[tuple[str, int | None]] = []

    async def open_stream(self, agent_id: int, metadata: Any, *, avoid: frozenset[Any] = frozenset()) -> Any:
        await trio.lowlevel.checkpoint()
        self.avoided.append(avoid)
        if avoid and self.sessions <= avoid:
            raise NoOtherSession(agent_id)
        return self.streams.pop(0)

    def report(self, stream: Any, refusal: StreamRefusedError | None) -> None:
        self.reports.append((stream.session, None if refusal is None else refusal.code))


async def take(first: FakeStream, router: FakeRouter, *, method: str = "GET", bodiless: bool = True) -> Any:
    return await take_or_retry(first, agent_id=1, metadata={"method": method}, method=method,  # type: ignore[arg-type]
                               bodiless=bodiless, open_stream=router.open_stream, report=router.report)


async def test_a_refused_get_goes_to_a_session_it_has_not_tried() -> None:
    first = FakeStream("a", StreamRefusedError(ErrorCode.REFUSED_STREAM, "GOAWAY crossed it"))
    second = FakeStream("b", {"status": 200})
    router = FakeRouter([second], {"a", "b"})
    stream, accepted = await take(first, router)
    assert stream is second and accepted == {"status": 200}
    assert router.avoided == [frozenset({"a"})]
    assert second.eof and first.closed and not second.closed
    assert router.reports == [("a", ErrorCode.REFUSED_STREAM), ("b", None)]


async def test_an_unreachable_api_server_with_no_other_session_is_the_agents_own_answer() -> None:
    refusal = StreamRefusedError(TunnelCode.UPSTREAM_UNREACHABLE, "connection refused")
    router = FakeRouter([], {"a"})
    with pytest.raises(StreamRefusedError) as caught:
        await take(FakeStream("a", refusal), router)
    assert caught.value is refusal


async def test_a_not_processed_refusal_with_no_other_session_asks_the_same_one_again() -> None:
    again = FakeStream("a", {"status": 200})
    router = FakeRouter([again], {"a"})
    stream, _ = await take(FakeStream("a", StreamRefusedError(ErrorCode.REFUSED_STREAM, "full")), router)
    assert stream is again and router.avoided == [frozenset({"a"}), frozenset()]


@pytest.mark.parametrize(("method", "lost", "bodiless", "retried"), [
    ("GET", SessionClosedError("agentd went away"), True, True),
    ("PATCH", SessionClosedError("agentd went away"), True, False),  # not safe to repeat
    ("GET", StreamResetError(ErrorCode.CANCEL, "reset", remote=True), True, False),  # a reset is somebody's word
    ("GET", StreamRefusedError(ErrorCode.REFUSED_STREAM, "x"), False, False),  # its body went on already
])
async def test_what_goes_again(method: str, lost: Exception, bodiless: bool, retried: bool) -> None:
    router = FakeRouter([FakeStream("b", {"status": 200})], {"a", "b"})
    if retried:
        stream, _ = await take(FakeStream("a", lost), router, method=method, bodiless=bodiless)
        assert stream.session == "b"
    else:
        with pytest.raises(type(lost)):
            await take(FakeStream("a", lost), router, method=method, bodiless=bodiless)
        assert router.avoided == []


async def test_at_most_two_further_sessions_and_each_retry_stream_is_closed() -> None:
    refused = StreamRefusedError(ErrorCode.REFUSED_STREAM, "full")
    retries = [FakeStream("b", refused), FakeStream("c", refused)]
    router = FakeRouter(list(retries), {"a", "b", "c", "d"})
    with pytest.raises(StreamRefusedError):
        await take(FakeStream("a", refused), router)
    assert len(router.avoided) == 2 and all(s.closed for s in retries)


def test_the_holder_repeats_what_the_pipeline_would() -> None:
    assert {"GET", "HEAD", "OPTIONS"} == SAFE_METHODS
    assert repeatable("HEAD", SessionClosedError("gone")) and not repeatable("POST", SessionClosedError("gone"))
    assert not repeatable("GET", StreamResetError(ErrorCode.CANCEL, "reset", remote=True))
