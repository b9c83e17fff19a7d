"""The web app (Starlette, on trio through anyio) and ``mount``: one ASGI app for the API port that
gives ``kasd.restapi.RestApi`` its job-token paths and this app everything else, with the security
headers on every answer."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    asynccontextmanager,
    contextmanager,
)
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote

import attrs
import trio
import yaml
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from kasd.asgiport import AsgiApp
from kasd.authz.directory import Role
from kasd.authz.snapshot import Snapshot
from kasd.envgraph import node_id
from kasd.environments.values import Viewer, ViewerTooSlow
from kasd.restapi import RestApi
from kasd.store.protocol import StoreError
from kasd.web import openapi
from kasd.web.auth import (
    ApiRefusal,
    Caller,
    SignInLimit,
    authenticate,
    group_for,
    project_for,
    small_int,
    verify_token,
    viewer_for,
)
from kasd.web.seams import (
    AnswerLike,
    ConnectedAgents,
    EnvironmentLike,
    EnvironmentStore,
    GraphOf,
    SnapshotLike,
    Views,
    envgraph_json,
    labels_of,
)
from kasd.web.session import COOKIE, SessionSigner
from kasd.web.shapes import (
    DEFAULT_PER_PAGE,
    MAX_PER_PAGE,
    gitlab_environment,
    kasd_deployment,
    kasd_environment,
    kasd_problem,
    page_headers,
    paginate,
)
from kasd.web.streams import SharedGraphs, graph_events, text_stream

#: every answer of the port carries these (the dashboard is same-origin only, framed by no one)
SECURITY_HEADERS = (
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)
#: seconds a snapshot of an environment (discovery and lists through the agent) may take: beyond, 504
SNAPSHOT_LIMIT = 30.0
#: seconds one request through the agent (an object, its events, a delete, a reconcile) may take
REQUEST_LIMIT = 20.0
#: the Flux API groups whose objects ``reconcile`` annotates
FLUX_GROUP_SUFFIX = ".toolkit.fluxcd.io"
#: GitLab's environment states
STATES = ("available", "stopping", "stopped")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_VERSION = re.compile(r"v[0-9]+((alpha|beta)[0-9]+)?")
_KIND = re.compile(r"[A-Za-z][A-Za-z0-9]{0,62}")
_GROUP = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
MAX_TAIL_LINES = 100_000
T = TypeVar("T")


class _EnvIdConvertor(Convertor[int]):
    """An environment id in a path: digits, of which more than 19 (ids are 63-bit) are no id (0, which
    the handlers answer as not found after the caller is known, as any unknown id), where Starlette's
    ``int`` convertor would hand them to ``int()``, which raises past 4,300 digits (a 500 a stranger
    could cause at will)."""

    regex = "[0-9]+"

    def convert(self, value: str) -> int:
        return small_int(value) or 0

    def to_string(self, value: int) -> str:
        return str(value)


register_url_convertor("env_id", _EnvIdConvertor())


@attrs.frozen(kw_only=True)
class WebSettings:
    #: origins (``https://host[:port]``) whose pages may call the API (``web.cors_origins``); none by default
    cors_origins: tuple[str, ...] = ()
    #: the port serves TLS: the session cookie is ``Secure``
    tls: bool = False
    #: sign-in attempts per source per minute (and the burst)
    sign_in_per_minute: float = 10.0
    #: live answers (the graph's SSE, pod logs) one person may have open at once on this kasd
    max_streams_per_user: int = 16


class WebApp:
    """The environments API. ``snapshot()`` is the authorization in force (reloads included)."""

    def __init__(self, snapshot: Callable[[], Snapshot], store: EnvironmentStore, views: Views,
                 agents: ConnectedAgents, *, key: bytes, settings: WebSettings = WebSettings(),
                 clock: Callable[[], float] = time.time, graph_of: GraphOf = envgraph_json,
                 extra_routes: Sequence[BaseRoute] = (),
                 agent_errors: tuple[type[Exception], ...] = ()) -> None:
        #: what ``views`` raise when the agent cannot be asked (``kasd.agentclient.AgentRequestError``:
        #: ``status`` and ``message``, safe to show)
        self._agent_errors = agent_errors
        self._snapshot = snapshot
        self._store = store
        self._views = views
        self._agents = agents
        self._signer = SessionSigner(key)
        self._settings = settings
        self._clock = clock
        self._graph_of = graph_of
        #: each live view's graph, built once per change for all its viewers
        self._graphs = SharedGraphs()
        #: open live answers by user (``max_streams_per_user`` each)
        self._streams: dict[str, int] = {}
        self._limit = SignInLimit(clock, per_minute=settings.sign_in_per_minute,
                                  burst=max(1, int(settings.sign_in_per_minute)))
        routes = [
            Route("/-/sign_in", self.sign_in, methods=["POST"]),
            Route("/-/sign_out", self.sign_out, methods=["POST"]),
            Route("/-/session", self.session, methods=["GET"]),
            Route("/api/v4/projects/{project:path}/environments", self.project_environments, methods=["GET"]),
            Route("/api/v4/projects/{project:path}/environments/{env_id:env_id}", self.project_environment,
                  methods=["GET"]),
            Route("/api/v4/groups/{group:path}/environments", self.group_environments, methods=["GET"]),
            Route("/api/kasd/v1/openapi.json", self.openapi_document, methods=["GET"]),
            Route("/api/kasd/v1/agents", self.agents, methods=["GET"]),
            Route("/api/kasd/v1/agents/{agent_id:env_id}/cluster", self.agent_cluster, methods=["GET"]),
            Route("/api/kasd/v1/environments/{env_id:env_id}", self.environment, methods=["GET"]),
            Route("/api/kasd/v1/environments/{env_id:env_id}/resources", self.resources, methods=["GET"]),
            Route("/api/kasd/v1/environments/{env_id:env_id}/resources/watch", self.watch, methods=["GET"]),
            Route("/api/kasd/v1/environments/{env_id:env_id}/deployments", self.deployments, methods=["GET"]),
            Route("/api/kasd/v1/environments/{env_id:env_id}/objects/{group}/{version}/{kind}/{namespace}/{name}",
                  self.object, methods=["GET"]),
            Route("/api/kasd/v1/environments/{env_id:env_id}/objects/{group}/{version}/{kind}/{namespace}/{name}/events",
                  self.events, methods=["GET"]),
            Route("/api/kasd/v1/environments/{env_id:env_id}/pods/{namespace}/{name}/log", self.pod_log, methods=["GET"]),
            Route("/api/kasd/v1/environments/{env_id:env_id}/pods/{namespace}/{name}", self.delete_pod,
                  methods=["DELETE"]),
            Route("/api/kasd/v1/environments/{env_id:env_id}/flux/{kind}/{namespace}/{name}/reconcile", self.reconcile,
                  methods=["POST"]),
        ]
        self.routes = routes
        served: list[BaseRoute] = [*routes, *extra_routes]  # (the dashboard's: kasd.web.dashboard.dashboard_routes())
        middleware = []
        if settings.cors_origins:
            middleware.append(Middleware(
                CORSMiddleware, allow_origins=list(settings.cors_origins), allow_credentials=True,
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=["PRIVATE-TOKEN", "Authorization", "X-CSRF-Token", "Content-Type"],
                expose_headers=["x-page", "x-per-page", "x-total", "x-total-pages", "x-next-page", "x-prev-page",
                                "link"], max_age=600))
        self.app = Starlette(routes=served, middleware=middleware,
                             exception_handlers={ApiRefusal: _refused, HTTPException: _http_error,
                                                 StoreError: _store_failed})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    # ------------------------------------------------------------------ who

    def _caller(self, request: Request) -> tuple[Snapshot, Caller]:
        snapshot = self._snapshot()
        return snapshot, authenticate(request, snapshot, self._signer, self._clock())

    async def _environment(self, request: Request, *, need: Role = Role.REPORTER
                           ) -> tuple[Snapshot, Caller, EnvironmentLike]:
        snapshot, caller = self._caller(request)
        env_id = int(request.path_params["env_id"])
        env = await self._store.environment(env_id) if 0 < env_id < 2**63 else None  # (ids are 63-bit)
        if env is None:
            raise ApiRefusal(404, "404 Environment Not Found")
        try:
            project_for(snapshot, caller, str(env.project_id), need=need, explain=True)
        except ApiRefusal as exc:
            if exc.status == 404:  # (one that exists in a project they cannot see is not told apart)
                raise ApiRefusal(404, "404 Environment Not Found") from None
            raise
        return snapshot, caller, env

    def _viewer(self, request: Request, snapshot: Snapshot, caller: Caller, env: EnvironmentLike) -> Viewer:
        """Through which agent: ``?agent=`` (one of the environment's), else its last deployment's."""
        asked = request.query_params.get("agent")
        if asked is not None:
            number = small_int(asked)
            if number is None or number not in env.agents:
                raise ApiRefusal(400, f"400 Bad Request: agent must be one of the environment's agents "
                                   f"({', '.join(map(str, env.agents)) or 'none'})")
            agent_id = number
        elif env.last_deployment is not None:
            agent_id = env.last_deployment.agent_id
        elif env.agents:
            agent_id = env.agents[0]
        else:
            raise ApiRefusal(404, "404 Not Found: no agent has deployed to this environment")
        return viewer_for(snapshot, caller, agent_id)

    def _agent_refusal(self, exc: Exception) -> ApiRefusal:
        status = int(getattr(exc, "status", 502))
        status = status if status in (403, 404, 409, 422, 429, 502, 503, 504) else 502
        return ApiRefusal(status, f"{status} {str(getattr(exc, 'message', '') or exc)[:300]}")

    @asynccontextmanager
    async def _opened(self, source: AbstractAsyncContextManager[T], caller: Caller) -> AsyncIterator[T]:
        """``source`` entered, its refusal on entering (the agent's) the caller's answer; while it is
        open it holds one of ``caller``'s ``max_streams_per_user`` (one more is ``429``)."""
        async with AsyncExitStack() as stack:
            stack.enter_context(self._stream_slot(caller))
            try:
                value = await stack.enter_async_context(source)
            except self._agent_errors as exc:
                raise self._agent_refusal(exc) from None
            yield value

    @contextmanager
    def _stream_slot(self, caller: Caller) -> Iterator[None]:
        key = caller.username.lower()
        held = self._streams.get(key, 0)
        if held >= self._settings.max_streams_per_user:
            raise ApiRefusal(429, f"429 Too Many Requests: {held} live streams (graph or log) are open for this user "
                                  f"on this kasd, the most it allows; close one first", {"retry-after": "10"})
        self._streams[key] = held + 1
        try:
            yield
        finally:
            left = self._streams.pop(key) - 1
            if left:
                self._streams[key] = left

    async def _env_snapshot(self, env: EnvironmentLike, viewer: Viewer) -> SnapshotLike:
        try:
            with trio.fail_after(SNAPSHOT_LIMIT):
                return await self._views.snapshot(env, viewer)
        except self._agent_errors as exc:
            raise self._agent_refusal(exc) from None
        except trio.TooSlowError:
            raise ApiRefusal(504, f"504 Gateway Timeout: the environment's objects did not come within "
                               f"{SNAPSHOT_LIMIT:g} s") from None

    # ------------------------------------------------------------------ session

    async def sign_in(self, request: Request) -> Response:
        origin = request.headers.get("origin")
        if origin is not None and origin.lower() not in self._own_origins(request):
            # a page of another site signing its visitor in (as someone else): refused
            raise ApiRefusal(403, "403 Forbidden: sign-in from another origin")
        if origin is None and request.headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
            # the same, from a browser that left Origin out (a page cannot forge Sec-Fetch-Site)
            raise ApiRefusal(403, "403 Forbidden: sign-in from another origin")
        source = request.client.host if request.client else "-"
        wait = self._limit.take(source)
        if wait > 0:
            raise ApiRefusal(429, "429 Too Many Requests: too many sign-in attempts; try again later",
                          {"retry-after": str(int(wait) + 1)})
        body = await request.body()
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        form = content_type == "application/x-www-form-urlencoded"
        if not form and content_type != "application/json":
            # (a cross-site form can send text/plain that reads as JSON; a page can send
            # application/json to another origin only through CORS)
            raise ApiRefusal(415, "415 Unsupported Media Type: send the token as application/json or "
                                  "application/x-www-form-urlencoded")
        try:
            if form:
                token = dict(parse_qsl(body.decode())).get("token")
            else:
                data = json.loads(body or b"null")
                token = data.get("token") if isinstance(data, dict) else None
        except (ValueError, UnicodeDecodeError, RecursionError):  # (a stranger's `[[[[…`: not a 500)
            token = None
        if not isinstance(token, str) or not token.strip():
            raise ApiRefusal(400, '400 Bad Request: send {"token": "<personal token>"} as JSON, or a form with token')
        now = self._clock()
        caller = verify_token(self._snapshot(), token.strip(), now)
        session = self._signer.new(caller.username, caller.expires, caller.token_id, now,
                                   key_id=caller.key_id)
        answer: Response
        if form:  # a browser's form: to the dashboard, which asks GET /-/session for the CSRF token
            answer = RedirectResponse("/-/dashboard/", status_code=303)
        else:
            answer = JSONResponse({"user": session.user, "expires_at": _iso(session.expires),
                                   "csrf_token": self._signer.csrf_token(session)})
        answer.set_cookie(COOKIE, self._signer.cookie_value(session), max_age=max(0, session.expires - int(now)),
                          path="/", secure=self._settings.tls, httponly=True, samesite="strict")
        return _no_store(answer)

    def _own_origins(self, request: Request) -> set[str]:
        host = request.headers.get("host", "")
        return {f"{request.url.scheme}://{host}".lower(), *self._settings.cors_origins}

    async def sign_out(self, request: Request) -> Response:
        self._caller(request)  # (a cookie call: CSRF checked)
        answer = Response(status_code=204)
        answer.delete_cookie(COOKIE, path="/", secure=self._settings.tls, httponly=True, samesite="strict")
        return answer

    async def session(self, request: Request) -> Response:
        _, caller = self._caller(request)
        if caller.session is None:
            raise ApiRefusal(401, "401 Unauthorized: no session (sign in with POST /-/sign_in)")
        return _no_store(JSONResponse({"user": caller.username, "expires_at": _iso(caller.expires),
                                       "csrf_token": self._signer.csrf_token(caller.session)}))

    # ------------------------------------------------------------------ GitLab's environments

    async def project_environments(self, request: Request) -> Response:
        snapshot, caller = self._caller(request)
        project = project_for(snapshot, caller, request.path_params["project"])
        q = request.query_params
        name, search = q.get("name"), q.get("search")
        if name is not None and search is not None:
            raise ApiRefusal(400, "name, search cannot be used together", key="error")
        if search and len(search) < 3:
            raise ApiRefusal(400, "400 Bad request - Search query is less than 3 characters")
        state = _state(q.get("states"))
        envs = await self._store.environments(project_id=project.id, tier=_tier(q.get("tier")), state=state)
        if name is not None:
            envs = [e for e in envs if e.name == name]
        if search is not None:
            envs = [e for e in envs if search.lower() in e.name.lower()]
        return self._page(request, sorted(envs, key=lambda e: e.id))

    async def project_environment(self, request: Request) -> Response:
        snapshot, caller = self._caller(request)
        project = project_for(snapshot, caller, request.path_params["project"])
        env_id = int(request.path_params["env_id"])
        env = await self._store.environment(env_id) if 0 < env_id < 2**63 else None  # (ids are 63-bit)
        if env is None or env.project_id != project.id:
            raise ApiRefusal(404, "404 Not found")
        return JSONResponse(gitlab_environment(env, detail=True))

    async def group_environments(self, request: Request) -> Response:
        snapshot, caller = self._caller(request)
        group = group_for(snapshot, caller, request.path_params["group"])
        q = request.query_params
        envs = await self._store.environments(project_prefix=group.path + "/", tier=_tier(q.get("tier")),
                                              state=_state(q.get("states")))
        directory = snapshot.directory
        # whose an environment is: its project's id (as for every other path), never the path recorded
        # with it, which a renamed project leaves behind for another project to take
        visible = [e for e in envs if (project := directory.project_by_id(e.project_id)) is not None
                   and (role := directory.role_of(caller.username, project)) is not None and role >= Role.REPORTER]
        return self._page(request, sorted(visible, key=lambda e: e.id))

    def _page(self, request: Request, envs: Sequence[EnvironmentLike]) -> Response:
        q = request.query_params
        page = _number(q.get("page"), "page", 1, 1, 10**6)
        per_page = min(_number(q.get("per_page"), "per_page", DEFAULT_PER_PAGE, 1, 10**6), MAX_PER_PAGE)  # (GitLab: at most 100)
        base = f"{request.url.scheme}://{request.headers.get('host', 'localhost')}{request.url.path}"
        query = {k: v for k, v in q.items() if k not in ("page", "per_page", "csrf_token", "private_token")}
        headers = page_headers(base, query, page, per_page, len(envs))
        return JSONResponse([gitlab_environment(e) for e in paginate(envs, page, per_page)], headers=headers)

    # ------------------------------------------------------------------ kasd's

    async def openapi_document(self, request: Request) -> Response:
        return JSONResponse(openapi.document())

    async def agents(self, request: Request) -> Response:
        visible = self._visible_agents(request)
        connections = await self._agents.connections([agent.id for agent in visible])
        return JSONResponse([{"id": agent.id, "name": agent.name, "config_project": agent.config_project,
                              "connections": [dict(c) for c in connections.get(agent.id, ())]} for agent in visible])

    async def agent_cluster(self, request: Request) -> Response:
        """The agent's latest cluster report per pod, for whoever ``agents`` shows it to (else 404)."""
        agent_id = request.path_params["agent_id"]
        agent = next((a for a in self._visible_agents(request) if a.id == agent_id), None)
        if agent is None:
            raise ApiRefusal(404, "404 Agent Not Found")
        reports = await self._agents.cluster(agent.id)
        return JSONResponse({"id": agent.id, "name": agent.name, "pods": [dict(r) for r in reports]})

    def _visible_agents(self, request: Request) -> list[Any]:
        """The agents the caller may see: Developer+ on the agent's configuration project (GitLab's
        role to view agents: a Reporter does not see their pods, nodes and RBAC), or a viewer of it
        (user_access)."""
        snapshot, caller = self._caller(request)
        directory = snapshot.directory
        visible = []
        for agent in directory.agents:
            config_project = directory.project(agent.config_project)
            role = directory.role_of(caller.username, config_project) if config_project is not None else None
            if role is None or role < Role.DEVELOPER:
                try:
                    viewer_for(snapshot, caller, agent.id)
                except ApiRefusal:
                    continue
            visible.append(agent)
        return visible

    async def environment(self, request: Request) -> Response:
        snapshot, caller, env = await self._environment(request)
        viewer = self._viewer(request, snapshot, caller, env)
        view = await self._env_snapshot(env, viewer)
        graph = self._graph_of(view.objects, labels_of(env))
        return JSONResponse({"environment": kasd_environment(env), "health": graph.get("health")})

    async def resources(self, request: Request) -> Response:
        snapshot, caller, env = await self._environment(request)
        viewer = self._viewer(request, snapshot, caller, env)
        view = await self._env_snapshot(env, viewer)
        return JSONResponse({"environment": kasd_environment(env), "graph": self._graph_of(view.objects, labels_of(env)),
                             "problems": [kasd_problem(p) for p in view.problems], "hint": view.hint})

    async def watch(self, request: Request) -> Response:
        snapshot, caller, env = await self._environment(request)
        viewer = self._viewer(request, snapshot, caller, env)
        return graph_events(lambda: self._opened(self._views.watch(env, viewer), caller),
                            lambda objects: self._graph_of(objects, labels_of(env)),
                            shared=(self._graphs, (env.id, viewer.agent_id, viewer.key)),
                            shown=(*self._agent_errors, ViewerTooSlow))

    async def deployments(self, request: Request) -> Response:
        _, _, env = await self._environment(request)
        limit = _number(request.query_params.get("limit"), "limit", 50, 1, 500)
        return JSONResponse([kasd_deployment(d) for d in await self._store.deployments(env.id, limit)])

    async def _in_graph(self, request: Request, env: EnvironmentLike, viewer: Viewer, group: str, kind: str,
                        namespace: str, name: str) -> Mapping[str, Any]:
        """The object of the environment's graph with that identity, or 404."""
        wanted = f"{group}/{kind}/{namespace}/{name}"
        view = await self._env_snapshot(env, viewer)
        for obj in view.objects:
            if node_id(obj) == wanted:
                return obj
        raise ApiRefusal(404, f"404 Not Found: {wanted} is not an object of this environment")

    async def _object_of(self, request: Request) -> tuple[Viewer, Mapping[str, Any], str, str]:
        snapshot, caller, env = await self._environment(request)
        p = request.path_params
        group, version, kind, namespace, name = _identity(p["group"], p["version"], p["kind"], p["namespace"],
                                                          p["name"])
        viewer = self._viewer(request, snapshot, caller, env)
        obj = await self._in_graph(request, env, viewer, group, kind, namespace, name)
        return viewer, obj, object_path(group, version, kind, namespace, name), namespace

    async def object(self, request: Request) -> Response:
        viewer, _, target, _ = await self._object_of(request)
        answer = await self._agent_request(viewer, "GET", target)
        obj = json.loads(json.dumps(answer.body))  # (a plain copy to trim)
        if isinstance(obj.get("metadata"), dict):
            obj["metadata"].pop("managedFields", None)
        if "application/yaml" in request.headers.get("accept", ""):
            # keys sorted, as `kubectl get -o yaml` shows an object (apiVersion, kind, metadata, spec,
            # status), whatever order the API server sent them in
            try:
                text = yaml.safe_dump(obj, sort_keys=True)
            except RecursionError:  # an object nested deeper than the dumper's stack (the tenant's to write)
                raise ApiRefusal(502, "502 Bad Gateway: the object is nested too deeply to show as YAML; "
                                      "ask for it as JSON") from None
            return Response(text, media_type="application/yaml")
        return JSONResponse(obj)

    async def events(self, request: Request) -> Response:
        viewer, obj, _, namespace = await self._object_of(request)
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        where = f"/api/v1/namespaces/{quote(namespace, safe='')}/events" if namespace else "/api/v1/events"
        answer = await self._agent_request(viewer, "GET", f"{where}?fieldSelector={quote('involvedObject.uid=' + uid)}")
        items = answer.body.get("items") or []
        events = [{"type": e.get("type"), "reason": e.get("reason"), "message": e.get("message"),
                   "count": e.get("count"), "first_timestamp": e.get("firstTimestamp") or e.get("eventTime"),
                   "last_timestamp": e.get("lastTimestamp") or e.get("eventTime"),
                   "source": (e.get("source") or {}).get("component") or e.get("reportingComponent")}
                  for e in items if isinstance(e, dict)]
        events.sort(key=lambda e: str(e["last_timestamp"] or ""))
        return JSONResponse({"events": events})

    async def pod_log(self, request: Request) -> Response:
        snapshot, caller, env = await self._environment(request)
        namespace, name = _name(request.path_params["namespace"], "namespace"), _name(request.path_params["name"], "name")
        viewer = self._viewer(request, snapshot, caller, env)
        await self._in_graph(request, env, viewer, "", "Pod", namespace, name)
        q = request.query_params
        params = []
        if (container := q.get("container")) is not None:
            params.append(("container", _name(container, "container")))
        follow = q.get("follow", "false")
        if follow not in ("true", "false"):
            raise ApiRefusal(400, "400 Bad Request: follow must be true or false")
        if follow == "true":
            params.append(("follow", "true"))
        if q.get("tailLines") is not None:
            params.append(("tailLines", str(_number(q.get("tailLines"), "tailLines", 0, 0, MAX_TAIL_LINES))))
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in params)
        target = f"/api/v1/namespaces/{namespace}/pods/{name}/log" + (f"?{query}" if query else "")
        return text_stream(lambda: self._opened(self._views.stream(viewer, target), caller), shown=self._agent_errors)

    async def delete_pod(self, request: Request) -> Response:
        snapshot, caller, env = await self._environment(request, need=Role.DEVELOPER)
        namespace, name = _name(request.path_params["namespace"], "namespace"), _name(request.path_params["name"], "name")
        viewer = self._viewer(request, snapshot, caller, env)
        await self._in_graph(request, env, viewer, "", "Pod", namespace, name)
        answer = await self._agent_request(viewer, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        return JSONResponse({"deleted": f"/Pod/{namespace}/{name}", "status": answer.status})

    async def reconcile(self, request: Request) -> Response:
        """What ``flux reconcile`` does: the ``reconcile.fluxcd.io/requestedAt`` annotation set to now
        (a merge patch); Flux's controllers reconcile an object whose annotation changed."""
        snapshot, caller, env = await self._environment(request, need=Role.DEVELOPER)
        p = request.path_params
        kind = p["kind"]
        if not _KIND.fullmatch(kind):
            raise ApiRefusal(400, "400 Bad Request: kind must be a Kubernetes kind (Kustomization, HelmRelease …)")
        namespace, name = _name(p["namespace"], "namespace"), _name(p["name"], "name")
        viewer = self._viewer(request, snapshot, caller, env)
        view = await self._env_snapshot(env, viewer)
        found = [o for o in view.objects if o.get("kind") == kind
                 and str(o.get("apiVersion", "")).rpartition("/")[0].endswith(FLUX_GROUP_SUFFIX)
                 and (o.get("metadata") or {}).get("namespace") == namespace
                 and (o.get("metadata") or {}).get("name") == name]
        if not found:
            raise ApiRefusal(404, f"404 Not Found: no Flux {kind} {namespace}/{name} in this environment")
        group, _, version = str(found[0]["apiVersion"]).rpartition("/")
        now = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        patch = {"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": now}}}
        await self._agent_request(viewer, "PATCH", object_path(group, version, kind, namespace, name), body=patch,
                                  content_type="application/merge-patch+json")
        return JSONResponse({"reconcile_requested_at": now, "object": f"{group}/{kind}/{namespace}/{name}"})

    async def _agent_request(self, viewer: Viewer, method: str, target: str, *, body: Mapping[str, Any] | None = None,
                             content_type: str = "application/json") -> AnswerLike:
        try:
            with trio.fail_after(REQUEST_LIMIT):
                answer = await self._views.request(viewer, method, target, body=body, content_type=content_type)
        except self._agent_errors as exc:
            raise self._agent_refusal(exc) from None
        except trio.TooSlowError:
            raise ApiRefusal(504, f"504 Gateway Timeout: the agent did not answer within {REQUEST_LIMIT:g} s") from None
        if not 200 <= answer.status < 300:
            message = answer.body.get("message")
            raise ApiRefusal(answer.status if answer.status in (403, 404, 409, 422) else 502,
                          f"{answer.status} from the cluster: {str(message or '')[:300]}".strip())
        return answer


def object_path(group: str, version: str, kind: str, namespace: str, name: str) -> str:
    """The API path of one object; its resource is Kubernetes' own guess from the kind
    (``UnsafeGuessKindToResource``: Ingress → ingresses, NetworkPolicy → networkpolicies)."""
    prefix = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"{prefix}{where}/{resource_of(kind)}/{name}"


def resource_of(kind: str) -> str:
    lower = kind.lower()
    if lower == "endpoints":
        return lower
    if lower.endswith("s"):
        return lower + "es"
    if lower.endswith("y") and len(lower) > 1 and lower[-2] not in "aeiou":
        return lower[:-1] + "ies"
    return lower + "s"


def _identity(group: str, version: str, kind: str, namespace: str, name: str) -> tuple[str, str, str, str, str]:
    """The path's object identity: the core group is spelled ``core`` or ``_``, no namespace ``_``
    (no API group or namespace can have those names)."""
    group = "" if group in ("core", "_") else group
    namespace = "" if namespace == "_" else namespace
    if group and not _GROUP.fullmatch(group):
        raise ApiRefusal(400, "400 Bad Request: group must be an API group (core for the core group)")
    if not _VERSION.fullmatch(version):
        raise ApiRefusal(400, "400 Bad Request: version must be an API version (v1, v1beta1 …)")
    if not _KIND.fullmatch(kind):
        raise ApiRefusal(400, "400 Bad Request: kind must be a Kubernetes kind")
    if namespace:
        _name(namespace, "namespace")
    return group, version, kind, namespace, _name(name, "name")


def _name(text: str, what: str) -> str:
    if not _NAME.fullmatch(text):
        raise ApiRefusal(400, f"400 Bad Request: {what} must be a Kubernetes name (lower-case letters, digits, '-', '.')")
    return text


def _number(text: str | None, what: str, default: int, low: int, high: int) -> int:
    if text is None or text == "":
        return default
    number = small_int(text)
    if number is None or not low <= number <= high:
        raise ApiRefusal(400, f"400 Bad Request: {what} must be a whole number from {low} to {high}")
    return number


def _state(text: str | None) -> str | None:
    if text is None or text == "":
        return None
    if text not in STATES:
        raise ApiRefusal(400, "states does not have a valid value", key="error")
    return text


def _tier(text: str | None) -> str | None:
    tiers = ("production", "staging", "testing", "development", "other")
    if text is None or text == "":
        return None
    if text not in tiers:
        raise ApiRefusal(400, "tier does not have a valid value", key="error")
    return text


def _iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _no_store(answer: Response) -> Response:
    answer.headers["cache-control"] = "no-store"
    return answer


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiRefusal)
    return JSONResponse({exc.key: exc.message}, status_code=exc.status, headers=exc.headers)


async def _store_failed(request: Request, exc: Exception) -> Response:
    return JSONResponse({"message": f"503 Service Unavailable: kasd's store failed: {str(exc)[:300]}"}, status_code=503)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    words = {404: "404 Not Found", 405: "405 Method Not Allowed"}.get(exc.status_code, f"{exc.status_code} {exc.detail}")
    return JSONResponse({"message": words}, status_code=exc.status_code, headers=exc.headers)


#: any ASGI app (RestApi's and Starlette's spell the scope types differently)
AnyAsgi = Callable[..., Awaitable[None]]


def mount(rest: RestApi, web: AnyAsgi) -> AsgiApp:
    """The API port's one app: ``rest`` for the job-token paths (unchanged), ``web`` for the rest,
    and the security headers on every answer of both."""

    async def app(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                  send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await rest(scope, receive, send)  # (lifespan: RestApi answers it)
            return

        async def send_secured(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                present = {bytes(name).lower() for name, _ in message.get("headers", ())}
                extra = [(name, value) for name, value in SECURITY_HEADERS if name not in present]
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        await (rest if rest.serves(scope) else web)(scope, receive, send_secured)

    return app
