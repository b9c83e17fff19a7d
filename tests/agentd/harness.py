"""A tiny kasd for agentd's tests: accepts agentd's tunnels (wire's h2 carrier on 127.0.0.1) and lets
a test open HTTP streams on them, plus an agentd running in-process against kubesim."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from agentd.agent import RunningAgent, run_agent
from agentd.config import AgentdConfig
from agentd.kubeapi import KubeTarget
from agentd.proxy import UpstreamRequestRecord
from daemonkit.settings import HostPort
from tunnelhttp.head import Impersonation, RequestHead, ResponseHead
from wire.h2carrier import serve_h2_tunnels
from wire.session import MuxStream, Session

AGENT_TOKEN = "agent-token-xyz"
SIM_TOKEN = "sa-token-of-agentd"


class FakeKasd:
    def __init__(self) -> None:
        self.port = 0
        self.tokens: list[str] = []
        self.sessions: list[Session] = []
        #: "up <n>" / "closed <n>" in the order they happened
        self.events: list[str] = []
        self._changed = trio.Event()
        self.reject_status: int | None = None
        self.scheme = "http"
        #: how agentd is told to dial it: "h2" (http(s)://) or "ws" (ws(s)://); it serves both
        self.carrier = "h2"

    @property
    def url(self) -> str:
        scheme = self.scheme if self.carrier == "h2" else {"http": "ws", "https": "wss"}[self.scheme]
        return f"{scheme}://127.0.0.1:{self.port}/tunnel"

    async def authenticate(self, token: str, headers: dict[str, str]) -> Any:
        self.tokens.append(token)
        if self.reject_status is not None:
            from wire.carrier import TunnelRejectedError

            raise TunnelRejectedError(self.reject_status, "agent token revoked")
        return {"agent": 1} if token == AGENT_TOKEN else None

    async def handler(self, session: Session, principal: Any) -> None:
        index = len(self.sessions)
        self.sessions.append(session)
        self.events.append(f"up {index}")
        self._notify()
        try:
            await session.wait_closed()
        finally:
            self.events.append(f"closed {index}")
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, predicate: Any) -> None:
        while not predicate():
            await self._changed.wait()

    async def session(self, index: int = 0) -> Session:
        await self.wait_for(lambda: len(self.sessions) > index)
        return self.sessions[index]


async def start_fake_kasd(nursery: trio.Nursery, ssl_context: ssl.SSLContext | None = None) -> FakeKasd:
    kasd = FakeKasd()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    await nursery.start(
        lambda task_status: serve_h2_tunnels(kasd.handler, listeners, authenticate=kasd.authenticate,
                                             ssl_context=ssl_context, websocket=True, task_status=task_status)
    )
    kasd.port = listeners[0].socket.getsockname()[1]
    if ssl_context is not None:
        kasd.scheme = "https"
    return kasd


def head(method: str, target: str, *, headers: tuple[tuple[str, str], ...] = (), user: str = "alice",
         groups: tuple[str, ...] = ("devs",), kind: str = "k8s-api", request_id: str = "req-1") -> RequestHead:
    return RequestHead(method=method, target=target, headers=(("accept", "application/json"), *headers),
                       kind=kind, impersonate=Impersonation(user=user, groups=groups), request_id=request_id)


async def open_request(session: Session, request: RequestHead, body: bytes = b"", *,
                       eof: bool = True) -> tuple[MuxStream, ResponseHead]:
    stream = await session.open_stream(request.to_metadata())
    async with trio.open_nursery() as nursery:

        async def send() -> None:
            if body:
                await stream.send_all(body)
            if eof:
                await stream.send_eof()

        nursery.start_soon(send)
        try:
            meta = await stream.wait_accepted()
        except trio.BrokenResourceError as exc:  # refused: raise it plainly, not in a group
            failure: BaseException | None = exc
            nursery.cancel_scope.cancel()
        else:
            failure = None
    if failure is not None:
        raise failure
    return stream, ResponseHead.from_metadata(meta)


async def read_http_head(stream: trio.abc.ReceiveStream, buffer: bytes = b"") -> tuple[bytes, bytes] | None:
    """The next HTTP/1.1 head from a raw connection, after ``buffer`` (bytes already read from it):
    (the head without its blank line, the bytes after it), or None if the peer closed first."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer += data
    head, _, rest = buffer.partition(b"\r\n\r\n")
    return head, rest


async def read_all(stream: MuxStream) -> bytes:
    chunks = []
    while chunk := await stream.receive_some():
        chunks.append(chunk)
    return b"".join(chunks)


async def exchange(session: Session, request: RequestHead, body: bytes = b"") -> tuple[ResponseHead, bytes]:
    stream, response = await open_request(session, request, body)
    data = await read_all(stream)
    await stream.aclose()
    return response, data


def agent_config(tmp_path: Path, kas_url: str, **overrides: Any) -> AgentdConfig:
    token_file = tmp_path / "agent-token"
    token_file.write_text(AGENT_TOKEN + "\n")
    values: dict[str, Any] = {
        "kas_addresses": (kas_url,),
        "token_file": token_file,
        "kubeconfig": tmp_path / "kubeconfig",
        "connections": 1,
        "health": HostPort("127.0.0.1", 0),
        "agent_id": "7",
        "pod_name": "agentd-0",
        "pod_uid": "uid-0",
        "shutdown_grace": 2.0,
        # (no cluster discovery: these upstreams are fakes of one request each; tests/agentd/test_discovery.py
        # turns it on against kubesim)
        "discovery_interval": 0.0,
        # (nor readiness checks of the API server, for the same reason: tests/agentd/test_tunnels.py turns them on)
        "api_check_interval": 0.0,
    }
    values.update(overrides)
    return AgentdConfig(**values)


@attrs.define(eq=False)
class AgentUnderTest:
    agent: RunningAgent
    kasd: FakeKasd


@asynccontextmanager
async def running_agent(nursery: trio.Nursery, config: AgentdConfig, target: KubeTarget,
                        **kwargs: Any) -> AsyncIterator[RunningAgent]:
    agent: RunningAgent = await nursery.start(lambda task_status: run_agent(config, kube_target=target,
                                                                            task_status=task_status, **kwargs))
    try:
        yield agent
    finally:
        agent.stop()


class RequestLog:
    """What agentd's proxy recorded about each finished request, and an event for the first."""

    def __init__(self, agent: RunningAgent) -> None:
        self.records: list[UpstreamRequestRecord] = []
        self.first = trio.Event()
        agent.proxy.on_done = self._done

    def _done(self, record: UpstreamRequestRecord) -> None:
        self.records.append(record)
        self.first.set()

    def outcomes(self) -> list[tuple[int | None, str]]:
        return [(r.status, r.outcome) for r in self.records]


# ---- events (kind ``event``): what kasd's delivery loop sends, and the ACCEPT agentd answers

EVENT_POSTED_AT = 1795000000.25


def event_metadata(event_id: str, event_type: str = "push", seq: int = 1, **overrides: Any) -> dict[str, Any]:
    metadata = {"v": 1, "kind": "event", "id": event_id, "type": event_type, "seq": seq, "posted_at": EVENT_POSTED_AT,
                "request_id": f"req-{event_id}"}
    metadata.update(overrides)
    return {k: v for k, v in metadata.items() if v is not ...}


async def send_event(kasd: Session, metadata: dict[str, Any], payload: bytes = b'{"ref":"main"}') -> dict[str, Any]:
    """Open one event stream as kasd does; the ACCEPT's outcome (or StreamRefusedError)."""
    stream = await kasd.open_stream(metadata)
    try:
        if payload:
            await stream.send_all(payload)
        await stream.send_eof()
        answer = await stream.wait_accepted()
        assert await stream.receive_some() == b""
        return answer
    finally:
        await stream.aclose()
