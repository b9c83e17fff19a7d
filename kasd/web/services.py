"""In-cluster services on the REST API port: ``/api/v4/agents/<id>/services/<name>/<path…>`` and
the PromQL call ``/api/kasd/v1/agents/<id>/promql``, through the proxy's one request pipeline.

Neither is a Starlette route: the API port (``kasd.asgiport``) hands a request of these paths to
``kasd.k8sproxy.pipeline.RequestPipeline`` before the ASGI app, with ``ServiceRoutes`` as its
``RequestPlan``. The plan authenticates (a CI job token: ``JOB-TOKEN`` or ``?job_token=``; a personal
token: ``PRIVATE-TOKEN`` or ``Authorization: Bearer``), authorizes (``services:`` of the agent's
config.yaml, ``kasd.authz.servicepolicy``) and says where the request goes (an OPEN of kind
``service`` naming the service, the rest of the path and the query, credentials removed); the
pipeline then does what it does for kubectl: the per-token cap on open requests, routing (to
another replica if need be), streaming both ways without buffering, the ``101`` byte pipe (a
WebSocket through the service), retries of a request no agentd took, the access line and metrics.

kasd's own answers are GitLab's ``{"message": "403 Forbidden: …"}``; an answer agentd composes (a
``Status`` JSON: traversal 400, not allowed 403, timeout 504) or the service's own passes through
as it comes.

May import: ``kasd.authz``, ``kasd.k8sproxy`` (the pipeline, its exchange and status values),
``kasd.seams``, ``kasd.web.auth``, ``tunnelhttp``, ``wire``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Hashable, Sequence
from http import HTTPStatus
from urllib.parse import parse_qsl, quote, unquote_plus

import attrs

from kasd.authz.jobtokens import JobClaims
from kasd.authz.servicepolicy import ServiceDecision, authorize_service_job, authorize_service_user
from kasd.authz.services import SERVICE_NAME
from kasd.authz.snapshot import Snapshot
from kasd.authz.visibility import job_sees_agent, user_sees_agent
from kasd.k8sproxy.accesslog import RequestRecord
from kasd.k8sproxy.exchange import ClientRequest, Exchange
from kasd.k8sproxy.pipeline import (
    DROPPED,
    DroppedHeaders,
    Planned,
    RequestPipeline,
    clean_request_headers,
)
from kasd.k8sproxy.status import ProxyError
from kasd.seams import AccessDenied, Grant, parse_bearer
from kasd.web.auth import ApiRefusal, small_int, verify_token
from tunnelhttp.head import TunnelCode
from tunnelhttp.kinds import KIND_SERVICE
from tunnelhttp.servicepath import UnsafeTarget, normalised_path
from wire.session import StreamRefusedError

#: ``/api/v4/agents/<id>/services/<name>[/<path…>][?query]``
SERVICES_PREFIX = "/api/v4/agents/"
#: ``/api/kasd/v1/agents/<id>/promql?query=…``
PROMQL_PREFIX = "/api/kasd/v1/agents/"
#: the service a PromQL call asks when it names none
DEFAULT_PROMQL_SERVICE = "prometheus"
#: query parameters that carry a credential: read (``job_token``) or not, never forwarded
CREDENTIAL_PARAMS = frozenset({"job_token", "private_token"})
#: request headers that carry a credential here, besides those the proxy drops (Authorization,
#: Cookie, Impersonate-*, X-Remote-*): never forwarded. ``Referer``: a browser's, from a page of
#: kasd's origin opened with ``?job_token=``, carries the token in its query
CREDENTIAL_HEADERS = ("job-token", "private-token", "referer")
#: request headers a service behind a proxy may believe over the request itself: another method
#: (``X-HTTP-Method-Override``: a POST agentd allows becomes a DELETE it does not), another path
#: (``X-Original-URL``: Symfony, IIS), or who asks and from where (Grafana's auth proxy
#: ``X-WEBAUTH-USER``, oauth2-proxy's ``X-Forwarded-User``/``X-Auth-Request-*``, ``Remote-User``).
#: agentd's allow-list judges the method and path kasd sends; these would change them behind its
#: back, or claim an identity the caller did not prove. Never forwarded (names, or prefixes ending in ``*``).
REWRITING_HEADERS = ("x-http-method-override", "x-http-method", "x-method-override", "x-original-url",
                     "x-original-uri", "x-rewrite-url", "x-override-url", "forwarded", "x-forwarded-*",
                     "x-real-ip", "x-client-ip", "x-auth-request-*", "x-webauth-*", "remote-user", "x-remote-*")
#: PromQL parameters, as Prometheus's HTTP API names them
_INSTANT = ("query", "time", "timeout")
_RANGE = ("query", "start", "end", "step", "timeout")
_PROMQL_PARAMS = frozenset({*_INSTANT, *_RANGE, "service"})


def message(status: int, detail: str) -> str:
    """GitLab's wording: ``403 Forbidden: <detail>``; a detail that already starts with its status
    (``404 Service Not Found``, as GitLab words a missing thing) is kept as it is."""
    try:
        phrase = f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        phrase = str(status)
    return detail if detail.startswith((phrase, f"{status} ")) else f"{phrase}: {detail}"


@attrs.frozen(kw_only=True)
class ServiceCall:
    """A request of these routes: which agent and service, and the target agentd gets."""

    agent_id: int
    service: str
    #: path and query relative to the service's URL, starting with ``/``
    target: str


def _refuse(status: int, detail: str) -> ProxyError:
    return ProxyError(status, message(status, detail))


def _split(raw_target: str) -> tuple[str, str]:
    path, _, query = raw_target.partition("?")
    return path, query


def credential_param(name: str) -> bool:
    """Whether a query parameter's name (as sent) is one some server reads as a credential: ``job_token``
    or ``private_token`` in any case, percent-encoded, with ``-`` or a space (``+``) for ``_``, or
    followed by what a framework ignores or folds away (``job_token[]``, ``job_token%00``, ``JOB_TOKEN.x``),
    or with ``.`` for ``_`` (PHP folds ``.``, `` `` and ``[`` in a name to ``_``)."""
    text = unquote_plus(name, errors="replace").lower().strip()
    folded = re.sub(r"[-. \[]", "_", text)  # (PHP reads "job.token" and "job token" as job_token)
    return any(re.split(r"[^a-z0-9_]", form.replace("-", "_").replace(" ", "_"), maxsplit=1)[0] in CREDENTIAL_PARAMS
               for form in (text, folded))


def without_credentials(query: str) -> str:
    """``query`` as sent, minus every parameter a server could read as ``job_token``/``private_token``
    (``credential_param``; ``&`` and ``;`` both separate parameters to some servers); the others
    untouched, byte for byte: the service reads them as the client wrote them."""
    kept = []
    for part in query.split("&"):
        pieces = [piece for piece in part.split(";") if not credential_param(piece.partition("=")[0])]
        if any(pieces):
            kept.append(";".join(pieces))
    return "&".join(kept)


def carries_secret(secret: str, target: str, headers: Sequence[tuple[str, str]]) -> bool:
    """Whether the token a request authenticates with is still in what would be forwarded: the
    target (as sent or percent-decoded: a token in the path, or under a parameter name no rule
    knows) or a header kasd does not drop."""
    if len(secret) < 8:  # (a token that short is refused anyway; a substring test of it means nothing)
        return False
    return (secret in target or secret in unquote_plus(target, errors="replace")
            or any(secret in value for _name, value in headers))


#: how many times over a segment is decoded to look for a dot segment or a separator (as agentd)


def traversal_problem(path: str) -> str | None:
    """Why the rest of a service path could climb out of the prefix agentd allows, or reach the
    service differently than it was judged, or None: ``tunnelhttp.servicepath``'s check, which
    agentd applies again (kasd refuses first, so nothing of it leaves)."""
    try:
        normalised_path(path)
    except UnsafeTarget as exc:
        return str(exc)
    return None


def service_target(raw_target: str) -> ServiceCall | ProxyError | None:
    """The service request ``raw_target`` makes (``/api/v4/agents/<id>/services/<name>/<path…>``),
    a 400/404 for one of this shape that is wrong, None for a path of another shape."""
    path, query = _split(raw_target)
    if not path.startswith(SERVICES_PREFIX):
        return None
    parts = path[len(SERVICES_PREFIX):].split("/", 3)
    if len(parts) < 3 or parts[1] != "services":
        return None
    agent_id = small_int(parts[0])
    if agent_id is None:
        return _refuse(404, "404 Agent Not Found")
    name = parts[2]
    if not SERVICE_NAME.fullmatch(name):
        return _refuse(404, "404 Service Not Found")
    rest = "/" + (parts[3] if len(parts) > 3 else "")
    problem = traversal_problem(rest)
    if problem:
        return _refuse(400, problem)
    query = without_credentials(query)
    return ServiceCall(agent_id=agent_id, service=name, target=rest + ("?" + query if query else ""))


def promql_target(method: str, raw_target: str) -> ServiceCall | ProxyError | None:
    """The Prometheus request a PromQL call makes (``/api/kasd/v1/agents/<id>/promql?query=…``): an
    instant query (``/api/v1/query``, ``time=`` optional) or, with ``start``, ``end`` and ``step``, a
    range query (``/api/v1/query_range``) of the service ``service=`` (default ``prometheus``); a
    400/404/405 for a call of this shape that is wrong, None for a path of another shape."""
    path, query = _split(raw_target)
    if not path.startswith(PROMQL_PREFIX):
        return None
    parts = path[len(PROMQL_PREFIX):].split("/")
    if len(parts) != 2 or parts[1] != "promql":
        return None
    agent_id = small_int(parts[0])
    if agent_id is None:
        return _refuse(404, "404 Agent Not Found")
    if method not in ("GET", "HEAD"):
        return ProxyError(405, message(405, "a PromQL call is a GET"), (("allow", "GET, HEAD"),))
    params: dict[str, str] = {}
    for name, value in parse_qsl(without_credentials(query), keep_blank_values=True):
        if name not in _PROMQL_PARAMS:
            return _refuse(400, f"unknown parameter {name[:64]!r} (expected query, time, start, end, step, timeout, service)")
        if name in params:
            return _refuse(400, f"parameter {name!r} given twice")
        params[name] = value
    if not params.get("query"):
        return _refuse(400, "query is missing (a PromQL expression)")
    service = params.pop("service", DEFAULT_PROMQL_SERVICE)
    if not SERVICE_NAME.fullmatch(service):
        return _refuse(400, "service is not a service name (lower-case letters, digits and '-', at most 63)")
    ranged = [name for name in ("start", "end", "step") if name in params]
    if ranged and len(ranged) != 3:
        return _refuse(400, "a range query needs start, end and step (an instant query none of them)")
    if ranged and "time" in params:
        return _refuse(400, "time is for an instant query; a range query takes start, end and step")
    endpoint, names = ("/api/v1/query_range", _RANGE) if ranged else ("/api/v1/query", _INSTANT)
    encoded = "&".join(f"{name}={quote(params[name], safe='')}" for name in names if name in params)
    return ServiceCall(agent_id=agent_id, service=service, target=f"{endpoint}?{encoded}")


#: response headers a service's answer never carries to the client: each acts on kasd's origin (the
#: API port serves the dashboard and its ``_kasd_session`` cookie there), not on the answer alone
#: (cookies set or cleared, HSTS or an alternative service pinned for kasd's host, a service worker
#: scope widened), asks the browser for credentials on kasd's origin (a service's ``WWW-Authenticate``
#: would raise the browser's own sign-in prompt over kasd's name; what is typed there is never forwarded,
#: since agentd alone authenticates to the service), or is a policy of the answer kasd sets itself
#: (``ANSWER_POLICY``)
ORIGIN_HEADERS = frozenset({
    "www-authenticate", "proxy-authenticate",
    "set-cookie", "set-cookie2", "clear-site-data", "strict-transport-security", "alt-svc",
    "service-worker-allowed", "public-key-pins", "public-key-pins-report-only", "expect-ct",
    "nel", "report-to", "reporting-endpoints",
    "origin-agent-cluster", "content-security-policy", "content-security-policy-report-only",
    "x-content-type-options", "x-frame-options", "x-xss-protection", "x-permitted-cross-domain-policies",
})
#: what every answer from a service carries: a browser shown it (a link with ``?job_token=`` in it)
#: treats it as a sandboxed document of an opaque origin, with no script, form, plugin or frame, so a
#: page a service serves can neither read the dashboard's data nor act with a signed-in person's session
ANSWER_POLICY = (
    ("content-security-policy",
     "sandbox; default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
)


#: answer headers that send a browser on: kept only when they stay on kasd's origin (a path), since a
#: link through kasd (``…/services/<name>/x?job_token=…``) must not be an open redirect to another site
REDIRECT_HEADERS = frozenset({"location", "content-location", "refresh"})


def _elsewhere(name: str, value: str) -> bool:
    """Whether a redirect header's value could leave kasd's origin: anything but a plain path
    (``Refresh: 0; url=…`` is read for its ``url``)."""
    target = value.strip()
    if name == "refresh":
        _, _, after = target.partition(";")
        target = after.strip()
        if target[:4].lower() == "url=":
            target = target[4:].strip().strip("'\"")
        elif not after:
            return False  # a bare delay reloads the same page
    return not target.startswith("/") or target.startswith(("//", "/\\")) or "\\" in target or any(
        ord(c) < 0x21 for c in target)


def inert_answer_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A service's answer's headers (names any case), minus ``ORIGIN_HEADERS`` and any redirect off
    kasd's origin (``REDIRECT_HEADERS``), plus ``ANSWER_POLICY``."""
    kept = []
    for name, value in headers:
        folded = name.lower().replace("_", "-")  # (read as "-" by some clients and servers, as by CGI)
        if folded in ORIGIN_HEADERS or (folded in REDIRECT_HEADERS and _elsewhere(folded, value)):
            continue
        kept.append((name, value))
    return [*kept, *ANSWER_POLICY]


def _headers(request: ClientRequest, name: str) -> list[str]:
    return [value.strip() for key, value in request.headers if key == name and value.strip()]


def offered_credentials(request: ClientRequest) -> tuple[str, str]:
    """(``ci`` or ``pat``, the token) as GitLab's API reads them: ``?job_token=``, ``JOB-TOKEN``,
    ``PRIVATE-TOKEN``, ``Authorization: Bearer`` (the proxy port's ``ci:<agent>:<token>`` and
    ``pat:<agent>:<token>`` forms too), the first present; ``AccessDenied`` 401 for none, or for a
    header given twice. (``?token=``, which GitLab also reads, is not: a service may take a
    parameter of that name, and kasd neither reads nor hides it.)"""
    _, query = _split(request.target)
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name == "job_token" and value.strip():
            return "ci", value.strip()
    for header, kind in (("job-token", "ci"), ("private-token", "pat")):
        values = _headers(request, header)
        if len(values) > 1:
            raise AccessDenied(401, f"more than one {header.upper()} header")
        if values:
            return kind, values[0]
    authorization = _headers(request, "authorization")
    if len(authorization) > 1:
        raise AccessDenied(401, "more than one Authorization header")
    if authorization:
        scheme, _, value = authorization[0].partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AccessDenied(401, "send a token as JOB-TOKEN, PRIVATE-TOKEN or Authorization: Bearer <token>")
        try:
            credentials = parse_bearer(authorization[0])
        except AccessDenied:
            return "pat", value.strip()
        return credentials.kind, credentials.secret
    raise AccessDenied(401, "send a CI job token (JOB-TOKEN header or job_token parameter) or a personal token "
                            "(PRIVATE-TOKEN header or Authorization: Bearer)")


class ServiceRoutes:
    """The ``RequestPlan`` of both routes (``kasd.k8sproxy.pipeline``); ``snapshot()`` is the
    authorization in force now, ``clock()`` the time of day (seconds since the epoch)."""

    dropped_headers: DroppedHeaders = DROPPED.also((*CREDENTIAL_HEADERS, *REWRITING_HEADERS))

    def __init__(self, snapshot: Callable[[], Snapshot], clock: Callable[[], float] = time.time) -> None:
        self._snapshot = snapshot
        self._clock = clock

    @staticmethod
    def target(request: ClientRequest) -> ServiceCall | ProxyError | None:
        """What ``request`` is to these routes: None when it is not theirs."""
        found = service_target(request.target)
        if found is None:
            found = promql_target(request.method, request.target)
        if isinstance(found, ServiceCall) and request.method == "CONNECT":
            # (a CONNECT has no body framing: relayed, it would hold its slot until a timeout with no
            # answer; kasd relays requests and Upgrades to a service, never a CONNECT tunnel)
            return ProxyError(405, message(405, "CONNECT is not relayed to a service (an Upgrade is)"),
                              (("allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),))
        return found

    async def plan(self, request: ClientRequest) -> Planned:
        found = self.target(request)
        if found is None:  # (the port hands over only requests of these routes)
            raise _refuse(404, "404 Not Found")
        if isinstance(found, ProxyError):
            raise found
        snapshot = self._snapshot()
        now = self._clock()
        try:
            kind, secret = offered_credentials(request)
            if kind == "ci":
                claims: JobClaims | None = snapshot.verify_job(secret, now=now)
                assert claims is not None and claims.stamp is not None
                expires, user = claims.stamp.expires_at, None
            else:
                caller = verify_token(snapshot, secret, now)
                claims, expires, user = None, caller.expires, caller.username
        except AccessDenied as exc:
            raise _refuse(401, exc.message.removeprefix("bad token: ")) from None
        except ApiRefusal as exc:
            raise _refuse(exc.status, exc.message) from None
        compiled = snapshot.agents.get(found.agent_id)
        config = compiled.config if compiled is not None else None
        decision: ServiceDecision
        if claims is not None:
            decision = authorize_service_job(snapshot.directory, found.agent_id, config, found.service, claims)
        else:
            assert user is not None
            decision = authorize_service_user(snapshot.directory, found.agent_id, config, found.service, user)
        if not decision.allowed:
            seen = (job_sees_agent(snapshot.directory, found.agent_id, config, claims) if claims is not None
                    else user is not None and user_sees_agent(snapshot.directory, found.agent_id, config, user))
            if not seen:  # (as an agent that does not exist: neither ids nor service names are told)
                raise _refuse(404, "404 Agent Not Found")
            raise _refuse(decision.status, decision.reason)
        forwarded = clean_request_headers(request.headers, upgrade=request.upgrade, dropped=self.dropped_headers)
        if carries_secret(secret, found.target, forwarded):
            raise _refuse(400, "the request carries its token where kasd does not remove it (in the path, a header "
                               "or a parameter of another name); send it only as JOB-TOKEN, PRIVATE-TOKEN, "
                               "Authorization: Bearer or ?job_token=, so that it never reaches the service")
        grant = Grant(kind=kind, agent_id=found.agent_id, impersonate=None, subject=decision.principal,
                      access_as="agent", user=user, expires_at=expires)
        principal: Hashable = (kind, secret)
        return Planned(grant=grant, principal=principal, kind=KIND_SERVICE, service=found.service,
                       target=found.target)

    def error_body(self, status: int, detail: str) -> bytes:
        return json.dumps({"message": message(status, detail)}, separators=(",", ":")).encode()

    def answer_headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return inert_answer_headers(headers)

    def refusal(self, exc: StreamRefusedError, agent_id: int) -> ProxyError:
        detail = exc.message or "no detail"
        if exc.code == TunnelCode.UNKNOWN_TARGET:
            return _refuse(404, f"agent {agent_id}: {detail}")
        if exc.code == TunnelCode.UPSTREAM_UNREACHABLE:
            return _refuse(502, f"the service is unreachable from agent {agent_id}: {detail}")
        if exc.code == TunnelCode.BAD_REQUEST:
            return _refuse(400, f"agent {agent_id} rejected the request: {detail}")
        return _refuse(503, f"agent {agent_id} refused the request: {exc}")


class ServiceDispatch:
    """What the API port asks of each request before its ASGI app (``kasd.asgiport.Bypass``): a
    request of these routes goes to the pipeline with ``routes`` as its plan."""

    def __init__(self, pipeline: RequestPipeline, routes: ServiceRoutes) -> None:
        self.pipeline = pipeline
        self.routes = routes

    def takes(self, request: ClientRequest) -> bool:
        return self.routes.target(request) is not None

    async def serve(self, ex: Exchange, *, done: Callable[[RequestRecord], object] | None = None,
                    proven: Callable[[], object] | None = None) -> None:
        await self.pipeline.serve(ex, done=done, proven=proven, plan=self.routes)


__all__ = [
    "ANSWER_POLICY",
    "CREDENTIAL_HEADERS",
    "CREDENTIAL_PARAMS",
    "DEFAULT_PROMQL_SERVICE",
    "ORIGIN_HEADERS",
    "REDIRECT_HEADERS",
    "REWRITING_HEADERS",
    "ServiceCall",
    "ServiceDispatch",
    "ServiceRoutes",
    "carries_secret",
    "credential_param",
    "inert_answer_headers",
    "message",
    "offered_credentials",
    "promql_target",
    "service_target",
    "traversal_problem",
    "without_credentials",
]
