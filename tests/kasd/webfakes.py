"""Fakes for the web app's seams (``kasd.web.seams``): the store's environments, the live views, the
connected agents and the graph, with canned objects; and a tiny in-process ASGI caller on trio."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from kasd.authority import load_authorization
from kasd.authz.snapshot import Snapshot
from kasd.environments.values import KindProblem
from tests.kasd.helpers import AUTH, DIRECTORY, make_config

# alice: Developer in group/app (agent 1's user_access lets her in); bob: Reporter (sees the
# environments, not their resources); carol: no membership in group/app; dave: Guest
USERS = [{"username": "alice", "memberships": {"group/app": "developer"}},
         {"username": "bob", "memberships": {"group/app": "reporter"}},
         {"username": "carol", "memberships": {"group/infra": "reporter"}},
         {"username": "dave", "memberships": {"group/app": "guest"}}]
TOKENS = {u["username"]: AUTH.personal_token(str(u["username"])) for u in USERS}


def snapshot() -> Snapshot:
    return load_authorization(make_config({**DIRECTORY, "users": USERS}), None).snapshot


@attrs.frozen(kw_only=True)
class Deployment:
    project_id: int = 42
    project: str = "group/app"
    environment: str = "production"
    slug: str = "production"
    tier: str | None = "production"
    agent_id: int = 1
    namespaces: tuple[str, ...] = ("prod",)
    job_id: int = 7
    pipeline_id: int = 1
    ref: str = "main"
    user: str = "alice"
    at: float = 1_780_000_000.0


@attrs.frozen(kw_only=True)
class Environment:
    id: int
    project_id: int = 42
    project: str = "group/app"
    name: str
    slug: str
    tier: str | None = None
    state: str = "available"
    agents: tuple[int, ...] = (1,)
    namespaces: tuple[str, ...] = ("prod",)
    created_at: float = 1_780_000_000.0
    updated_at: float = 1_780_000_100.0
    stopped_at: float | None = None
    last_deployment: Deployment | None = Deployment()


ENVIRONMENTS = [Environment(id=1, name="production", slug="production", tier="production"),
                Environment(id=2, name="review/feat-x", slug="review-feat-x", tier="development",
                            namespaces=("review-feat-x",)),
                Environment(id=3, name="review/old", slug="review-old", state="stopped", stopped_at=1_780_000_200.0),
                Environment(id=9, project_id=1, project="group/infra", name="ops", slug="ops")]


class FakeStore:
    def __init__(self, environments: Sequence[Environment] = ENVIRONMENTS) -> None:
        self.envs = list(environments)

    async def environments(self, *, project_id: int | None = None, project_prefix: str | None = None,
                           tier: str | None = None, state: str | None = None) -> list[Environment]:
        await trio.lowlevel.checkpoint()
        return [e for e in self.envs if (project_id is None or e.project_id == project_id)
                and (project_prefix is None or e.project.startswith(project_prefix))
                and (tier is None or e.tier == tier) and (state is None or e.state == state)]

    async def environment(self, env_id: int) -> Environment | None:
        await trio.lowlevel.checkpoint()
        if not -(2**63) <= env_id < 2**63:  # as SQLite's INTEGER
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        return next((e for e in self.envs if e.id == env_id), None)

    async def deployments(self, env_id: int, limit: int = 50) -> list[Deployment]:
        await trio.lowlevel.checkpoint()
        return [Deployment(job_id=8, at=1_780_000_050.0), Deployment()][:limit]


def pod(name: str, phase: str = "Running") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "prod", "name": name, "uid": f"uid-{name}"},
            "status": {"phase": phase}}


DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment",
              "metadata": {"namespace": "prod", "name": "hello", "uid": "uid-d"}}
KUSTOMIZATION = {"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
                 "metadata": {"namespace": "prod", "name": "apps", "uid": "uid-k"}}


@attrs.frozen
class Snap:
    objects: tuple[Mapping[str, Any], ...]
    problems: tuple[KindProblem, ...] = ()
    hint: str | None = None


@attrs.frozen
class Update:
    type: str
    object: Mapping[str, Any] | None = None
    snapshot: Snap | None = None


@attrs.frozen
class Answer:
    status: int
    body: Mapping[str, Any]


class AgentRequestError(Exception):
    """(``kasd.agentclient.AgentRequestError``)"""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class FakeViews:
    def __init__(self) -> None:
        self.objects: list[Mapping[str, Any]] = [DEPLOYMENT, pod("hello-1"), KUSTOMIZATION]
        self.requests: list[tuple[Any, str, str, Any]] = []
        #: a snapshot the agent cannot answer
        self.unreachable = False
        #: a log stream the agent refuses as it opens
        self.log_refused = False
        self.viewers: list[Any] = []
        #: what a watch yields after its RESYNC; the test sends, closing it ends the watch
        self.updates_in, self.updates_out = trio.open_memory_channel[Any](10)
        self.watch_closed = trio.Event()
        self.log_closed = trio.Event()

    async def snapshot(self, env: Any, viewer: Any) -> Snap:
        self.viewers.append(viewer)
        await trio.lowlevel.checkpoint()
        if self.unreachable:
            raise AgentRequestError(503, "agent 1 is not connected")
        return Snap(tuple(self.objects), (KindProblem("", "v1", "Secret", "prod", "forbidden", "no"),), None)

    @asynccontextmanager
    async def watch(self, env: Any, viewer: Any) -> AsyncIterator[AsyncIterator[Update]]:
        self.viewers.append(viewer)

        async def updates() -> AsyncIterator[Update]:
            yield Update("RESYNC", snapshot=Snap(tuple(self.objects)))
            async for item in self.updates_out:
                if isinstance(item, Exception):
                    raise item
                yield item

        try:
            yield updates()
        finally:
            self.watch_closed.set()

    async def request(self, viewer: Any, method: str, target: str, *, body: Mapping[str, Any] | None = None,
                      accept: str = "application/json", content_type: str = "application/json") -> Answer:
        self.requests.append((viewer, method, target, (body, content_type)))
        await trio.lowlevel.checkpoint()
        if method == "GET" and "/events" in target:
            return Answer(200, {"items": [{"type": "Warning", "reason": "BackOff", "message": "m", "count": 2,
                                           "lastTimestamp": "2026-01-01T00:00:00Z"}]})
        if method == "GET":
            # (kubesim's key order: apiVersion and kind last)
            return Answer(200, {"metadata": {**pod("hello-1")["metadata"], "managedFields": [{}]},
                                "status": {"phase": "Running"}, "apiVersion": "v1", "kind": "Pod"})
        return Answer(200, {})

    @asynccontextmanager
    async def stream(self, viewer: Any, target: str) -> AsyncIterator[AsyncIterator[bytes]]:
        self.requests.append((viewer, "STREAM", target, None))
        if self.log_refused:
            raise AgentRequestError(404, "container not found")

        async def chunks() -> AsyncIterator[bytes]:
            yield b"line 1\n"
            yield b"line 2\n"

        try:
            yield chunks()
        finally:
            self.log_closed.set()


class FakeAgents:
    async def connections(self, agent_ids: Sequence[int]) -> Mapping[int, Sequence[Mapping[str, Any]]]:
        return {1: [{"pod": "agentd-0", "version": "1.0", "since": "2026-01-01T00:00:00Z", "replica": "kasd-0"}]}

    async def cluster(self, agent_id: int) -> Sequence[Mapping[str, Any]]:
        return []


def fake_graph(objects: Iterable[Mapping[str, Any]], selector: Mapping[str, str]) -> dict[str, Any]:
    assert selector["app.gitlab.com/project_id"] == "42"
    from kasd.envgraph import node_id
    objs = list(objects)
    failed = [node_id(o) for o in objs if (o.get("status") or {}).get("phase") == "Failed"]
    pending = [node_id(o) for o in objs if (o.get("status") or {}).get("phase") == "Pending"]
    status = "Degraded" if failed else "Progressing" if pending else "Healthy" if objs else "Missing"
    return {"health": {"status": status, "message": ", ".join(failed + pending)},
            "nodes": [{"id": node_id(o)} for o in sorted(objs, key=node_id)], "edges": [],
            "roots": sorted(node_id(o) for o in objs)}


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    #: every Set-Cookie
    cookies: tuple[str, ...]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def call(app: Any, method: str, path: str, headers: Sequence[tuple[str, str]] = (), body: bytes = b"",
               client: str = "127.0.0.1") -> Reply:
    """One request to an ASGI app, in process; the client stays until the answer is whole."""
    raw_path, _, query = path.partition("?")
    from urllib.parse import unquote
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": unquote(raw_path), "raw_path": raw_path.encode(),
             "query_string": query.encode(), "root_path": "", "server": ("kasd", 80), "client": (client, 5000),
             "headers": [(b"host", b"kasd"), *((k.lower().encode(), v.encode()) for k, v in headers)]}
    sent = False
    done = trio.Event()
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    await app(scope, receive, send)
    start = messages[0]
    raw = [(bytes(k).decode().lower(), bytes(v).decode()) for k, v in start["headers"]]
    return Reply(start["status"], dict(raw), tuple(v for k, v in raw if k == "set-cookie"),
                 b"".join(m.get("body", b"") for m in messages[1:]))
