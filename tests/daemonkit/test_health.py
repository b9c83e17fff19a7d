"""daemonkit's health server: the routes a daemon supplies, and a fixed budget for a stranger (a bad,
oversized or slow request gets its answer, then the connection closes)."""

from __future__ import annotations

import logging
from functools import partial

import pytest
import trio
import trio.testing

from daemonkit.health import HealthResponse, HealthServer, liveness, readiness_route, serve_health
from netio.admission import ConnectionCaps

pytestmark = pytest.mark.timeout(10)


def _server(reason: list[str | None]) -> HealthServer:
    return HealthServer({"/liveness": liveness, "/readiness": readiness_route(lambda: reason[0])}, max_head=1024)


async def _exchange(server: HealthServer, request: bytes, *, close: bool = False) -> bytes:
    client, served = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.handle_connection, served)
        if request:
            await client.send_all(request)
        if close:
            await client.send_eof()
        data = b""
        while chunk := await client.receive_some():
            data += chunk
    return data


def _status(data: bytes) -> int:
    return int(data.split(b" ", 2)[1])


async def test_routes_answer_and_close() -> None:
    reason: list[str | None] = ["no tunnel"]
    server = _server(reason)
    data = await _exchange(server, b"GET /liveness HTTP/1.1\r\nhost: x\r\n\r\n")
    assert _status(data) == 200 and data.endswith(b"\r\n\r\nok\n") and b"connection: close" in data
    data = await _exchange(server, b"GET /readiness?verbose HTTP/1.1\r\nhost: x\r\n\r\n")
    assert _status(data) == 503 and data.endswith(b"no tunnel\n")
    reason[0] = None
    assert _status(await _exchange(server, b"GET /readiness HTTP/1.1\r\nhost: x\r\n\r\n")) == 200
    data = await _exchange(server, b"HEAD /liveness HTTP/1.1\r\nhost: x\r\n\r\n")
    assert _status(data) == 200 and data.endswith(b"\r\n\r\n")  # no body for HEAD
    data = await _exchange(server, b"GET /nope HTTP/1.1\r\nhost: x\r\n\r\n")
    assert _status(data) == 404 and b"/liveness, /readiness" in data
    assert _status(await _exchange(server, b"POST /liveness HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")) == 405


async def test_a_route_sets_its_content_type() -> None:
    server = HealthServer({"/metrics": lambda: HealthResponse(200, b"m 1\n", "text/plain; version=0.0.4")})
    data = await _exchange(server, b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
    assert b"content-type: text/plain; version=0.0.4" in data and data.endswith(b"m 1\n")


async def test_a_malformed_request_gets_400() -> None:
    data = await _exchange(_server([None]), b"NOT HTTP AT ALL\r\n\r\n")
    assert _status(data) == 400 and b"connection: close" in data
    assert data.endswith(b"\r\n\r\nmalformed HTTP/1.1 request\n")  # the client's bytes are not echoed


async def test_an_oversized_head_gets_431_without_reading_it_all() -> None:
    request = b"GET /liveness HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * 4096 + b"\r\n\r\n"
    data = await _exchange(_server([None]), request)
    assert _status(data) == 431 and data.endswith(b"request head too large\n")


async def test_a_slow_head_gets_408(autojump_clock: trio.abc.Clock) -> None:
    server = _server([None])
    client, served = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.handle_connection, served)
        await client.send_all(b"GET /liveness HTTP/1.1\r\n")  # and never the rest
        data = b""
        while chunk := await client.receive_some():
            data += chunk
    assert _status(data) == 408 and trio.current_time() >= server.header_timeout


async def test_connections_beyond_the_limit_are_closed_at_once() -> None:
    server = HealthServer({"/liveness": liveness}, max_connections=1)
    holder, held = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.handle_connection, held)
        await trio.testing.wait_all_tasks_blocked()
        assert server.connections == 1
        assert await _exchange(server, b"GET /liveness HTTP/1.1\r\nhost: x\r\n\r\n") == b""
        await holder.send_all(b"GET /liveness HTTP/1.1\r\nhost: x\r\n\r\n")
        assert _status(await holder.receive_some()) == 200
    assert server.connections == 0


async def test_a_client_that_leaves_without_asking_gets_nothing() -> None:
    assert await _exchange(_server([None]), b"", close=True) == b""


async def test_serve_health_names_the_port_it_cannot_bind(taken_port: int) -> None:
    with pytest.raises(OSError, match=rf"cannot listen on 127.0.0.1:{taken_port} \(the health address\)"):
        await serve_health("127.0.0.1", taken_port, {}, what="the health address")


async def _get(port: int, source: str | None = None) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
    await stream.send_all(b"GET /liveness HTTP/1.1\r\nhost: x\r\n\r\n")
    data = b""
    while chunk := await stream.receive_some():
        data += chunk
    await stream.aclose()
    return data


async def test_serve_health_resets_connections_beyond_its_caps(caplog: pytest.LogCaptureFixture) -> None:
    caps = ConnectionCaps(max_connections=2, max_per_source=1)
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(partial(serve_health, "127.0.0.1", 0, {"/liveness": liveness}, what="t", caps=caps))
        held = await trio.open_tcp_stream("127.0.0.1", port)  # accepted first: connections are taken in order
        with caplog.at_level(logging.WARNING, logger="daemonkit.health"):
            for _ in range(5):
                with trio.fail_after(1):
                    try:
                        refused = await trio.open_tcp_stream("127.0.0.1", port)
                        with pytest.raises(trio.BrokenResourceError):  # reset, unread
                            await refused.receive_some()
                    except OSError:
                        pass  # the reset overtook the connect
        lines = [r.getMessage() for r in caplog.records if r.name == "daemonkit.health"]
        assert len(lines) == 1 and "listener=health peer=127.0.0.1:" in lines[0], lines
        assert "reason=max_connections_per_source limit=1" in lines[0]
        assert _status(await _get(port, source="127.0.0.2")) == 200  # another source
        await held.aclose()
        nursery.cancel_scope.cancel()
