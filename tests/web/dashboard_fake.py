"""A fake kasd web API for the dashboard's browser tests: the contract's JSON paths, the session
cookie with its CSRF check, SSE and streamed pod logs (docs/environments.md, /work/notes/ENV_CONTRACT.md),
with canned environments a test changes while the browser watches. It serves the real dashboard
(``kasd.web.dashboard.dashboard_routes``) beside them, so only the API is fake.

It runs on trio (hypercorn) in a thread of its own, because playwright's sync API owns the test's
thread; a test changes it with ``FakeKasd.call`` (``trio.from_thread``)."""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from kasd.web.dashboard import dashboard_routes

TOKEN = "kasd-pat-fake-good"
PROJECT = "group/app"
REFUSAL = ("403 Forbidden: user alice is not allowed to access agent 7's user_access: no group or project "
           "of the agent's configuration grants access")


def node(group: str, kind: str, namespace: str, name: str, status: str, message: str = "") -> dict[str, Any]:
    return {"id": f"{group}/{kind}/{namespace}/{name}", "group": group, "version": "v1", "kind": kind,
            "namespace": namespace, "name": name, "uid": f"uid-{name}", "labelled": kind in ("Deployment", "Service"),
            "created": "2026-11-27T10:00:00Z", "health": {"status": status, "message": message}}


def hello_graph(status: str = "Progressing", pods: tuple[str, ...] = ("hello-7d9-abc", "hello-7d9-def")) -> dict[str, Any]:
    """The demo's hello app: a Deployment (its ReplicaSet and pods), a Service selecting the pods, a
    ConfigMap they mount, and a Flux Kustomization that applied it all."""
    message = "" if status == "Healthy" else "Waiting for rollout to finish: 1 of 2 updated replicas are available..."
    nodes = [
        node("apps", "Deployment", "prod", "hello", status, message),
        node("apps", "ReplicaSet", "prod", "hello-7d9", "Healthy"),
        *(node("", "Pod", "prod", p, "Healthy" if status == "Healthy" or i == 0 else "Progressing")
          for i, p in enumerate(pods)),
        node("", "Service", "prod", "hello", "Healthy"),
        node("", "ConfigMap", "prod", "hello-config", "Healthy"),
        node("kustomize.toolkit.fluxcd.io", "Kustomization", "prod", "hello", "Healthy"),
    ]
    nodes[-1]["version"] = "v1"
    edges = [
        {"source": "apps/Deployment/prod/hello", "target": "apps/ReplicaSet/prod/hello-7d9", "relation": "owns"},
        *({"source": "apps/ReplicaSet/prod/hello-7d9", "target": f"/Pod/prod/{p}", "relation": "owns"} for p in pods),
        *({"source": "/Service/prod/hello", "target": f"/Pod/prod/{p}", "relation": "selects"} for p in pods),
        *({"source": f"/Pod/prod/{p}", "target": "/ConfigMap/prod/hello-config", "relation": "uses"} for p in pods),
    ]
    return {
        "health": {"status": status, "message": f"apps/Deployment/prod/hello: {message}" if message else ""},
        "nodes": sorted(nodes, key=lambda n: n["id"]),
        "edges": sorted(edges, key=lambda e: (e["source"], e["target"], e["relation"])),
        "roots": sorted(["apps/Deployment/prod/hello", "/Service/prod/hello", "/ConfigMap/prod/hello-config",
                         "kustomize.toolkit.fluxcd.io/Kustomization/prod/hello"]),
    }


def environment(env_id: int, name: str, tier: str) -> dict[str, Any]:
    return {"id": env_id, "name": name, "slug": name, "external_url": None, "state": "available", "tier": tier,
            "created_at": "2026-11-27T10:00:00Z", "updated_at": "2026-11-27T10:00:00Z",
            "project": {"id": 42, "path_with_namespace": PROJECT}}


class FakeKasd:
    """The fake's state. Everything but ``call`` runs in the server's trio thread."""

    def __init__(self) -> None:
        self.session = secrets.token_urlsafe(16)
        self.csrf = secrets.token_urlsafe(16)
        self.environments = {1: environment(1, "production", "production"), 2: environment(2, "secret", "production"),
                             3: environment(3, "review/feat-x", "development")}
        self.refused = {2}          # environments whose resources user_access refuses
        self.graphs: dict[int, dict[str, Any]] = {1: hello_graph()}
        self.watchers: dict[int, set[trio.MemorySendChannel[str]]] = {1: set()}
        self.log_lines: list[str] = ["line 1: starting", "line 2: listening on :8080"]
        self.log_watchers: set[trio.MemorySendChannel[str]] = set()
        self.seen: list[tuple[str, str, dict[str, str]]] = []   # (method, path, headers) of state changes
        self.watch_status: int | None = None   # when set, the watch path answers this error
        self.url = ""
        self._token: trio.lowlevel.TrioToken | None = None
        self._cancel: trio.CancelScope | None = None

    # ---- what a test calls (from its own thread) ----

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def set_graph(self, env_id: int, graph: dict[str, Any]) -> None:
        """Change an environment's graph and push it to every watcher, as kasd does on a change."""
        self.graphs[env_id] = graph
        for send in list(self.watchers[env_id]):
            try:
                send.send_nowait(json.dumps(graph))
            except (trio.WouldBlock, trio.BrokenResourceError):
                self.watchers[env_id].discard(send)

    def break_watch(self, status: int) -> None:
        """End every watch stream, and answer new ones with ``status``: kasd restarting, say."""
        self.watch_status = status
        for watchers in self.watchers.values():
            for send in watchers:
                send.close()
            watchers.clear()

    def end_watch(self, message: str) -> None:
        """End every watch stream as kasd does when it drops a viewer: an ``end`` event, then the end."""
        for watchers in self.watchers.values():
            for send in watchers:
                try:
                    send.send_nowait(json.dumps({"end": message}))
                except (trio.WouldBlock, trio.BrokenResourceError):
                    pass
                send.close()
            watchers.clear()

    def mend_watch(self) -> None:
        self.watch_status = None

    def log(self, line: str) -> None:
        self.log_lines.append(line)
        for send in list(self.log_watchers):
            try:
                send.send_nowait(line)
            except (trio.WouldBlock, trio.BrokenResourceError):
                self.log_watchers.discard(send)

    # ---- the app ----

    def _person(self, request: Request) -> bool:
        return (request.cookies.get("_kasd_session") == self.session
                or request.headers.get("private-token") == TOKEN)

    def app(self) -> Starlette:
        def guarded(handler: Callable[..., Any]) -> Callable[[Request], Any]:
            async def endpoint(request: Request) -> Response:
                if not self._person(request):
                    return JSONResponse({"message": "401 Unauthorized"}, 401)
                if request.method not in ("GET", "HEAD"):
                    self.seen.append((request.method, request.url.path, dict(request.headers)))
                    cookie_auth = request.headers.get("private-token") != TOKEN
                    if cookie_auth and request.headers.get("x-csrf-token") != self.csrf:
                        return JSONResponse({"message": "403 Forbidden: missing or wrong CSRF token"}, 403)
                env_id = request.path_params.get("env")
                if env_id is not None:
                    if env_id not in self.environments:
                        return JSONResponse({"message": "404 Environment Not Found"}, 404)
                    if env_id in self.refused and handler is not env_summary:
                        return JSONResponse({"message": REFUSAL}, 403)
                result: Response = await handler(request)
                return result
            return endpoint

        async def sign_in(request: Request) -> Response:
            body = await request.json()
            if body.get("token") != TOKEN:
                return JSONResponse({"message": "401 Unauthorized: the token is not a valid personal access token"}, 401)
            response = JSONResponse({"csrf_token": self.csrf})
            response.set_cookie("_kasd_session", self.session, httponly=True, samesite="strict", path="/")
            return response

        async def sign_out(request: Request) -> Response:
            response = JSONResponse({})
            response.delete_cookie("_kasd_session", path="/")
            return response

        async def agents(request: Request) -> Response:
            return JSONResponse([{"id": 7, "name": "prod-agent", "config_project": PROJECT, "connections": [
                {"pod": "agentd-5f7c9-x2x9q", "version": "0.1.0", "since": "2026-11-27T09:58:00Z", "replica": "kasd-0",
                 "pod_uid": "u-1", "pod_namespace": "gitlab-agent", "node": "node-a", "namespaces": []}]}])

        async def agent_cluster(request: Request) -> Response:
            if request.path_params["agent"] != "7":
                return JSONResponse({"message": "404 Agent Not Found"}, 404)
            return JSONResponse({"id": 7, "name": "prod-agent", "pods": [{
                "pod": "agentd-5f7c9-x2x9q", "pod_uid": "u-1", "replica": "kasd-0", "received_at": "2026-11-27T09:58:01Z",
                "report": {"observed_at": "2026-11-27T09:58:01Z",
                           "server": {"gitVersion": "v1.32.0", "platform": "linux/amd64"}, "nodes": 3,
                           "api_groups": ["apps", "source.toolkit.fluxcd.io"],
                           "crds": ["gitrepositories.source.toolkit.fluxcd.io"],
                           "components": [{"name": "Flux", "evidence": ["source.toolkit.fluxcd.io"]}],
                           "rbac": [], "errors": []}}]})

        async def project_envs(request: Request) -> Response:
            if request.path_params["project"] != PROJECT:
                return JSONResponse({"message": "404 Project Not Found"}, 404)
            return JSONResponse(list(self.environments.values()))

        async def group_envs(request: Request) -> Response:
            if not PROJECT.startswith(request.path_params["group"] + "/"):
                return JSONResponse({"message": "404 Group Not Found"}, 404)
            tier = request.query_params.get("tier")
            return JSONResponse([e for e in self.environments.values() if tier in (None, e["tier"])])

        async def env_summary(request: Request) -> Response:
            env_id = request.path_params["env"]
            graph = self.graphs.get(env_id)
            health = graph["health"] if graph else {"status": "Unknown", "message": "not visible to you"}
            return JSONResponse({"environment": self.environments[env_id], "health": health})

        async def resources(request: Request) -> Response:
            env_id = request.path_params["env"]
            return JSONResponse({"environment": self.environments[env_id], "graph": self.graphs[env_id],
                                 "problems": [], "hint": None})

        async def watch(request: Request) -> Response:
            env_id = request.path_params["env"]
            if self.watch_status is not None:
                return JSONResponse({"message": "503 Service Unavailable"}, self.watch_status)
            send, receive = trio.open_memory_channel[str](16)
            self.watchers[env_id].add(send)

            async def events() -> AsyncIterator[str]:
                try:
                    # a quick retry after a stream ends, so a test need not wait the browser's 3 s
                    yield f"retry: 200\nevent: graph\ndata: {json.dumps(self.graphs[env_id])}\n\n"
                    async for graph in receive:
                        if graph.startswith('{"end"'):
                            yield f"event: end\ndata: {json.dumps({'message': json.loads(graph)['end']})}\n\n"
                            return
                        yield f"event: graph\ndata: {graph}\n\n"
                finally:
                    self.watchers[env_id].discard(send)

            return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

        async def deployments(request: Request) -> Response:
            return JSONResponse([{"project": PROJECT, "environment": "production", "agent_id": 7, "namespaces": ["prod"],
                                  "job_id": 301, "pipeline_id": 77, "ref": "main", "user": "alice", "at": 1795773600.0}])

        async def obj(request: Request) -> Response:
            p = request.path_params
            if "yaml" in request.headers.get("accept", ""):
                return PlainTextResponse(f"apiVersion: v1\nkind: {p['kind']}\nmetadata:\n  name: {p['name']}\n"
                                         f"  namespace: {p['namespace']}\n", media_type="application/yaml")
            return JSONResponse({"apiVersion": "v1", "kind": p["kind"], "metadata": {"name": p["name"]},
                                 "spec": {"containers": [{"name": "hello"}]}})

        async def events(request: Request) -> Response:
            return JSONResponse({"events": [{"type": "Normal", "reason": "Pulled", "count": 1,  # kasd's shape
                                             "message": "<b>Container image</b> already present",
                                             "first_timestamp": "2026-11-27T10:00:01Z",
                                             "last_timestamp": "2026-11-27T10:00:01Z", "source": "kubelet"}]})

        async def pod_log(request: Request) -> Response:
            send, receive = trio.open_memory_channel[str](64)
            self.log_watchers.add(send)

            async def lines() -> AsyncIterator[str]:
                try:
                    for line in self.log_lines:
                        yield line + "\n"
                    async for line in receive:
                        yield line + "\n"
                finally:
                    self.log_watchers.discard(send)

            return StreamingResponse(lines(), media_type="text/plain; charset=utf-8")

        async def delete_pod(request: Request) -> Response:
            name = request.path_params["name"]
            graph = self.graphs[request.path_params["env"]]
            pods = tuple(n["name"] for n in graph["nodes"] if n["kind"] == "Pod" and n["name"] != name)
            self.set_graph(1, hello_graph(graph["health"]["status"], (*pods, "hello-7d9-new")))
            return JSONResponse({"kind": "Status", "status": "Success"})

        async def reconcile(request: Request) -> Response:
            return JSONResponse({"requestedAt": "2026-11-27T10:00:02Z"})

        base = "/api/kasd/v1/environments/{env:int}"
        routes = [
            Route("/-/sign_in", sign_in, methods=["POST"]),
            Route("/-/sign_out", guarded(sign_out), methods=["POST"]),
            Route("/api/kasd/v1/agents", guarded(agents)),
            Route("/api/kasd/v1/agents/{agent}/cluster", guarded(agent_cluster)),
            Route("/api/v4/projects/{project:path}/environments", guarded(project_envs)),
            Route("/api/v4/groups/{group:path}/environments", guarded(group_envs)),
            Route(base, guarded(env_summary)),
            Route(f"{base}/resources", guarded(resources)),
            Route(f"{base}/resources/watch", guarded(watch)),
            Route(f"{base}/deployments", guarded(deployments)),
            Route(base + "/objects/{group}/{version}/{kind}/{namespace}/{name}/events", guarded(events)),
            Route(base + "/objects/{group}/{version}/{kind}/{namespace}/{name}", guarded(obj)),
            Route(base + "/pods/{namespace}/{name}/log", guarded(pod_log)),
            Route(base + "/pods/{namespace}/{name}", guarded(delete_pod), methods=["DELETE"]),
            Route(base + "/flux/{kind}/{namespace}/{name}/reconcile", guarded(reconcile), methods=["POST"]),
            *dashboard_routes(),
        ]
        return Starlette(routes=routes)

    # ---- lifetime ----

    def start(self) -> None:
        started = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            config = Config()
            config.bind = ["127.0.0.1:0"]
            config.accesslog = None
            config.errorlog = None
            config.graceful_timeout = 0.1
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as self._cancel:
                async with trio.open_nursery() as nursery:
                    binds = await nursery.start(serve, self.app(), config)
                    self.url = binds[0]
                    started.set()

        def run() -> None:
            try:
                trio.run(main)
            except BaseException as exc:  # the test hears of it, not a thread's stderr
                failure.append(exc)
                started.set()

        self._thread = threading.Thread(target=run, name="fake-kasd", daemon=True)
        self._thread.start()
        if not started.wait(10) or failure:
            raise RuntimeError(f"the fake kasd did not start: {failure}")

    def stop(self) -> None:
        if self._cancel is not None:
            self.call(self._cancel.cancel)
        self._thread.join(10)
