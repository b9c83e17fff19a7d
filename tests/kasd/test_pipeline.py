"""The request pipeline alone: fake Authority, fake Router, a fake front end's Exchange; the agent's
side is a real wire session over memory streams. No socket, no listener, no front end."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import pytest
import trio
import trio.testing

from daemonkit.logs import request_context
from kasd.agentclient import AgentApi
from kasd.authz.templates import ManagedResources
from kasd.k8sproxy.exchange import ClientGone, ClientRequest, Headers
from kasd.k8sproxy.pipeline import RequestPipeline
from kasd.k8sproxy.status import ProxyError
from kasd.metrics import Metrics
from kasd.seams import (
    AccessDenied,
    AgentNotConnected,
    Credentials,
    Grant,
    NoOtherSession,
    PeerUnreachable,
    Provisioner,
    ProvisionError,
    RouteError,
    Router,
    StopReport,
)
from routing.local import AgentTunnel, LocalRouter, TunnelRegistry
from tunnelhttp.head import Impersonation, RequestHead, ResponseHead, TunnelCode
from wire.errors import ErrorCode
from wire.frames import Metadata
from wire.session import MuxStream, Session, StreamRefusedError, connect_session
from wire.settings import Limits

IMPERSONATE = Impersonation(user="gitlab:ci_job:7", groups=("gitlab:ci_job",))


class FakeAuthority:
    """Grants ``ci`` tokens whose secret is ``good`` for agent 1; what it was asked, in order."""

    def __init__(self) -> None:
        self.asked: list[tuple[Credentials, int]] = []

    async def authorize(self, credentials: Credentials, agent_id: int) -> Grant:
        self.asked.append((credentials, agent_id))
        if credentials.secret != "good":
            raise AccessDenied(401, "bad token: unknown or invalid ci token")
        if agent_id != 1:
            raise AccessDenied(403, f"this ci token is not allowed to use agent {agent_id}")
        if credentials.secret == "good" and credentials.kind == "pat":  # acts as the agent itself
            return Grant(kind="pat", agent_id=1, impersonate=None, subject="user:alice", access_as="agent")
        return Grant(kind="ci", agent_id=1, impersonate=IMPERSONATE, subject="job 7", access_as="impersonate")


@attrs.define
class FakeRouter:
    """Opens streams on ``session``, or fails with ``failure``; notes what it was asked and told."""

    session: Session | None = None
    failure: RouteError | None = None
    opened: list[tuple[int, Metadata]] = attrs.field(factory=list)
    #: the ``avoid`` of each open_stream call
    avoided: list[frozenset[Session]] = attrs.field(factory=list)
    #: each report: the stream's session and the refusal's code (None: taken)
    reports: list[tuple[Session, int | None]] = attrs.field(factory=list)

    async def open_stream(self, agent_id: int, metadata: Metadata, *,
                          avoid: frozenset[Session] = frozenset()) -> MuxStream:
        self.opened.append((agent_id, metadata))
        self.avoided.append(avoid)
        if self.failure is not None:
            raise self.failure
        assert self.session is not None
        if self.session in avoid:
            raise NoOtherSession(agent_id)
        return await self.session.open_stream(metadata)

    def report(self, stream: MuxStream, refusal: StreamRefusedError | None) -> None:
        self.reports.append((stream.session, None if refusal is None else refusal.code))


@attrs.define(eq=False)
class FakeExchange:
    """A front end that records what the pipeline answered."""

    request: ClientRequest
    nursery: trio.Nursery
    body: list[bytes] = attrs.field(factory=list)
    watches_client: bool = False
    status: int | None = None
    headers: list[tuple[str, str]] = attrs.field(factory=list)
    sent: bytearray = attrs.field(factory=bytearray)
    ended: bool = False
    aborted: bool = False
    gone: bool = False
    #: the client leaves when the first body byte arrives
    leave_on_send: bool = False
    left: trio.Event = attrs.field(factory=trio.Event)

    @property
    def client_gone(self) -> bool:
        return self.gone

    def take_empty_body(self) -> bool:
        return not self.body

    async def receive_body(self) -> bytes:
        await trio.lowlevel.checkpoint()
        return self.body.pop(0) if self.body else b""

    async def watch_client(self) -> None:
        await self.left.wait()
        self.gone = True
        raise ClientGone("client left")

    async def respond(self, status: int, headers: Headers, body: bytes, *, end: bool) -> None:
        self.status, self.headers = status, list(headers)
        await self.send(body)
        self.ended = end

    async def send_error(self, status: int, headers: Headers, body: bytes) -> None:
        await self.respond(status, headers, body, end=True)

    async def send(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        if self.gone:
            raise ClientGone("client left")
        self.sent += data
        if data and self.leave_on_send:
            self.left.set()

    async def end(self) -> None:
        self.ended = True

    def abort(self) -> None:
        self.aborted = True

    async def upgrade(self, headers: Headers) -> tuple[trio.abc.Stream, bytes]:
        raise AssertionError("no upgrade in these tests")

    def json(self) -> dict[str, object]:
        result: dict[str, object] = json.loads(bytes(self.sent))
        return result


def request(token: str | None = "ci:1:good", target: str = "/api/v1/pods", *, has_body: bool = False,
            headers: tuple[tuple[str, str], ...] = ()) -> ClientRequest:
    auth = (("authorization", f"Bearer {token}"),) if token is not None else ()
    return ClientRequest(method="POST" if has_body else "GET", target=target, headers=(*auth, *headers),
                         protocol="HTTP/1.1", peer="test", has_body=has_body)


@asynccontextmanager
async def agent_session(kasd_limits: Limits | None = None) -> AsyncIterator[tuple[Session, Session]]:
    """kasd's session (opens streams) and the agent's (accepts them), over memory streams."""
    left, right = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        kasd_side, agent_side = await _pair(nursery, left, right, kasd_limits)
        yield kasd_side, agent_side
        nursery.cancel_scope.cancel()


async def _pair(nursery: trio.Nursery, left: trio.abc.Stream, right: trio.abc.Stream,
                kasd_limits: Limits | None = None) -> tuple[Session, Session]:
    sessions: dict[str, Session] = {}

    async def connect(name: str, transport: trio.abc.Stream, client: bool, limits: Limits | None) -> None:
        sessions[name] = await connect_session(nursery, transport, client=client, limits=limits)

    async with trio.open_nursery() as both:
        both.start_soon(connect, "kasd", left, False, kasd_limits)
        both.start_soon(connect, "agent", right, True, None)
    return sessions["kasd"], sessions["agent"]


def pipeline(router: Router, authority: FakeAuthority | None = None) -> RequestPipeline:
    return RequestPipeline(authority or FakeAuthority(), router, Metrics(TunnelRegistry()))


@pytest.mark.parametrize(
    ("token", "status", "message"),
    [
        (None, 401, "missing bearer token"),
        ("ci:1:bad", 401, "bad token: unknown or invalid ci token"),
        ("ci:2:good", 403, "this ci token is not allowed to use agent 2"),
        ("nonsense", 401, "bad token: malformed"),
    ],
)
async def test_a_request_the_authority_refuses_never_reaches_the_router(
        token: str | None, status: int, message: str) -> None:
    router = FakeRouter()
    async with trio.open_nursery() as nursery:
        ex = FakeExchange(request(token), nursery)
        await pipeline(router).serve(ex)
    assert router.opened == []
    assert ex.status == status and ex.ended
    assert message in str(ex.json()["message"])
    assert ("www-authenticate", 'Bearer realm="kasd"') in ex.headers if status == 401 else True


@pytest.mark.parametrize(
    ("failure", "status", "message"),
    [
        (AgentNotConnected(1, 0.5), 503, "agent 1 is not connected (waited 0.5s)"),
        (PeerUnreachable(1, "10.0.0.2:8155", "connection refused"), 502,
         "agent 1 is connected to kasd 10.0.0.2:8155, which is unreachable: connection refused"),
    ],
)
async def test_a_router_failure_is_the_status_the_client_sees(failure: RouteError, status: int, message: str) -> None:
    authority = FakeAuthority()
    router = FakeRouter(failure=failure)
    async with trio.open_nursery() as nursery:
        ex = FakeExchange(request(), nursery)
        await pipeline(router, authority).serve(ex)
    assert [(c.kind, c.agent_id, agent) for c, agent in authority.asked] == [("ci", 1, 1)]
    assert ex.status == status and ex.json()["message"] == message


async def test_a_front_end_refusal_is_answered_without_asking_the_seams() -> None:
    authority, router = FakeAuthority(), FakeRouter()
    async with trio.open_nursery() as nursery:
        ex = FakeExchange(request(), nursery)
        await pipeline(router, authority).serve(ex, refusal=ProxyError(400, "CONNECT is not supported"))
    assert authority.asked == [] and router.opened == []
    assert ex.status == 400 and ex.json()["message"] == "CONNECT is not supported"


async def test_a_granted_request_reaches_the_agent_cleaned_and_impersonated() -> None:
    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:

        async def agent() -> None:
            stream = await agent_side.accept_stream()
            head = RequestHead.from_metadata(stream.metadata)
            body = b""
            while chunk := await stream.receive_some():
                body += chunk
            seen = json.dumps({"target": head.target, "headers": head.headers, "user": head.impersonate and
                               head.impersonate.user, "body": body.decode(), "request_id": head.request_id}).encode()
            await stream.accept(ResponseHead(status=201, headers=(("content-type", "application/json"),)).to_metadata())
            await stream.send_all(seen)
            await stream.send_eof()

        nursery.start_soon(agent)
        ex = FakeExchange(request(has_body=True, headers=(("cookie", "c=1"), ("x-remote-user", "root"),
                                                          ("accept", "application/json"))), nursery,
                          body=[b"hello ", b"agent"])
        await pipeline(FakeRouter(kasd_side)).serve(ex)
    assert ex.status == 201 and ex.ended and not ex.aborted
    seen = ex.json()
    assert seen["target"] == "/api/v1/pods" and seen["body"] == "hello agent"
    assert seen["headers"] == [["accept", "application/json"]]  # no token, cookie or front-proxy identity
    assert seen["request_id"] == dict(ex.headers)["x-request-id"]  # the id the answer names
    assert seen["user"] == "gitlab:ci_job:7"
    assert ("content-type", "application/json") in ex.headers


@pytest.mark.parametrize("sent", ["build-7.retry_2", "x" * 65, "a b", 'q" outcome=ok'])
async def test_the_request_id_is_the_clients_when_safe_else_a_new_one(sent: str, caplog: pytest.LogCaptureFixture) -> None:
    """One id for the request: in the answer's X-Request-Id, the access line and the head the agent
    gets; a client's own only when short and of a safe charset (its raw value is never sent on)."""
    caplog.set_level("INFO", logger="kasd.access")
    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:
        got: list[RequestHead] = []

        async def agent() -> None:
            stream = await agent_side.accept_stream()
            got.append(RequestHead.from_metadata(stream.metadata))
            await stream.accept(ResponseHead(status=200, headers=(("x-request-id", "the-api-servers"),)).to_metadata())
            await stream.send_eof()

        nursery.start_soon(agent)
        ex = FakeExchange(request(headers=(("x-request-id", sent),)), nursery)
        await pipeline(FakeRouter(kasd_side)).serve(ex)
    answered = [value for name, value in ex.headers if name == "x-request-id"]
    assert len(answered) == 1 and got[0].request_id == answered[0]
    assert ("x-request-id", sent) not in got[0].headers  # the id travels in the head, not as the client's header
    if sent == "build-7.retry_2":
        assert answered[0] == sent
    else:
        assert len(answered[0]) == 32 and int(answered[0], 16) >= 0 and sent not in caplog.text
    assert f"request request_id={answered[0]} method=GET" in caplog.text


async def test_what_kasd_asks_an_agent_for_a_request_carries_that_requests_id() -> None:
    """A request kasd makes to an agent while serving one (a managed namespace, a dashboard's
    objects) names the id of the request it serves, so agentd's lines about it can be found; one
    that serves none gets an id of its own."""
    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:
        ids: list[str] = []

        async def agent() -> None:
            for _ in range(2):
                stream = await agent_side.accept_stream()
                ids.append(RequestHead.from_metadata(stream.metadata).request_id)
                await stream.accept(ResponseHead(status=200, headers=()).to_metadata())
                await stream.send_eof()

        nursery.start_soon(agent)
        api = AgentApi(FakeRouter(kasd_side))
        with request_context("req-from-client"):
            await api.request(1, "GET", "/api/v1/namespaces/web")
        await api.request(1, "GET", "/api/v1/namespaces/web")
    assert ids[0] == "req-from-client" and len(ids[1]) == 32 and ids[1] != ids[0]


async def test_client_impersonation_is_400_where_the_grant_fixes_the_identity() -> None:
    """access_as other than agent: the identity is the grant's; a client's Impersonate-* header
    would be a way around it, so it is refused (never silently replaced), before any routing."""
    async with trio.open_nursery() as nursery:
        router = FakeRouter()
        ex = FakeExchange(request(headers=(("impersonate-user", "root"), ("impersonate-group", "system:masters"))),
                          nursery)
        await pipeline(router).serve(ex)
    assert ex.status == 400 and "Impersonate-* headers are not allowed" in ex.json()["message"]
    assert router.opened == []


async def test_client_impersonation_passes_where_the_agent_acts_as_itself() -> None:
    """access_as agent (kubectl --as): the client's Impersonate-* headers reach agentd as the
    stream's impersonation, so the agent's own RBAC decides them, as in GitLab."""
    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:
        heads: list[RequestHead] = []

        async def agent() -> None:
            stream = await agent_side.accept_stream()
            heads.append(RequestHead.from_metadata(stream.metadata))
            await stream.accept(ResponseHead(status=200, headers=(("content-length", "0"),)).to_metadata())
            await stream.send_eof()

        nursery.start_soon(agent)
        headers = (("impersonate-user", "jane"), ("impersonate-group", "dev"),
                   ("impersonate-extra-reason%2Fwhy", "audit"))
        ex = FakeExchange(request("pat:1:good", headers=headers), nursery)
        await pipeline(FakeRouter(kasd_side)).serve(ex)
    assert ex.status == 200
    (head,) = heads
    assert head.impersonate == Impersonation(user="jane", groups=("dev",), extra=(("reason/why", ("audit",)),))
    assert not any(name.startswith("impersonate-") for name, _ in head.headers)


async def test_impersonation_headers_kube_apiserver_would_refuse_are_400() -> None:
    async with trio.open_nursery() as nursery:
        router = FakeRouter()
        ex = FakeExchange(request("pat:1:good", headers=(("impersonate-group", "dev"),)), nursery)
        await pipeline(router).serve(ex)
    assert ex.status == 400 and "without impersonating exactly one user" in ex.json()["message"]
    assert router.opened == []


async def test_the_agent_refusing_is_a_status_naming_the_cause() -> None:
    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:

        async def agent() -> None:
            stream = await agent_side.accept_stream()
            await stream.refuse(TunnelCode.UPSTREAM_UNREACHABLE, "dial tcp 10.0.0.1:443: connection refused")

        nursery.start_soon(agent)
        ex = FakeExchange(request(), nursery)
        await pipeline(FakeRouter(kasd_side)).serve(ex)
    assert ex.status == 502
    assert ex.json()["message"] == "cluster API unreachable from agent 1: dial tcp 10.0.0.1:443: connection refused"


async def test_a_client_that_leaves_mid_answer_resets_the_agents_stream() -> None:
    reset = trio.Event()
    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:

        async def agent() -> None:
            stream = await agent_side.accept_stream()
            await stream.accept(ResponseHead(status=200, headers=()).to_metadata())
            await stream.send_all(b"first event\n")
            # A watch: the answer stays open until kasd says the client is gone.
            broken = await stream.wait_broken()
            assert getattr(broken, "code", None) == TunnelCode.CLIENT_GONE
            reset.set()

        nursery.start_soon(agent)
        ex = FakeExchange(request(target="/api/v1/pods?watch=true"), nursery, watches_client=True,
                          leave_on_send=True)
        with trio.fail_after(5):
            await pipeline(FakeRouter(kasd_side)).serve(ex)
            await reset.wait()
    assert ex.status == 200 and not ex.ended
    assert bytes(ex.sent) == b"first event\n"


async def serve_refused_by_a_draining_agent(metrics: Metrics | None = None) -> tuple[FakeExchange, FakeRouter]:
    """One bodiless request: the first session's agent refuses it (a GOAWAY crossed it), the other
    session's agent answers ``200 ok``. (tests/kasd/test_metrics_usage.py counts the same request.)"""
    async with agent_session() as (first, first_agent), agent_session() as (second, second_agent), \
            trio.open_nursery() as nursery:
        router = FakeRouter(first)

        async def draining_agent() -> None:
            stream = await first_agent.accept_stream()
            router.session = second  # the next open goes to the other session
            await stream.refuse()  # REFUSED_STREAM: a GOAWAY crossed the request

        async def healthy_agent() -> None:
            stream = await second_agent.accept_stream()
            await stream.accept(ResponseHead(status=200, headers=(("content-length", "2"),)).to_metadata())
            await stream.send_all(b"ok")
            await stream.send_eof()

        nursery.start_soon(draining_agent)
        nursery.start_soon(healthy_agent)
        ex = FakeExchange(request(), nursery)
        await RequestPipeline(FakeAuthority(), router, metrics or Metrics(TunnelRegistry())).serve(ex)
    return ex, router


async def test_a_bodiless_request_the_draining_agent_refused_goes_to_another_session() -> None:
    ex, router = await serve_refused_by_a_draining_agent()
    assert [agent for agent, _ in router.opened] == [1, 1]
    assert ex.status == 200 and bytes(ex.sent) == b"ok" and ex.ended


async def test_a_client_that_leaves_after_the_whole_answer_is_not_client_gone(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="kasd.access")
    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:

        async def agent() -> None:
            stream = await agent_side.accept_stream()
            while await stream.receive_some():
                pass
            await stream.accept(ResponseHead(status=200, headers=()).to_metadata())
            await stream.send_all(b"the whole answer")
            await trio.testing.wait_all_tasks_blocked()  # the head went out alone
            await stream.send_eof()

        class LeavesAtTheEnd(FakeExchange):
            async def end(self) -> None:
                await super().end()
                self.left.set()  # the client reads the last byte and closes at once
                await trio.testing.wait_all_tasks_blocked()

        nursery.start_soon(agent)
        ex = LeavesAtTheEnd(request(has_body=True), nursery, body=[b"x"], watches_client=True)
        await pipeline(FakeRouter(kasd_side)).serve(ex)
    assert ex.ended and ex.gone  # the client did leave, after the answer
    assert "outcome=ok" in caplog.text and "client-gone" not in caplog.text


async def test_a_get_whose_session_dies_as_it_opens_goes_to_another_session() -> None:
    async with agent_session() as (first, _), agent_session() as (second, second_agent), \
            trio.open_nursery() as nursery:

        @attrs.define
        class DyingRouter(FakeRouter):
            async def open_stream(self, agent_id: int, metadata: Metadata, *,
                                  avoid: frozenset[Session] = frozenset()) -> MuxStream:
                stream = await super().open_stream(agent_id, metadata, avoid=avoid)
                if self.session is first:
                    await first.aclose()  # the agent's session ends between the OPEN and the FIN
                    self.session = second
                return stream

        async def healthy_agent() -> None:
            stream = await second_agent.accept_stream()
            await stream.accept(ResponseHead(status=200, headers=(("content-length", "2"),)).to_metadata())
            await stream.send_all(b"ok")
            await stream.send_eof()

        nursery.start_soon(healthy_agent)
        router = DyingRouter(first)
        ex = FakeExchange(request(), nursery)
        await pipeline(router).serve(ex)
    assert len(router.opened) == 2
    assert ex.status == 200 and bytes(ex.sent) == b"ok"


async def test_a_target_that_is_not_a_path_is_400_and_logged_without_an_agent(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="kasd.access")
    router = FakeRouter()
    async with trio.open_nursery() as nursery:
        ex = FakeExchange(request(target="http://127.0.0.1/version"), nursery)
        await pipeline(router).serve(ex)
    assert router.opened == []
    assert ex.status == 400
    assert ex.json()["message"] == "request target must be a path, got 'http://127.0.0.1/version'"
    assert "agent=- subject=-" in caplog.text  # as before the redesign: it went to no agent


# --------------------------------------------------------------------------- limits and steering


@pytest.mark.parametrize(
    ("target", "headers", "status", "message"),
    [
        ("/api/" + "p" * 17000, (), 414,
         "request target is 17005 bytes, over the tunnel's limit of 16384 bytes for a path and query"),
        ("/api", (("x-big", "b" * 17000),), 431,
         "request header 'x-big' is 17000 bytes, over the tunnel's limit of 16384 bytes for a header"),
        ("/api", tuple((f"x-h{i}", "v") for i in range(257)), 431,
         "request has 257 headers to forward, over the tunnel's limit of 256 headers"),
        ("/api", tuple((f"x-h{i}", "v" * 16000) for i in range(5)), 431,
         "request head does not fit the tunnel: OPEN frame over the limits: control frame of"),
    ],
)
async def test_a_head_over_the_tunnels_limits_is_answered_without_asking_the_router(
        target: str, headers: tuple[tuple[str, str], ...], status: int, message: str) -> None:
    router = FakeRouter()
    async with trio.open_nursery() as nursery:
        ex = FakeExchange(request(target=target, headers=headers), nursery)
        await pipeline(router).serve(ex)
    assert router.opened == []
    assert ex.status == status and str(ex.json()["message"]).startswith(message)


async def test_metadata_the_session_cannot_send_is_answered_not_retried() -> None:
    # A session stricter than the head's own check (here: 1 KiB strings) refuses the OPEN with the
    # same error type: a verdict on the request, so the real router neither waits nor tries again.
    async with agent_session(Limits(max_string=1024)) as (kasd_side, _), trio.open_nursery() as nursery:
        registry = TunnelRegistry()
        registry.register(AgentTunnel(agent_id=1, session=kasd_side))
        ex = FakeExchange(request(target="/api/" + "p" * 2000), nursery)
        with trio.fail_after(2):  # the agent wait is 5 s: no waiting, no loop
            await pipeline(LocalRouter(registry, agent_wait_timeout=5)).serve(ex)
    assert ex.status == 431
    assert ex.json()["message"] == "request head does not fit the tunnel: OPEN frame over the limits: string exceeds 1024 bytes"
    assert kasd_side.active_streams == 0


async def test_a_get_refused_as_unreachable_goes_to_a_session_it_has_not_tried() -> None:
    async with agent_session() as (first, first_agent), agent_session() as (second, second_agent), \
            trio.open_nursery() as nursery:
        router = FakeRouter(first)

        async def unreachable_agent() -> None:
            stream = await first_agent.accept_stream()
            router.session = second
            await stream.refuse(TunnelCode.UPSTREAM_UNREACHABLE, "connect: connection refused")

        async def healthy_agent() -> None:
            stream = await second_agent.accept_stream()
            await stream.accept(ResponseHead(status=200, headers=(("content-length", "2"),)).to_metadata())
            await stream.send_all(b"ok")
            await stream.send_eof()

        nursery.start_soon(unreachable_agent)
        nursery.start_soon(healthy_agent)
        ex = FakeExchange(request(), nursery)
        await pipeline(router).serve(ex)
    assert ex.status == 200 and bytes(ex.sent) == b"ok"
    assert router.avoided == [frozenset(), frozenset({first})]
    assert router.reports == [(first, TunnelCode.UPSTREAM_UNREACHABLE), (second, None)]


async def test_unreachable_with_no_other_session_is_the_agents_502_at_once() -> None:
    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:
        router = FakeRouter(kasd_side)

        async def unreachable_agent() -> None:
            stream = await agent_side.accept_stream()
            await stream.refuse(TunnelCode.UPSTREAM_UNREACHABLE, "dial tcp 10.0.0.1:443: connect: connection refused")

        nursery.start_soon(unreachable_agent)
        ex = FakeExchange(request(), nursery)
        await pipeline(router).serve(ex)
    assert ex.status == 502
    assert ex.json()["message"] == "cluster API unreachable from agent 1: dial tcp 10.0.0.1:443: connect: connection refused"
    assert router.avoided == [frozenset(), frozenset({kasd_side})]  # asked for another; there was none


class BrokenAuthority(FakeAuthority):
    """An authority with a bug: every request raises what nobody expected, quoting the token."""

    async def authorize(self, credentials: Credentials, agent_id: int) -> Grant:
        raise RuntimeError(f"bug while looking at {credentials.secret}")


async def test_an_unexpected_exception_is_a_500_and_one_error_line_for_many_requests(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics(TunnelRegistry())
    proxy = RequestPipeline(BrokenAuthority(), FakeRouter(), metrics)
    async with trio.open_nursery() as nursery:  # the connection's: it must outlive every failure
        for _ in range(50):
            ex = FakeExchange(request("ci:1:secret-token-value"), nursery)
            await proxy.serve(ex)
            assert ex.status == 500 and ex.ended
            body = ex.json()
            assert body["kind"] == "Status" and body["reason"] == "InternalError" and body["code"] == 500
            assert ("x-request-id", body["message"].rsplit(" ", 1)[-1].rstrip(")")) in ex.headers
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and not errors[0].exc_info
    line = errors[0].getMessage()
    assert "error=RuntimeError" in line and "authorize" in line  # what and where, in one line
    assert "secret-token-value" not in caplog.text
    assert metrics.internal_errors.labels(port="kubernetes_api")._value.get() == 50
    assert metrics.internal_error_lines_suppressed.labels(port="kubernetes_api")._value.get() == 49


async def test_a_body_reader_that_fails_unexpectedly_ends_its_request_alone() -> None:
    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:
        reset = trio.Event()

        async def agent() -> None:
            stream = await agent_side.accept_stream()
            broken = await stream.wait_broken()
            assert getattr(broken, "code", None) == ErrorCode.INTERNAL_ERROR
            reset.set()

        class FailingBody(FakeExchange):
            async def receive_body(self) -> bytes:
                await trio.lowlevel.checkpoint()
                raise RuntimeError("bug in the front end")

        nursery.start_soon(agent)
        ex = FailingBody(request(has_body=True), nursery, body=[b"x"])
        with trio.fail_after(5):
            await pipeline(FakeRouter(kasd_side)).serve(ex)
            await reset.wait()
    assert ex.status == 500 and ex.ended  # the connection's nursery did not end with it


async def test_a_failure_while_the_body_is_read_stops_the_reader_before_serve_returns() -> None:
    # Whoever answers the client next (the 500, the front end) must be alone in reading it.
    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:
        reading = trio.Event()

        async def agent() -> None:
            stream = await agent_side.accept_stream()
            await stream.accept(ResponseHead(status=200, headers=()).to_metadata())
            await stream.send_all(b"early answer")

        class SlowBody(FakeExchange):
            reader_busy = False

            async def receive_body(self) -> bytes:
                self.reader_busy = True
                reading.set()
                try:
                    await trio.sleep_forever()
                finally:
                    self.reader_busy = False
                raise AssertionError("unreachable")

            async def respond(self, status: int, headers: Headers, body: bytes, *, end: bool) -> None:
                await reading.wait()
                raise RuntimeError("bug in the front end")

        nursery.start_soon(agent)
        ex = SlowBody(request(has_body=True), nursery, body=[b"x"])
        with trio.fail_after(5):
            await pipeline(FakeRouter(kasd_side)).serve(ex)
        assert ex.aborted and not ex.reader_busy


# ------------------------------------------------------------------ the managed branch (a fake Provisioner)

PLAN = ManagedResources(agent_id=1, project_id=42, environment="review/x", slug="review-x", source="rules",
                        namespace="app-42", objects=({"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": "app-42"}},))


class ManagedAuthority(FakeAuthority):
    """As ``FakeAuthority``, and each grant asks for ``PLAN`` to exist first."""

    async def authorize(self, credentials: Credentials, agent_id: int) -> Grant:
        return attrs.evolve(await super().authorize(credentials, agent_id), managed=PLAN)


@attrs.define
class FakeProvisioner:
    """Each ``ensure`` waits for ``ready`` (if given), then fails with ``failure`` or succeeds."""

    ready: trio.Event | None = None
    failure: ProvisionError | None = None
    #: (plan, request id) of each ensure, as it began
    asked: list[tuple[ManagedResources, str]] = attrs.field(factory=list)
    waiting: trio.Event = attrs.field(factory=trio.Event)

    async def ensure(self, plan: ManagedResources, *, request_id: str = "") -> None:
        self.asked.append((plan, request_id))
        self.waiting.set()
        if self.ready is not None:
            await self.ready.wait()
        if self.failure is not None:
            raise self.failure

    async def stop(self, plan: ManagedResources) -> StopReport:
        raise AssertionError("the pipeline never stops an environment")


def managed_pipeline(router: Router, provisioner: Provisioner) -> RequestPipeline:
    return RequestPipeline(ManagedAuthority(), router, Metrics(TunnelRegistry()), provisioner=provisioner)


async def test_a_first_request_waits_for_its_environment_before_it_is_routed() -> None:
    provisioner = FakeProvisioner(ready=trio.Event())
    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:

        async def agent() -> None:
            stream = await agent_side.accept_stream()
            await stream.accept(ResponseHead(status=200, headers=()).to_metadata())
            await stream.send_all(b"{}")
            await stream.send_eof()

        nursery.start_soon(agent)
        router = FakeRouter(kasd_side)
        ex = FakeExchange(request(), nursery)
        with trio.fail_after(5):
            async with trio.open_nursery() as serving:
                serving.start_soon(managed_pipeline(router, provisioner).serve, ex)
                await provisioner.waiting.wait()
                await trio.testing.wait_all_tasks_blocked()
                assert router.opened == [] and ex.status is None  # held until the environment exists
                assert provisioner.ready is not None
                provisioner.ready.set()
    assert ex.status == 200 and ex.ended
    assert [plan for plan, _ in provisioner.asked] == [PLAN]
    # ensure is told the request's id: its audit lines name the request that caused them
    assert provisioner.asked[0][1] == dict(ex.headers)["x-request-id"]
    assert len(router.opened) == 1


async def test_an_environment_that_cannot_be_made_is_the_jobs_answer_naming_the_object() -> None:
    message = ("cannot create RoleBinding app-42/gitlab-job-access-review-x for this job's environment (agent 1): "
               "it grants ClusterRole 'edti', which the cluster does not have")
    provisioner = FakeProvisioner(failure=ProvisionError(422, message))
    router = FakeRouter()
    async with trio.open_nursery() as nursery:
        ex = FakeExchange(request(), nursery)
        await managed_pipeline(router, provisioner).serve(ex)
    assert router.opened == []  # nothing reaches the agent for a job whose environment is not there
    assert ex.status == 422 and ex.ended
    assert ex.json()["message"] == message and ex.json()["reason"] == "Invalid"


async def test_a_grant_without_managed_resources_never_asks_the_provisioner() -> None:
    provisioner = FakeProvisioner(failure=ProvisionError(500, "never asked"))
    router = FakeRouter(failure=AgentNotConnected(1, 0.5))
    async with trio.open_nursery() as nursery:
        ex = FakeExchange(request(), nursery)
        await RequestPipeline(FakeAuthority(), router, Metrics(TunnelRegistry()), provisioner=provisioner).serve(ex)
    assert provisioner.asked == []
    assert ex.status == 503 and len(router.opened) == 1
