"""``AgentApi``: kasd's own requests to an agent's Kubernetes API through the ``Router`` — one
answer read whole (``request``: a JSON object, a Status), or a streamed one (``open``: a watch,
``logs?follow=true``) — as the agent itself or impersonating someone (``impersonate``). The stream's
lifecycle is the pipeline's (``kasd.agentstream``): the router is told how the agent answered, and
fails the same way. Managed namespaces (``kasd.managed``) and environments (``kasd.environments``)
both use it.

Every failure to get an answer is an ``AgentRequestError`` (status and a message safe to show:
names the agent, never a token). No deadline of its own: the caller holds one around each call.

May import: ``kasd.seams``, ``kasd.agentstream``, ``tunnelhttp``, ``wire``, trio, attrs, the
standard library.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from daemonkit.logs import current_request_id
from kasd.agentstream import AgentStreamError, open_stream, response_head
from kasd.seams import Router
from tunnelhttp.head import Headers, Impersonation, RequestHead, TunnelCode
from tunnelhttp.requestid import new_request_id
from wire.errors import RemoteProtocolError, UnsendableFrameError
from wire.session import MuxStream, SessionClosedError, StreamRefusedError, StreamResetError

#: the most of an answer ``request`` reads by default (a Status or one object)
MAX_ANSWER = 1 << 20

#: what breaks a stream to an agent (the tunnel, the agent, the session)
TUNNEL_FAILURES = (StreamRefusedError, StreamResetError, SessionClosedError, trio.BrokenResourceError,
                   RemoteProtocolError, UnsendableFrameError)


class AgentRequestError(Exception):
    """No answer from the agent to read: ``status`` for the asker, ``message`` safe to show."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class AnswerTooLarge(AgentRequestError):
    """The answer went past the bytes its asker allowed (502): a list may ask again for less."""


@attrs.frozen
class Answer:
    status: int
    #: the answer as JSON when it was a JSON object, else empty
    body: Mapping[str, Any]
    #: the answer's bytes as sent (YAML, text); not compared, not shown in reprs
    raw: bytes = attrs.field(default=b"", repr=False, eq=False)
    content_type: str = ""

    @property
    def message(self) -> str:
        return str(self.body.get("message") or f"HTTP {self.status}")


@attrs.define(eq=False)
class StreamedAnswer:
    """An answer whose body is read as it comes (``chunks``), within ``open``'s block."""

    status: int
    headers: Headers
    agent_id: int
    _stream: MuxStream

    @property
    def content_type(self) -> str:
        return next((v for n, v in self.headers if n == "content-type"), "")

    async def chunks(self, max_bytes: int = 65536) -> AsyncIterator[bytes]:
        """The body's chunks until its end; ``AgentRequestError`` 502 when the tunnel breaks."""
        while True:
            try:
                chunk = await self._stream.receive_some(max_bytes)
            except TUNNEL_FAILURES as exc:
                raise AgentRequestError(502, f"tunnel to agent {self.agent_id} failed: {exc}") from None
            if not chunk:
                return
            yield chunk


class AgentApi:
    """Requests to agents' Kubernetes APIs through ``router``; ``user_agent`` names who asks."""

    def __init__(self, router: Router, *, user_agent: str = "kasd") -> None:
        self.router = router
        self.user_agent = user_agent

    @asynccontextmanager
    async def open(self, agent_id: int, method: str, target: str, body: Mapping[str, Any] | None = None, *,
                   impersonate: Impersonation | None = None, accept: str = "application/json",
                   content_type: str = "application/json") -> AsyncIterator[StreamedAnswer]:
        """The agent's answer, its body to read in the block; the stream is closed when the block
        ends (reset if unread, so the agent stops a watch or a followed log at once)."""
        payload = json.dumps(body).encode() if body is not None else b""
        headers: list[tuple[str, str]] = [("accept", accept), ("user-agent", self.user_agent)]
        if body is not None:
            headers += [("content-type", content_type), ("content-length", str(len(payload)))]
        head = RequestHead(method=method, target=target, headers=tuple(headers), impersonate=impersonate,
                           request_id=current_request_id() or new_request_id())  # the request's it serves
        try:
            stream = await open_stream(self.router, agent_id, head.to_metadata())
        except AgentStreamError as exc:
            raise AgentRequestError(exc.status, exc.message) from None
        except TUNNEL_FAILURES as exc:
            raise AgentRequestError(502, f"tunnel to agent {agent_id} failed: {exc}") from None
        finished = False
        try:
            try:
                if payload:
                    await stream.send_all(payload)
                await stream.send_eof()
                answer = await response_head(self.router, stream, agent_id)
            except AgentStreamError as exc:
                raise AgentRequestError(exc.status, exc.message) from None
            except TUNNEL_FAILURES as exc:
                raise AgentRequestError(502, f"tunnel to agent {agent_id} failed: {exc}") from None
            yield StreamedAnswer(answer.status, answer.headers, agent_id, stream)
            finished = True
        finally:
            with trio.move_on_after(5, shield=True):
                if finished:
                    await stream.aclose()
                else:
                    await stream.reset(TunnelCode.CLIENT_GONE, "client went away")

    async def request(self, agent_id: int, method: str, target: str, body: Mapping[str, Any] | None = None, *,
                      impersonate: Impersonation | None = None, accept: str = "application/json",
                      content_type: str = "application/json", max_bytes: int = MAX_ANSWER) -> Answer:
        """The agent's whole answer (any status); ``AgentRequestError`` if there was none to read,
        or it was over ``max_bytes``."""
        async with self.open(agent_id, method, target, body, impersonate=impersonate, accept=accept,
                             content_type=content_type) as answer:
            data = bytearray()
            async for chunk in answer.chunks():
                data += chunk
                if len(data) > max_bytes:
                    raise AnswerTooLarge(502, f"agent {agent_id} answered {method} {target.partition('?')[0]} "
                                                 f"with more than {max_bytes} bytes")
        parsed: Any = {}
        if data:
            try:
                parsed = json.loads(bytes(data))
            except (ValueError, RecursionError):  # (an object nested deeper than Python's stack: the
                parsed = {}                        # cluster's answer, a tenant's custom resource)
        return Answer(status=answer.status, body=parsed if isinstance(parsed, dict) else {}, raw=bytes(data),
                      content_type=answer.content_type)


__all__ = ["MAX_ANSWER", "AgentApi", "AgentRequestError", "Answer", "AnswerTooLarge", "StreamedAnswer"]
