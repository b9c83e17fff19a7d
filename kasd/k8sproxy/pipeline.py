"""The one request pipeline of the Kubernetes API proxy: authenticate → authorize → route → relay →
record, written once for every protocol front end.

A front end hands ``RequestPipeline.serve`` an ``Exchange`` (``exchange``); the pipeline reads the
bearer token (``kasd.seams.parse_bearer``), asks the ``Authority`` for a grant, cleans the head, asks
the ``Router`` for a logical stream to the agent, streams the body there, relays the agent's answer
(or its ``101`` byte pipe) back, and writes one access-log line with the metrics; a CI job's use of
the agent, and each namespace it wrote into, is told to the ``Recorder`` (its environment's
deployment history). The seams are injected, so the pipeline runs in tests with fakes and memory
streams, no socket.

May import: ``kasd.seams``, ``kasd.agentstream`` (a request's stream to the agent, from open to
head), ``kasd.metrics``, this package's ``exchange``/``status``/``accesslog``/
``principals``/``requestinfo``, ``routing.retry`` (when a request goes to another session),
``tunnelhttp``, ``wire``, ``netio``, ``daemonkit.logs``. Never a front end (``http1``,
``http2``) or ``server``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable, Sequence
from contextlib import ExitStack
from functools import partial
from typing import Protocol

import attrs
import trio
from prometheus_client import Counter

from daemonkit.logs import BurstLimitedLog, logfmt, request_context
from kasd.agentstream import AgentStreamError, open_stream
from kasd.k8sproxy.accesslog import RequestRecord
from kasd.k8sproxy.exchange import CONNECTION_LOST, ClientGone, ClientRequest, Exchange
from kasd.k8sproxy.principals import PrincipalRequests
from kasd.k8sproxy.requestinfo import (
    NAMESPACE_CREATE_PATH,
    created_namespace,
    request_info,
    written_namespace,
)
from kasd.k8sproxy.status import ProxyError, status_body, status_headers
from kasd.metrics import Metrics
from kasd.seams import (
    AccessDenied,
    Authority,
    Grant,
    Provisioner,
    ProvisionError,
    Recorder,
    Router,
    parse_bearer,
)
from netio.relay import relay
from routing.retry import LOST, take_or_retry
from tunnelhttp.drain import Drain, answer_boundary
from tunnelhttp.head import (
    CLIENT_IMPERSONATION_REFUSED,
    HeadOverLimitError,
    Impersonation,
    ImpersonationHeaderError,
    RequestHead,
    ResponseHead,
    TunnelCode,
    impersonation_from_headers,
    strip_hop_by_hop,
)
from tunnelhttp.requestid import REQUEST_ID_HEADER, request_id_from
from tunnelhttp.watchbounds import EventBoundary
from wire.errors import ErrorCode, RemoteProtocolError
from wire.frames import Metadata
from wire.session import MuxStream, StreamRefusedError

log = logging.getLogger("kasd.k8sproxy")

#: request headers that never leave kasd, besides the hop-by-hop ones: the client's credentials, and
#: every way to claim another identity — Impersonate-*, and the front-proxy authentication headers
#: (kube-apiserver's --requestheader-* defaults), which a cluster set up to trust them would believe
_DROPPED = frozenset({"authorization", "cookie", "host", "expect", "x-remote-user", "x-remote-group"})
_DROPPED_PREFIXES = ("impersonate-", "x-remote-extra-")
#: requests one token may have open at once (``kubernetes_api.max_requests_per_principal``)
MAX_REQUESTS_PER_PRINCIPAL = 512
#: a bodiless request whose answer takes longer gets a task watching for the client to leave
_WATCH_AFTER = 1.0
#: per-chunk Python work dominates bulk transfers: fewer, larger chunks
_CHUNK = 256 * 1024
_MUX_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)
#: bytes of a Namespace create's body kept to read the new namespace's name (the recorder's)
_NAMESPACE_BODY = 16 * 1024


@attrs.frozen
class DroppedHeaders:
    """Request header names (lower-case) that never reach the agent, and prefixes of such names."""

    names: frozenset[str] = _DROPPED
    prefixes: tuple[str, ...] = _DROPPED_PREFIXES

    def also(self, configured: Sequence[str]) -> DroppedHeaders:
        """These and ``configured`` (``strip_request_headers``: names, or prefixes ending in ``*``)."""
        names = {name.lower() for name in configured if not name.endswith("*")}
        prefixes = tuple(name[:-1].lower() for name in configured if name.endswith("*"))
        return DroppedHeaders(self.names | names, self.prefixes + prefixes)


DROPPED = DroppedHeaders()


@attrs.frozen(kw_only=True)
class Planned:
    """What a ``RequestPlan`` made of a request: who may send it where, and the head agentd gets."""

    grant: Grant
    #: who holds the grant (the token, never logged): its requests are capped together
    principal: Hashable
    #: the OPEN's kind and service (``tunnelhttp.kinds``), and the target relative to it
    kind: str
    service: str | None
    target: str


class RequestPlan(Protocol):
    """A request that is not the Kubernetes API's (an in-cluster service on the REST API port,
    ``kasd.web.services``): it authenticates and authorizes in its own way and says where the
    request goes; the pipeline then routes, relays and records it as any other. Its answers are in
    its own shape (``error_body``: GitLab's ``{"message"}``), the agent's pass through as they come."""

    #: request headers that never reach the agent (the plan's credentials among them)
    dropped_headers: DroppedHeaders

    async def plan(self, request: ClientRequest) -> Planned:
        """Where the request goes; ``ProxyError`` (401/403/404/400…) if it goes nowhere."""
        ...

    def error_body(self, status: int, message: str) -> bytes:
        """The body of an answer kasd composes with ``status`` and ``message``."""
        ...

    def refusal(self, exc: StreamRefusedError, agent_id: int) -> ProxyError:
        """What the client is told when agentd refuses the stream."""
        ...

    def answer_headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The agent's answer's headers (hop-by-hop ones already gone) as the client gets them: a
        plan whose answers come from elsewhere than an API server (a service on kasd's own origin)
        removes what would act on that origin and adds what makes the answer inert there."""
        ...


def clean_request_headers(
    headers: Sequence[tuple[str, str]], *, upgrade: bool, dropped: DroppedHeaders = DROPPED
) -> tuple[tuple[str, str], ...]:
    """The client's headers (names lower-case) minus its credentials, cookies, identity claims
    (Impersonate-*, X-Remote-User/-Group/-Extra-*, and what ``dropped`` adds), hop-by-hop headers and
    its ``X-Request-Id`` (the request's id travels in the head; agentd sends it on)."""
    kept = strip_hop_by_hop(headers, keep_upgrade=upgrade)
    names, prefixes = dropped.names, dropped.prefixes
    # (compared with "_" read as "-": CGI, WSGI and Rack servers fold both to the same variable, so
    # "Private_Token" or "Impersonate_User" is "Private-Token" or "Impersonate-User" to them)
    return tuple([(k, v) for k, v in kept
                  if (n := k.replace("_", "-")) not in names and not n.startswith(prefixes) and n != REQUEST_ID_HEADER])


def clean_response_headers(headers: Sequence[tuple[str, str]], *, switching: bool = False) -> list[tuple[str, str]]:
    """The answer's headers minus hop-by-hop ones and its own ``X-Request-Id`` (kasd adds the request's)."""
    return [(k, v) for k, v in strip_hop_by_hop(headers, keep_upgrade=switching) if k != REQUEST_ID_HEADER]


@attrs.define(eq=False)
class _Reader:
    """The task reading from the client: the body, then watching for the client to leave."""

    #: the whole task (cancelled once the exchange is over)
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: its watch for the client leaving, after the body (cancelled before a 101's byte pipe)
    watch: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    done: trio.Event = attrs.field(factory=trio.Event)


@attrs.define(eq=False)
class _Transfer:
    """One routed request: what the response side and the client reader share."""

    ex: Exchange
    grant: Grant
    head: RequestHead
    #: ``head`` as OPEN metadata (a retry sends it again)
    metadata: Metadata
    #: the logical stream to the agent (another one if the first agent did not take the request)
    stream: MuxStream
    record: RequestRecord
    #: the request has no body: the stream's FIN left with its OPEN
    bodiless: bool
    #: cancelled when the client goes away mid-exchange
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    reader: _Reader | None = None
    #: the client went away (as the pipeline saw it; the exchange may know it too)
    gone: bool = False
    #: the last write of the answer is under way: the client leaving now must not cut it
    ending: bool = False
    #: what the reader task failed with, unexpectedly (the request then ends as the pipeline's own failure)
    failure: Exception | None = None
    #: the first bytes of the body, kept for the recorder (a Namespace create: its name), else None
    tap: bytearray | None = None
    #: a request of a plan (not the Kubernetes API's): its error shape and refusals
    plan: RequestPlan | None = None


class RequestPipeline:
    """Serves exchanges: ``await pipeline.serve(exchange)`` answers one request and records it."""

    def __init__(
        self, authority: Authority, router: Router, metrics: Metrics, *, drain: Drain | None = None,
        dropped_headers: DroppedHeaders = DROPPED, max_requests_per_principal: int = MAX_REQUESTS_PER_PRINCIPAL,
        provisioner: Provisioner | None = None, recorder: Recorder | None = None,
    ) -> None:
        self.authority = authority
        #: told of each CI job's use of an agent and of the namespaces it wrote into (never waited on)
        self.recorder = recorder
        self.router = router
        #: creates a grant's managed namespace before its first request goes on
        self.provisioner = provisioner
        self.metrics = metrics
        self.dropped_headers = dropped_headers
        #: requests each token has open (authorized, not yet over), capped
        self.principal_requests = PrincipalRequests(max_requests_per_principal)
        self._at_limit = BurstLimitedLog(log, interval=10.0)
        #: watches and followed logs end between two events once the drain begins
        self.drain = drain if drain is not None else Drain()
        #: a retry line per request the agent did not take: a burst when an agentd goes away
        self._retry_log = BurstLimitedLog(log, interval=10.0)
        #: exceptions nobody expected (a bug): each answers its own request 500, in a rate-limited line
        self.unexpected = metrics.unexpected_errors("kubernetes_api", log)

    async def serve(
        self,
        ex: Exchange,
        *,
        refusal: ProxyError | None = None,
        log_dropped: bool = True,
        done: Callable[[RequestRecord], object] | None = None,
        proven: Callable[[], object] | None = None,
        plan: RequestPlan | None = None,
    ) -> None:
        """Answer ``ex``; ``refusal`` is a front end's own verdict on the request (answered as is).
        ``plan``: a request that is not the Kubernetes API's (``RequestPlan``).
        ``done(record)`` is called as the request ends, even when cancelled: how it went
        (``record.agent_id`` is set once the request was authorized). ``proven()`` is called the
        moment it is, before it waits for an agent or a managed namespace: the front end's clock
        then treats the connection as proven, so a slow answer is not cut at the head deadline.
        ``log_dropped=False``: a request the client dropped before any answer (``record.dropped``)
        gets no access line; the front end sums those up."""
        request = ex.request
        info = request_info(request.method, request.target) if plan is None else request_info("", "")
        record = RequestRecord(
            request_id=request_id_from(request.headers),  # the client's, when safe
            method=request.method,
            path=request.target,
            protocol=request.protocol,
            peer=request.peer,
            verb=info.verb,
            namespace=info.namespace,
        )
        held = ExitStack()  # what the request holds until it is over (its principal's slot)
        held.enter_context(request_context(record.request_id))  # every line about it names it
        try:
            if plan is None:
                await self._serve(ex, record, refusal, held, proven)
            else:
                await self._serve_plan(ex, record, plan, held, proven)
        except CONNECTION_LOST:  # a connection broke under the front end, which ends it quietly
            raise
        except Exception as exc:  # a bug: it ends this request alone, answered if it still can be
            await self._fail(ex, record, exc, plan)
        finally:
            held.close()
            if ex.client_gone and not record.answered and record.outcome != "upstream-broken":
                record.outcome = "client-gone"
            if log_dropped or not record.dropped:
                record.write()
            self.metrics.count_request(record.status)
            self.metrics.count_proxied(record.status, record.token_kind, record.agent_id)
            self.metrics.request_duration.observe(trio.current_time() - record.started)
            if done is not None:
                done(record)

    async def _serve(self, ex: Exchange, record: RequestRecord, refusal: ProxyError | None, held: ExitStack,
                     proven: Callable[[], object] | None = None) -> None:
        request = ex.request
        try:
            if refusal is not None:
                raise refusal
            grant, principal = await self._authorize(request, record)
            if not request.target.startswith("/"):
                raise ProxyError(400, f"request target must be a path, got {request.target[:100]!r}")
            record.agent_id, record.subject = grant.agent_id, grant.subject  # a request that goes on
            record.access_as, record.token_kind = grant.access_as, grant.kind
            if proven is not None:
                proven()
            impersonate = self._impersonation(request, grant)
            if impersonate is not None:
                record.as_user, record.as_groups = impersonate.user, impersonate.groups
            self._hold_principal_slot(principal, grant, held)
            if grant.managed is not None and self.provisioner is not None:
                try:
                    await self.provisioner.ensure(grant.managed, request_id=record.request_id)
                except ProvisionError as exc:
                    raise ProxyError(exc.status, exc.message) from None
            if self.recorder is not None:
                self.recorder.used(grant)
            head = RequestHead(
                method=request.method,
                target=request.target,
                headers=clean_request_headers(request.headers, upgrade=request.upgrade, dropped=self.dropped_headers),
                impersonate=impersonate,
                request_id=record.request_id,
            )
            metadata, stream, bodiless = await self._open(grant.agent_id, head, request)
        except ProxyError as exc:
            try:
                await self._send_status(ex, exc, record)
            except ClientGone:
                record.outcome = "client-gone"
            return
        transfer = _Transfer(ex, grant, head, metadata, stream, record, bodiless)
        recording = self.recorder is not None and grant.job is not None and grant.job.environment is not None
        if recording and request.method == "POST" and request.target.split("?", 1)[0] == NAMESPACE_CREATE_PATH:
            transfer.tap = bytearray()
        try:
            await self._exchange(transfer)
        finally:
            # Also when the task is cancelled after the answer went out (kubectl exits the moment its
            # last write is answered, and the front end cancels while the tunnel stream closes): the
            # write happened. Synchronous and never raising, so safe in a finally.
            if recording and 200 <= record.status < 300:
                self._record_write(transfer)

    async def _serve_plan(self, ex: Exchange, record: RequestRecord, plan: RequestPlan, held: ExitStack,
                          proven: Callable[[], object] | None) -> None:
        """``_serve`` for a request of ``plan``: its authorization and head, then the same route and
        relay (no impersonation, no managed namespace, no deployment record: the Kubernetes API's)."""
        request = ex.request
        try:
            planned = await plan.plan(request)
            grant = planned.grant
            record.agent_id, record.subject, record.access_as = grant.agent_id, grant.subject, grant.access_as
            record.token_kind = grant.kind
            if proven is not None:
                proven()
            self._hold_principal_slot(planned.principal, grant, held)
            head = RequestHead(
                method=request.method,
                target=planned.target,
                headers=clean_request_headers(request.headers, upgrade=request.upgrade, dropped=plan.dropped_headers),
                kind=planned.kind,
                service=planned.service,
                request_id=record.request_id,
            )
            metadata, stream, bodiless = await self._open(grant.agent_id, head, request)
        except ProxyError as exc:
            try:
                await self._send_status(ex, exc, record, plan)
            except ClientGone:
                record.outcome = "client-gone"
            return
        await self._exchange(_Transfer(ex, grant, head, metadata, stream, record, bodiless, plan=plan))

    async def _open(self, agent_id: int, head: RequestHead, request: ClientRequest) -> tuple[Metadata, MuxStream, bool]:
        """``head``'s stream to the agent (ProxyError 414/431 when no session could carry it: answered,
        not routed), with its FIN sent at once when the request has no body (the OPEN and its FIN
        then leave in one write); and whether it had none."""
        try:
            metadata = head.to_metadata()
        except HeadOverLimitError as exc:
            raise ProxyError(exc.status, exc.message) from None
        stream = await self._route(agent_id, metadata)
        bodiless = not request.upgrade and not request.has_body
        if bodiless:
            try:
                await stream.send_eof()
            except _MUX_ERRORS:
                pass  # the session died: waiting for the answer says so (and may retry)
            except BaseException:  # cancelled (the client left): the stream must not linger
                with trio.CancelScope(shield=True):
                    await stream.reset(TunnelCode.CLIENT_GONE, "client went away")
                raise
        return metadata, stream, bodiless

    def _record_write(self, t: _Transfer) -> None:
        """Tell the recorder the namespace a successful write went into, if any."""
        assert self.recorder is not None
        request = t.ex.request
        namespace = written_namespace(request.method, request.target)
        if not namespace and t.tap is not None and "dryRun" not in request.target:
            namespace = created_namespace(bytes(t.tap))
        if namespace:
            self.recorder.wrote(t.grant, namespace)

    # ------------------------------------------------------------------ authenticate, authorize, route

    async def _authorize(self, request: ClientRequest, record: RequestRecord) -> tuple[Grant, Hashable]:
        """The grant for this request's token, and who holds it (the principal: the token, never
        logged); ProxyError 401/403 otherwise: the authority's ``AccessDenied`` told to the client in
        the one shape every answer the pipeline refuses with takes (a 401 with its challenge)."""
        auth = [v for k, v in request.headers if k == "authorization"]
        try:
            if len(auth) > 1:
                raise AccessDenied(401, "bad token: more than one Authorization header")
            credentials = parse_bearer(auth[0] if auth else None)
            grant = await self.authority.authorize(credentials, credentials.agent_id)
        except AccessDenied as exc:
            record.subject = exc.principal or ""
            extra = (("www-authenticate", 'Bearer realm="kasd"'),) if exc.status == 401 else ()
            raise ProxyError(exc.status, exc.message, extra) from None
        return grant, (credentials.kind, credentials.secret)

    @staticmethod
    def _impersonation(request: ClientRequest, grant: Grant) -> Impersonation | None:
        """Whom agentd impersonates: the grant's identity; or, where the agent acts as itself
        (``access_as: agent``), whom the client's own ``Impersonate-*`` headers name (the agent's
        RBAC then decides, as in GitLab). Those headers in any other mode: ProxyError 400."""
        try:
            asked = impersonation_from_headers(request.headers)
        except ImpersonationHeaderError as exc:
            raise ProxyError(400, f"bad Impersonate-* headers: {exc}") from None
        if asked is None:
            return grant.impersonate
        if not grant.client_may_impersonate:
            raise ProxyError(400, CLIENT_IMPERSONATION_REFUSED)
        return asked

    def _hold_principal_slot(self, principal: Hashable, grant: Grant, held: ExitStack) -> None:
        """One of the principal's ``max_requests_per_principal`` slots until the request is over;
        ProxyError 429 if it has none left."""
        requests = self.principal_requests
        try:
            requests.acquire(principal, grant.subject)
        except ProxyError:
            self.metrics.rate_limited.labels(limit="principal").inc()
            self._at_limit.warning(
                grant.subject, "request refused: principal at its limit of open requests subject=%s agent_id=%d limit=%d",
                logfmt(grant.subject), grant.agent_id, requests.limit,
            )
            raise
        held.callback(requests.release, principal)

    async def _route(self, agent_id: int, metadata: Metadata) -> MuxStream:
        """A stream from the router; ProxyError otherwise."""
        started, status = trio.current_time(), "aborted"
        try:
            stream = await open_stream(self.router, agent_id, metadata)
            status = "success"
            return stream
        except AgentStreamError as exc:
            status = "timeout" if exc.timed_out else "error"
            raise ProxyError(exc.status, exc.message) from None
        except Exception:
            status = "error"
            raise
        finally:
            self.metrics.routed(status, trio.current_time() - started)

    # ------------------------------------------------------------------ relay

    async def _exchange(self, t: _Transfer) -> None:
        """Relay one routed request. A request with a body (or an upgrade) gets a task reading from
        the client at once; a bodiless one only if its answer is slow (a second) or long, to notice
        the client leaving — a quick small GET runs in this task alone."""
        ex = t.ex
        metrics = self.metrics
        metrics.active_streams.inc()
        try:
            if not (t.bodiless and ex.take_empty_body()):
                self._start_reader(t, body=True)
            with t.scope:
                try:
                    await self._response_side(t)
                except ClientGone:
                    t.gone = True
            if t.reader is not None:
                t.reader.scope.cancel()
                await t.reader.done.wait()
            if t.failure is not None:
                raise t.failure  # the reader's bug: answered (or cut) in serve, like one of this task's
        except Exception:
            with trio.move_on_after(1, shield=True):
                if t.reader is not None:  # it reads the client: stopped before serve answers there
                    t.reader.scope.cancel()
                    await t.reader.done.wait()
                await t.stream.reset(ErrorCode.INTERNAL_ERROR, "kasd failed to serve the request")
            raise
        finally:
            metrics.active_streams.dec()
            if (t.gone or ex.client_gone) and not t.record.answered:
                if t.record.outcome != "upstream-broken":
                    t.record.outcome = "client-gone"
                await t.stream.reset(TunnelCode.CLIENT_GONE, "client went away")
            else:
                await t.stream.aclose()

    def _start_reader(self, t: _Transfer, *, body: bool) -> None:
        if not body and not t.ex.watches_client:
            return  # the front end notices the client leaving by itself
        t.reader = _Reader()
        t.ex.nursery.start_soon(self._client_reader, t, body)

    async def _client_reader(self, t: _Transfer, body: bool) -> None:
        """Stream the request body to the agent (``body``), then watch for the client going away."""
        reader = t.reader
        assert reader is not None
        try:
            with reader.scope:
                if body and not await self._stream_request_body(t):
                    return
                if t.ex.watches_client:
                    with reader.watch:
                        await t.ex.watch_client()
        except ClientGone:
            t.gone = True
            if not t.ending:
                t.scope.cancel()
        except Exception as exc:  # a bug: never out into the connection's nursery (its other requests)
            t.failure = exc
            t.scope.cancel()
        finally:
            reader.done.set()

    async def _stream_request_body(self, t: _Transfer) -> bool:
        """True once the body is in; False if the agent's stream broke (the response side says why)."""
        bytes_to_agent = self.metrics.bytes_to_agent
        stream = t.stream
        tap = t.tap
        while data := await t.ex.receive_body():
            if tap is not None and len(tap) < _NAMESPACE_BODY:
                tap += data[:_NAMESPACE_BODY - len(tap)]
            try:
                await stream.send_all(data)
            except _MUX_ERRORS:
                return False  # the response side reports what happened to the stream
            t.record.bytes_in += len(data)
            bytes_to_agent.inc(len(data))
        if t.ex.request.upgrade:
            return True  # after a 101 the stream carries the client's bytes, so no EOF
        try:
            await stream.send_eof()
        except _MUX_ERRORS:
            return False
        return True

    async def _await_head(self, t: _Transfer) -> ResponseHead:
        if t.reader is None and t.ex.watches_client:
            # Most answers come at once; a slow one gets a reader to notice the client leaving.
            with trio.move_on_after(_WATCH_AFTER):
                return await self._response(t)
            self._start_reader(t, body=False)
        return await self._response(t)

    async def _response(self, t: _Transfer) -> ResponseHead:
        """The agent's response head; ProxyError otherwise. A request the agent did not take goes
        to another session as ``routing.retry`` decides (``t.stream`` is then the one that took it)."""
        agent_id = t.grant.agent_id

        def retrying(reason: Exception) -> None:
            self._retry_log.info((agent_id, type(reason).__name__),
                                 "agent did not take the request, retrying request_id=%s agent_id=%d error=%s",
                                 t.head.request_id, agent_id, reason)

        try:
            stream, metadata = await take_or_retry(
                t.stream, agent_id=agent_id, metadata=t.metadata, method=t.head.method, bodiless=t.bodiless,
                open_stream=partial(open_stream, self.router), report=self.router.report, on_retry=retrying)
        except StreamRefusedError as exc:
            raise (t.plan.refusal if t.plan is not None else _refusal)(exc, agent_id) from None
        except LOST as exc:
            raise ProxyError(502, f"tunnel to agent {agent_id} failed before the response: {exc}") from None
        except AgentStreamError as exc:  # a retry found no stream
            raise ProxyError(exc.status, exc.message) from None
        t.stream = stream
        # Usage: the agent took the request (once, on whichever session took it).
        self.metrics.count_agent_request(agent_id, t.grant.kind)
        try:
            return ResponseHead.from_metadata(metadata)
        except RemoteProtocolError as exc:
            raise ProxyError(502, f"agent {agent_id} sent an invalid response head: {exc}") from None

    async def _response_side(self, t: _Transfer) -> None:
        ex, record = t.ex, t.record
        agent_id = t.grant.agent_id
        try:
            head = await self._await_head(t)
            if head.status == 101 and not ex.request.upgrade:
                raise ProxyError(502, f"agent {agent_id} switched protocols for a request that did not ask to")
            if 100 <= head.status < 200 and head.status != 101:
                raise ProxyError(502, f"agent {agent_id} sent an interim {head.status} response head")
        except ProxyError as exc:
            t.ending = True
            await self._send_status(ex, exc, record, t.plan)
            return
        stream = t.stream  # the one that answered: not the first, if that agent did not take the request
        record.status = head.status
        if head.status == 101:
            assert t.reader is not None  # an upgrade always has one
            t.reader.watch.cancel()
            await t.reader.done.wait()
            await self._switch(t, head.headers)
            return
        headers = clean_response_headers(head.headers)
        if t.plan is not None:
            headers = t.plan.answer_headers(headers)
        headers.append((REQUEST_ID_HEADER, record.request_id))
        bytes_from_agent = self.metrics.bytes_from_agent
        boundary = answer_boundary(t.head, head)
        # The head, and whatever of the body already arrived (all of a small answer), in one write.
        out: list[bytes] = []
        size = 0
        while size < _CHUNK:
            try:
                data = stream.receive_nowait(_CHUNK)
            except (trio.WouldBlock, *_MUX_ERRORS):
                break  # not here yet, or an error the loop below reports
            if not data:
                t.ending = True
                record.head_sent = True
                await ex.respond(head.status, headers, b"".join(out), end=True)
                record.bytes_out += size
                record.answered = True
                return
            out.append(data)
            if boundary is not None:
                boundary.feed(data)
            size += len(data)
            bytes_from_agent.inc(len(data))
        record.head_sent = True
        await ex.respond(head.status, headers, b"".join(out), end=False)
        record.bytes_out += size
        if t.reader is None:
            self._start_reader(t, body=False)  # a long answer (a watch, logs -f): watch the client
        if not await relay_answer(stream, record, bytes_from_agent, ex.send, chunk=_CHUNK,
                                  drain=self.drain, boundary=boundary):
            ex.abort()  # the client sees a truncated body
            return
        t.ending = True
        await ex.end()
        record.answered = True

    async def _fail(self, ex: Exchange, record: RequestRecord, exc: Exception, plan: RequestPlan | None = None) -> None:
        """An unexpected exception while serving ``ex``: one rate-limited ERROR line (no message, which
        could quote the request), and the client answered ``500`` if no head went out yet, else shown
        a cut answer (a reset stream on HTTP/2: never the connection's other requests)."""
        self.unexpected.report(exc, "request failed unexpectedly request_id=%s method=%s peer=%s",
                               record.request_id, record.method, record.peer)
        sent = record.head_sent
        record.outcome = "internal-error"
        if sent or ex.client_gone:
            ex.abort()
            return
        failure = ProxyError(500, f"kasd failed to serve this request: an internal error (request id {record.request_id})")
        try:
            await self._send_status(ex, failure, record, plan)
        except ClientGone:
            pass
        except Exception:  # the front end cannot answer it either: cut it, and say so once above
            ex.abort()
        record.outcome = "internal-error"

    async def _send_status(self, ex: Exchange, exc: ProxyError, record: RequestRecord,
                           plan: RequestPlan | None = None) -> None:
        body = status_body(exc.status, exc.message) if plan is None else plan.error_body(exc.status, exc.message)
        headers = [*status_headers(body, exc.headers), (REQUEST_ID_HEADER, record.request_id)]
        record.status = exc.status
        record.outcome = "error"
        record.head_sent = True
        await ex.send_error(exc.status, headers, body)
        record.bytes_out += len(body)
        record.answered = True

    async def _switch(self, t: _Transfer, raw_headers: tuple[tuple[str, str], ...]) -> None:
        """``101``: from here on, the client connection and the logical stream are one byte pipe."""
        stream, record = t.stream, t.record
        headers = clean_response_headers(raw_headers, switching=True)
        if t.plan is not None:
            headers = t.plan.answer_headers(headers)
        headers.append((REQUEST_ID_HEADER, record.request_id))
        record.head_sent = True
        client, early = await t.ex.upgrade(headers)
        to_agent = self.metrics.bytes_to_agent
        from_agent = self.metrics.bytes_from_agent
        record.outcome = "upgraded"

        def sent_to_agent(size: int) -> None:
            record.bytes_in += size
            to_agent.inc(size)

        def sent_to_client(size: int) -> None:
            record.bytes_out += size
            from_agent.inc(size)

        result = await relay(client, stream, early_to_server=early, on_to_server=sent_to_agent,
                             on_to_client=sent_to_client, chunk=_CHUNK)
        if result.broken == "client" or result.cut:
            # (cut: the client's end came and the agent's side did not finish within the grace:
            # the client is gone, and the reset tells agentd to close the API server's side)
            raise ClientGone("client went away from the upgraded connection")


async def relay_answer(stream: MuxStream, record: RequestRecord, from_agent: Counter,
                       send: Callable[[bytes], Awaitable[object]], *, chunk: int,
                       drain: Drain, boundary: EventBoundary | None) -> bool:
    """Pass the rest of the agent's answer to ``send``, chunk by chunk, counting it. True once it
    has ended, or once kasd drains and an endless answer (``boundary``) reached the end of an
    event; False if the agent's stream broke first (logged, ``record.outcome`` set): too late
    for a Status, so the caller must show the client a truncated body."""
    receive = partial(stream.receive_some, chunk)
    while True:
        try:
            data = await drain.next_chunk(receive, boundary)
        except _MUX_ERRORS as exc:
            log.warning("agent stream broke mid-response request_id=%s error=%s", record.request_id, exc)
            record.outcome = "upstream-broken"
            return False
        if data is None:
            record.outcome = "drained"  # a watch or logs -f, ended between two events
            return True
        if not data:
            return True
        await send(data)
        record.bytes_out += len(data)
        from_agent.inc(len(data))


def _refusal(exc: StreamRefusedError, agent_id: int) -> ProxyError:
    detail = exc.message or "no detail"
    if exc.code == TunnelCode.UPSTREAM_UNREACHABLE:
        return ProxyError(502, f"cluster API unreachable from agent {agent_id}: {detail}")
    if exc.code == TunnelCode.BAD_REQUEST:
        return ProxyError(400, f"agent {agent_id} rejected the request: {detail}")
    if exc.code == TunnelCode.UNKNOWN_TARGET:
        return ProxyError(404, f"agent {agent_id} cannot serve this request: {detail}")
    return ProxyError(503, f"agent {agent_id} refused the request: {exc}")


__all__ = ["DROPPED", "DroppedHeaders", "Planned", "RequestPipeline", "RequestPlan", "answer_boundary", "clean_request_headers", "relay_answer"]
