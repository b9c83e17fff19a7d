"""ASGI plumbing shared by the handlers: replies, bodies, streamed responses, query values and
content negotiation. Nothing here knows about Kubernetes objects."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import attrs
import trio

from kubesim.errors import ApiError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Query = dict[str, list[str]]

MAX_BODY = 16 * 1024 * 1024


@attrs.frozen(kw_only=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


def json_reply(status: int, body: Any, *, content_type: str = "application/json",
               warnings: list[str] | None = None) -> Reply:
    """A JSON reply; `warnings` become `Warning: 299 - "…"` headers, which kubectl prints."""
    headers = tuple(("warning", '299 - "' + w.replace("\\", "\\\\").replace('"', '\\"') + '"')
                    for w in warnings or [])
    return Reply(status=status, body=json.dumps(body, separators=(",", ":")).encode(),
                 content_type=content_type, headers=headers)


async def send_reply(send: Send, reply: Reply) -> None:
    await send({"type": "http.response.start", "status": reply.status, "headers": [
        (b"content-type", reply.content_type.encode()),
        (b"content-length", str(len(reply.body)).encode()),
        (b"cache-control", b"no-cache, private"),
        *((k.encode(), v.encode()) for k, v in reply.headers),
    ]})
    await send({"type": "http.response.body", "body": reply.body})


def flag(query: Query, name: str) -> bool:
    return (query.get(name) or [""])[-1].lower() in ("true", "1")


def one(query: Query, name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def json_or_empty(body: bytes) -> dict[str, Any]:
    if not body:
        return {}
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def accept_form(accept: str) -> str:
    """Which form the client asked for first: "Table", "PartialObjectMetadata" or "" (plain)."""
    for part in accept.split(","):
        params = {p.strip() for p in part.split(";")[1:]}
        media = part.split(";")[0].strip()
        if "as=Table" in params and "g=meta.k8s.io" in params and media in ("application/json", "*/*"):
            return "Table"
        if ("as=PartialObjectMetadata" in params or "as=PartialObjectMetadataList" in params) and media == "application/json":
            return "PartialObjectMetadata"
        if media in ("application/json", "*/*", "application/yaml") and not params & {"as=Table"}:
            return ""
    return ""


async def read_body(receive: Receive) -> bytes:
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise ApiError(413, "RequestEntityTooLarge", "the request body is too large")
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def start_stream(send: Send, content_type: str) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", content_type.encode()), (b"cache-control", b"no-cache, private")]})


async def pump(chunks: AsyncIterator[bytes], receive: Receive, send: Send) -> None:
    """Send each chunk as it comes until the stream ends or the client goes away."""
    async with trio.open_nursery() as nursery:

        async def watch_disconnect() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(watch_disconnect)
        try:
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                with trio.CancelScope(shield=True):
                    await aclose()
        nursery.cancel_scope.cancel()


async def refuse_websocket(scope: Scope, send: Send, exc: ApiError) -> None:
    """Answer a WebSocket upgrade with the error's Status (or a policy close, if the server
    cannot send HTTP responses to upgrades)."""
    body = json.dumps(exc.status()).encode()
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await send({"type": "websocket.http.response.start", "status": exc.code,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})
