"""agentd's service handler on one end of an in-memory tunnel, kasd's side on the other, and small
HTTP/1.1 upstreams on 127.0.0.1 for it to reach: the fixture of the service handler's tests."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
import trio.testing

from agentd.proxy import UpstreamRequestRecord
from agentd.serviceproxy import ServiceProxy
from agentd.services import ServiceSettings
from tests.agentd.harness import read_all, read_http_head
from tunnelhttp.head import RequestHead, ResponseHead
from wire.session import MuxStream, Session, connect_session


@attrs.define(eq=False)
class ServiceTunnel:
    """kasd's session (it opens streams) and the proxy serving the agent's side."""

    kasd: Session
    proxy: ServiceProxy
    records: list[UpstreamRequestRecord]
    changed: list[trio.Event]

    async def wait_records(self, count: int) -> None:
        """Until ``count`` requests are finished (and recorded)."""
        while len(self.records) < count:
            await self.changed[0].wait()

    async def open(self, metadata: dict[str, Any], body: bytes = b"") -> MuxStream:
        stream = await self.kasd.open_stream(metadata)
        if body:
            await stream.send_all(body)
        await stream.send_eof()
        return stream

    async def request(self, method: str, target: str, *, service: str = "prometheus", body: bytes = b"",
                      headers: tuple[tuple[str, str], ...] = ()) -> tuple[ResponseHead, bytes]:
        """One whole exchange: the response head and body (raises StreamRefusedError when refused)."""
        stream = await self.open(service_head(method, target, service=service, headers=headers).to_metadata(), body)
        response = ResponseHead.from_metadata(await stream.wait_accepted())
        data = await read_all(stream)
        await stream.aclose()
        return response, data


def service_head(method: str, target: str, *, service: str | None = "prometheus",
                 headers: tuple[tuple[str, str], ...] = (), request_id: str = "req-1") -> RequestHead:
    return RequestHead(method=method, target=target, headers=(("accept", "application/json"), *headers),
                       kind="service", service=service, request_id=request_id)


@asynccontextmanager
async def service_tunnel(services: list[ServiceSettings]) -> AsyncIterator[ServiceTunnel]:
    left, right = trio.testing.memory_stream_pair()
    records: list[UpstreamRequestRecord] = []
    changed = [trio.Event()]

    def on_done(record: UpstreamRequestRecord) -> None:
        records.append(record)
        changed[0].set()
        changed[0] = trio.Event()

    proxy = ServiceProxy(services, on_done=on_done)
    async with trio.open_nursery() as nursery:
        sessions: dict[str, Session] = {}

        async def connect(name: str, transport: trio.abc.Stream, client: bool) -> None:
            sessions[name] = await connect_session(nursery, transport, client=client)

        async with trio.open_nursery() as both:
            both.start_soon(connect, "kasd", left, False)
            both.start_soon(connect, "agent", right, True)

        async def serve() -> None:
            while True:
                stream = await sessions["agent"].accept_stream()
                nursery.start_soon(proxy.handle, stream)

        nursery.start_soon(serve)
        try:
            yield ServiceTunnel(sessions["kasd"], proxy, records, changed)
        finally:
            with trio.move_on_after(1, shield=True):
                await proxy.aclose()
            nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class Upstream:
    """An HTTP/1.1 server on 127.0.0.1 answering with ``answer``; keeps the request heads it read."""

    port: int
    heads: list[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def header(self, index: int, name: str) -> str | None:
        for line in self.heads[index].split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.encode():
                return value.strip().decode()
        return None

    def request_line(self, index: int = 0) -> str:
        return self.heads[index].split(b"\r\n", 1)[0].decode()


Answer = Callable[[trio.SocketStream, bytes, bytes], Awaitable[None]]


async def serve_upstream(nursery: trio.Nursery, answer: Answer) -> Upstream:
    """``answer(stream, head, bytes after the head)`` for each request head read."""
    upstream = Upstream(0, [])

    async def handle(stream: trio.SocketStream) -> None:
        buffer = b""
        while True:
            read = await read_http_head(stream, buffer)
            if read is None:
                return
            head, buffer = read
            upstream.heads.append(head)
            await answer(stream, head, buffer)
            buffer = b""

    listeners = await nursery.start(functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    upstream.port = int(listeners[0].socket.getsockname()[1])
    return upstream


async def answer_json(stream: trio.SocketStream, head: bytes, rest: bytes, document: Any = None) -> None:
    body = json.dumps(document if document is not None else {"status": "success"}).encode()
    await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                          % (len(body), body))


__all__ = ["ServiceTunnel", "Upstream", "answer_json", "serve_upstream", "service_head", "service_tunnel"]
