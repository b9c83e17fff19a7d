"""agentd's HTTP/1.1 client to the API server, against a scripted server on 127.0.0.1: the framing
cases kubesim does not produce (HEAD answers, interim 100s, bodies ended by the close)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from agentd.kubeapi import KubeTarget
from agentd.upstream import InvalidRequest, UpstreamPool, UpstreamUnreachable
from tests.agentd.harness import head, read_http_head

pytestmark = pytest.mark.timeout(20)

#: (request head) -> the bytes to answer with, and whether to close afterwards
Script = Callable[[bytes], tuple[bytes, bool]]


@asynccontextmanager
async def scripted_server(script: Script) -> AsyncIterator[tuple[KubeTarget, list[bytes]]]:
    """Answer each request head on each connection with what ``script`` says; record the heads."""
    heads: list[bytes] = []

    async def serve(stream: trio.SocketStream) -> None:
        buffer = b""
        async with stream:
            while True:
                read = await read_http_head(stream, buffer)
                if read is None:
                    return
                request, buffer = read
                heads.append(request)
                answer, close = script(request)
                await stream.send_all(answer)
                if close:
                    return

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        yield KubeTarget(scheme="http", host="127.0.0.1", port=port), heads
        nursery.cancel_scope.cancel()


async def fetch(pool: UpstreamPool, method: str, target: str = "/api") -> tuple[int, bytes]:
    async with pool.request(head(method, target), None if method in ("GET", "HEAD") else _empty()) as response:
        return response.status, b"".join([chunk async for chunk in response])


def _empty() -> trio.abc.ReceiveStream:
    send, receive = trio.testing.memory_stream_one_way_pair()
    send.close()
    return receive


async def test_a_head_answer_has_no_body_and_its_connection_serves_the_next_request() -> None:
    def script(request: bytes) -> tuple[bytes, bool]:
        if request.startswith(b"HEAD"):
            return b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n", False
        return b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", False

    async with scripted_server(script) as (target, heads):
        pool = UpstreamPool(target)
        assert await fetch(pool, "HEAD") == (200, b"")
        assert await fetch(pool, "GET") == (200, b"hello")
        stats = pool.statistics()
        assert (stats.opened, stats.reused) == (1, 1)
        assert [h.split(b" ")[0] for h in heads] == [b"HEAD", b"GET"]
        await pool.aclose()


async def test_interim_answers_are_passed_over() -> None:
    async with scripted_server(lambda _: (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\n"
                                          b"Content-Length: 2\r\n\r\nok", False)) as (target, _):
        pool = UpstreamPool(target)
        assert await fetch(pool, "POST") == (201, b"ok")
        await pool.aclose()


async def test_a_body_without_length_ends_at_the_close_and_the_connection_is_not_reused() -> None:
    async with scripted_server(lambda _: (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", True)) as (target, _):
        pool = UpstreamPool(target)
        assert await fetch(pool, "GET") == (200, b"until the end")
        assert await fetch(pool, "GET") == (200, b"until the end")
        stats = pool.statistics()
        assert (stats.opened, stats.reused, stats.discarded) == (2, 0, 2)
        await pool.aclose()


async def test_a_server_that_closes_before_answering_is_unreachable() -> None:
    async with scripted_server(lambda _: (b"", True)) as (target, _):
        pool = UpstreamPool(target)
        with pytest.raises(UpstreamUnreachable, match="closed the connection before answering"):
            await fetch(pool, "GET")
        await pool.aclose()


async def test_a_head_that_would_break_the_message_is_refused_before_anything_is_sent() -> None:
    async with scripted_server(lambda _: (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", False)) as (target, heads):
        pool = UpstreamPool(target)
        with pytest.raises(InvalidRequest, match="illegal request target"):
            await fetch(pool, "GET", "/api v1")
        bad = head("GET", "/api", headers=(("x-evil", "a\r\nimpersonate-user: root"),))
        with pytest.raises(InvalidRequest, match="illegal header"):
            async with pool.request(bad, None):
                pass
        assert heads == []
        await pool.aclose()
