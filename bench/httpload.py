"""A small HTTP/1.1 load generator on trio + h11: keep-alive connections, latency percentiles.

Used by ``bench/e2e.py``; plain functions so other benchmarks can reuse it.
"""

from __future__ import annotations

import ssl
import statistics
import time
from collections.abc import Sequence

import attrs
import h11
import trio


@attrs.frozen(kw_only=True)
class LoadResult:
    requests: int
    seconds: float
    latencies: tuple[float, ...]
    body_bytes: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
        return ordered[index]

    @property
    def mb_per_s(self) -> float:
        return self.body_bytes / self.seconds / 1e6

    @property
    def mean(self) -> float:
        return statistics.fmean(self.latencies)


class Connection:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, stream: trio.abc.Stream, host: str, port: int, ssl_context: ssl.SSLContext | None) -> None:
        self.stream = stream
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.conn = h11.Connection(h11.CLIENT)

    @staticmethod
    async def _dial(host: str, port: int, ssl_context: ssl.SSLContext | None) -> trio.abc.Stream:
        if ssl_context is not None:
            return await trio.open_ssl_over_tcp_stream(host, port, ssl_context=ssl_context, https_compatible=True)
        return await trio.open_tcp_stream(host, port)

    @classmethod
    async def open(cls, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None) -> Connection:
        return cls(await cls._dial(host, port, ssl_context), host, port, ssl_context)

    async def get(
        self, target: str, headers: Sequence[tuple[str, str]] = (), *, keep: bytearray | None = None
    ) -> tuple[int, int]:
        """GET ``target``; return (status, body bytes). The body is read and discarded, or added to
        ``keep`` when given (a small answer whose text matters)."""
        conn = self.conn
        request = h11.Request(method="GET", target=target, headers=[("host", self.host), *headers])
        await self.stream.send_all(conn.send(request) + conn.send(h11.EndOfMessage()))
        status = 0
        size = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await self.stream.receive_some(256 * 1024)
                conn.receive_data(data)
                if not data and conn.their_state is not h11.DONE:
                    raise ConnectionError("server closed the connection mid-response")
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if keep is not None:
                    keep += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("connection closed")
        if conn.our_state is h11.MUST_CLOSE:
            # The server ends keep-alive after so many requests (hypercorn: 1,000): dial again.
            await self.stream.aclose()
            self.stream = await self._dial(self.host, self.port, self.ssl_context)
            self.conn = h11.Connection(h11.CLIENT)
        else:
            conn.start_next_cycle()
        return status, size

    async def aclose(self) -> None:
        await self.stream.aclose()


async def run_load(
    host: str,
    port: int,
    target: str,
    *,
    concurrency: int,
    requests: int,
    headers: Sequence[tuple[str, str]] = (),
    ssl_context: ssl.SSLContext | None = None,
    warmup: int = 20,
) -> LoadResult:
    """``requests`` GETs spread over ``concurrency`` keep-alive connections; every answer must be 200."""
    connections = [await Connection.open(host, port, ssl_context=ssl_context) for _ in range(concurrency)]
    for conn in connections:
        for _ in range(max(1, warmup // concurrency)):
            await _checked(conn, target, headers)
    latencies: list[float] = []
    body = 0
    remaining = requests

    async def worker(conn: Connection) -> None:
        nonlocal remaining, body
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            body += await _checked(conn, target, headers)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for conn in connections:
            nursery.start_soon(worker, conn)
    elapsed = time.perf_counter() - start
    for conn in connections:
        await conn.aclose()
    return LoadResult(requests=len(latencies), seconds=elapsed, latencies=tuple(latencies), body_bytes=body)


async def _checked(conn: Connection, target: str, headers: Sequence[tuple[str, str]]) -> int:
    status, size = await conn.get(target, headers)
    if status != 200:
        raise RuntimeError(f"GET {target} answered {status}")
    return size
