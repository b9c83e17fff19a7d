"""A webhook receiver for tests: an HTTP/1.1 server on 127.0.0.1 that records every request, checks
its ``X-Kasd-Signature-256`` as a receiver would, and can be told to fail or hang the next requests.

    async with open_webhook_receiver(secret=b"s3cret") as hooks:
        ... configure agentd with webhook url=hooks.url, a secret file holding b"s3cret" ...
        await hooks.wait_for(1)
        assert hooks.events[0].body["type"] == "push" and hooks.events[0].signature_ok

``fail_next(n, status)`` answers the next ``n`` requests with ``status``; ``hang_next(n)`` never answers
them (the connection stays open until the sender gives up). ``events`` holds every request that got
a 2xx, in arrival order; ``requests`` holds every request, answered or not.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import h11
import trio

SIGNATURE_HEADER = "x-kasd-signature-256"


def verify_signature(secret: bytes, body: bytes, header: str | None) -> bool:
    """What a receiver does: recompute the HMAC-SHA256 of the raw body and compare in constant time."""
    expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
    return header is not None and hmac.compare_digest(expected, header)


@attrs.frozen(kw_only=True)
class ReceivedRequest:
    method: str
    target: str
    #: header names lower-case; a repeated header keeps its last value
    headers: dict[str, str]
    raw_body: bytes
    signature_ok: bool
    #: the status it was answered with, None when it was left hanging
    status: int | None

    @property
    def body(self) -> Any:
        return json.loads(self.raw_body)


class WebhookReceiver:
    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self.url = ""
        self.requests: list[ReceivedRequest] = []
        self.events: list[ReceivedRequest] = []
        self._plan: list[int | None] = []  # the answers to the next requests; None: hang
        self._changed = trio.Event()

    def fail_next(self, count: int, status: int = 500) -> None:
        self._plan += [status] * count

    def hang_next(self, count: int) -> None:
        self._plan += [None] * count

    async def wait_for(self, count: int, *, of: Callable[[WebhookReceiver], list[ReceivedRequest]] | None = None) -> None:
        """Until ``count`` events (or, with ``of``, items of that list) were received."""
        which = of or (lambda receiver: receiver.events)
        while len(which(self)) < count:
            await self._changed.wait()

    def _record(self, request: ReceivedRequest) -> None:
        self.requests.append(request)
        if request.status is not None and 200 <= request.status < 300:
            self.events.append(request)
        self._changed.set()
        self._changed = trio.Event()

    async def _serve(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                head: h11.Request | None = None
                body = b""
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(65536)
                        conn.receive_data(data)
                        if not data and conn.their_state is not h11.DONE:
                            return
                        continue
                    if isinstance(event, h11.Request):
                        head = event
                    elif isinstance(event, h11.Data):
                        body += bytes(event.data)
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                assert head is not None
                headers = {name.decode().lower(): value.decode() for name, value in head.headers}
                status = self._plan.pop(0) if self._plan else 200
                self._record(ReceivedRequest(
                    method=head.method.decode(), target=head.target.decode(), headers=headers, raw_body=body,
                    signature_ok=verify_signature(self.secret, body, headers.get(SIGNATURE_HEADER)), status=status))
                if status is None:
                    await trio.sleep_forever()
                reply = json.dumps({"ok": 200 <= status < 300}).encode()
                location = [("location", "http://example.invalid/elsewhere")] if 300 <= status < 400 else []
                await stream.send_all(conn.send(h11.Response(status_code=status, headers=[
                    ("content-type", "application/json"), ("content-length", str(len(reply))), *location])) or b"")
                await stream.send_all((conn.send(h11.Data(data=reply)) or b"") + (conn.send(h11.EndOfMessage()) or b""))
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            await trio.aclose_forcefully(stream)


@asynccontextmanager
async def open_webhook_receiver(secret: bytes = b"webhook-secret") -> AsyncIterator[WebhookReceiver]:
    receiver = WebhookReceiver(secret)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, receiver._serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        receiver.url = f"http://127.0.0.1:{port}/hooks/kasd"
        try:
            yield receiver
        finally:
            nursery.cancel_scope.cancel()


__all__ = ["ReceivedRequest", "WebhookReceiver", "open_webhook_receiver", "verify_signature"]
