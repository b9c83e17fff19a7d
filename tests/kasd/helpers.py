"""A kasd on 127.0.0.1 with port-0 listeners, a fake agentd, and tiny HTTP/1.1 clients."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import h11
import trio

from kasctl.authsetup import AuthSetup
from kasd.config import Config, config_from_mapping
from kasd.server import Runtime, serve_kasd
from kasd.tokens import hash_token
from tunnelhttp.head import RequestHead, ResponseHead, TunnelCode
from wire.h2carrier import open_h2_session
from wire.session import MuxStream, Session

AGENT1_TOKEN = "agent-one-token"
AGENT2_TOKEN = "agent-two-token"

CI_IMPERSONATION = {
    "user": "gitlab:ci_job:7",
    "groups": ["gitlab:ci_job", "gitlab:project:42"],
    "uid": "ci-7",
    "extra": {"agent.gitlab.com/job_id": ["7"]},
}

# The authorization files every in-process kasd of these tests reads: a signing key, and the agents'
# config.yaml (both agents let group/app's jobs in, impersonating CI_IMPERSONATION; agent 1 lets
# alice in as the agent itself with a personal token).
_AUTH_DIR = Path(tempfile.mkdtemp(prefix="kasd-tests-auth-"))
atexit.register(shutil.rmtree, _AUTH_DIR, True)
AUTH = AuthSetup(_AUTH_DIR)
_CI_ENTRY = f"""ci_access:
  projects:
    - id: group/app
      access_as:
        impersonate:
          username: {CI_IMPERSONATION["user"]}
          uid: {CI_IMPERSONATION["uid"]}
          groups: [{", ".join(CI_IMPERSONATION["groups"])}]
          extra: [{{key: agent.gitlab.com/job_id, val: ["7"]}}]
"""
AUTH.agent_config("group/infra", "prod", _CI_ENTRY + "user_access:\n  access_as: {agent: {}}\n  projects: [{id: group/app}]\n")
AUTH.agent_config("group/infra", "stage", _CI_ENTRY)
DIRECTORY = {
    "groups": [{"path": "group", "id": 10}],
    "projects": [{"path": "group/infra", "id": 1}, {"path": "group/app", "id": 42}],
    "users": [{"username": "alice", "memberships": {"group/app": "developer"}}],
}
#: the secret parts (after ``ci:<agent id>:`` / ``pat:<agent id>:``): signed tokens
CI_SECRET = AUTH.job_token("group/app", job_id=7, user="alice")
PAT_SECRET = AUTH.personal_token("alice")
CI_TOKEN = f"ci:1:{CI_SECRET}"
PAT_TOKEN = f"pat:1:{PAT_SECRET}"


def make_config(raw: dict[str, Any] | None = None, **listener_overrides: Any) -> Config:
    doc: dict[str, Any] = {
        "listeners": {
            "agent": {"address": "127.0.0.1:0"},
            "observability": {"address": "127.0.0.1:0"},
            "kubernetes_api": {"address": "127.0.0.1:0", **listener_overrides},
        },
        "agents": [
            {"id": 1, "name": "prod", "config_project": "group/infra", "token_sha256": hash_token(AGENT1_TOKEN)},
            {"id": 2, "name": "stage", "config_project": "group/infra", "token_sha256": hash_token(AGENT2_TOKEN)},
        ],
        **DIRECTORY,
        **AUTH.kasd_settings(),
        "agent_wait_timeout": 5,
        "shutdown_timeout": 5,
    }
    doc.update(raw or {})
    return config_from_mapping(doc)


@asynccontextmanager
async def running_kasd(config: Config | None = None) -> AsyncIterator[Runtime]:
    async with trio.open_nursery() as nursery:
        runtime: Runtime = await nursery.start(serve_kasd, config or make_config())
        try:
            yield runtime
        finally:
            runtime.request_shutdown()


async def wait_sessions(runtime: Runtime, agent_id: int, count: int) -> None:
    """Event-driven: return once kasd has exactly ``count`` live sessions for ``agent_id``."""
    while sum(1 for t in runtime.registry.tunnels(agent_id) if not t.session.closed) != count:
        await runtime.registry.wait_changed()


# --------------------------------------------------------------------------- a fake agentd

Handler = Callable[[MuxStream, RequestHead, Session], Awaitable[None]]


@attrs.define
class FakeAgent:
    session: Session
    heads: list[RequestHead] = attrs.field(factory=list)
    #: the OPEN metadata of each stream, as the agent got it
    metadata: list[dict[str, Any]] = attrs.field(factory=list)
    #: OPEN frames (streams) kasd sent this agent, counted as they arrive, before their head is read
    opens: int = 0


async def read_all(stream: MuxStream) -> bytes:
    chunks = []
    while chunk := await stream.receive_some():
        chunks.append(chunk)
    return b"".join(chunks)


async def accept(stream: MuxStream, head: ResponseHead) -> None:
    await stream.accept(head.to_metadata())


async def reply(stream: MuxStream, status: int, body: bytes, headers: Sequence[tuple[str, str]] = ()) -> None:
    head = ResponseHead(status=status, headers=(("content-length", str(len(body))), *headers))
    await stream.accept(head.to_metadata())
    if body:
        await stream.send_all(body)
    await stream.send_eof()


async def json_handler(stream: MuxStream, head: RequestHead, session: Session) -> None:
    """Answer with what arrived: the head (as the agent saw it) and the body's size."""
    body = await read_all(stream)
    seen = {"method": head.method, "target": head.target, "headers": head.headers, "body_bytes": len(body)}
    await reply(stream, 200, json.dumps(seen).encode(), [("content-type", "application/json")])


def first_chunk_then_reset(more: trio.Event) -> Handler:
    """A handler whose answer breaks mid-body: a 200, one chunk, then (once ``more`` is set, so the
    first chunk is already with the client) a second chunk and a reset of the stream."""

    async def handler(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await read_all(stream)
        await accept(stream, ResponseHead(status=200, headers=(("content-type", "application/json"),)))
        await stream.send_all(b'{"type": "ADDED"}\n')
        await more.wait()
        await stream.send_all(b'{"type": "MODIFIED"}\n')
        await stream.reset(TunnelCode.UPSTREAM_UNREACHABLE, "API server connection lost")

    return handler


@asynccontextmanager
async def fake_agent(
    runtime: Runtime,
    handler: Handler = json_handler,
    *,
    token: str = AGENT1_TOKEN,
    hello: dict[str, Any] | None = None,
    agent_id: int = 1,
    wait_registered: bool = True,
) -> AsyncIterator[FakeAgent]:
    before = sum(1 for t in runtime.registry.tunnels(agent_id) if not t.session.closed)
    metadata = {"agent_id": agent_id, "pod_name": "agentd-0", "pod_uid": "uid-0", "version": "test"}
    metadata.update(hello or {})
    async with open_h2_session(runtime.agent_url, token=token, metadata=metadata) as session:
        agent = FakeAgent(session=session)

        async def serve_one(stream: MuxStream) -> None:
            head = RequestHead.from_metadata(stream.metadata)
            agent.heads.append(head)
            agent.metadata.append(dict(stream.metadata))
            await handler(stream, head, session)

        async def serve() -> None:
            async with trio.open_nursery() as streams:
                while True:
                    try:
                        stream = await session.accept_stream()
                    except trio.BrokenResourceError:
                        return
                    agent.opens += 1
                    streams.start_soon(serve_one, stream)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            if wait_registered:
                await wait_sessions(runtime, agent_id, before + 1)
            yield agent
            nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- HTTP/1.1 client


async def read_until_closed(stream: trio.abc.Stream) -> bytes:
    """Everything the peer sends until it closes (or resets) the connection, within 5 s."""
    out = b""
    with trio.fail_after(5):
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                return out
            if not data:
                return out
            out += data


class H1Client:
    """A small h11 client over one connection, reading the response incrementally."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, port: int, *, source: str | None = None) -> H1Client:
        """A connection to kasd on 127.0.0.1, from ``source`` (another loopback address, e.g.
        ``127.0.0.2``, is another source to kasd's connection caps)."""
        return cls(await trio.open_tcp_stream("127.0.0.1", port, local_address=source))

    async def send(self, event: h11.Event) -> None:
        await self.stream.send_all(self.conn.send(event) or b"")

    async def request(self, method: str, target: str, headers: Sequence[tuple[str, str]] = (), body: bytes | None = b"") -> None:
        hdrs = [("host", "kasd.test"), *headers]
        framed = any(k.lower() in ("content-length", "transfer-encoding") for k, _ in hdrs)
        if body is not None and not framed and (body or method in ("POST", "PUT", "PATCH")):
            hdrs.append(("content-length", str(len(body))))
        await self.send(h11.Request(method=method, target=target, headers=hdrs))
        if body is not None:
            if body:
                await self.send(h11.Data(data=body))
            await self.send(h11.EndOfMessage())

    async def next_event(self) -> Any:
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
                continue
            return event

    async def response(self) -> h11.Response | h11.InformationalResponse:
        while True:
            event = await self.next_event()
            if isinstance(event, (h11.Response, h11.InformationalResponse)) and event.status_code != 100:
                return event

    async def chunk(self) -> bytes | None:
        """The next piece of the body, or None at its end."""
        event = await self.next_event()
        if isinstance(event, h11.Data):
            return bytes(event.data)
        assert isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)), event
        return None

    async def body(self) -> bytes:
        out = b""
        while (piece := await self.chunk()) is not None:
            out += piece
        return out

    async def aclose(self) -> None:
        await self.stream.aclose()


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def http_request(
    port: int, method: str, target: str, headers: Sequence[tuple[str, str]] = (), body: bytes = b"",
    *, source: str | None = None,
) -> Reply:
    client = await H1Client.connect(port, source=source)
    try:
        await client.request(method, target, headers, body)
        response = await client.response()
        data = await client.body()
        return Reply(
            status=response.status_code,
            headers={k.decode().lower(): v.decode() for k, v in response.headers},
            body=data,
        )
    finally:
        await client.aclose()


def bearer(token: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {token}")
