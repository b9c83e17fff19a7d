"""What the web app consumes, as narrow Protocols: kasd's store (environments and deployments,
``kasd.store``), the live views (``kasd.environments.EnvironmentViews``), the connected agents, and
the graph (``kasd.envgraph``). The real ones are plugged in by ``kasd.server``; tests give fakes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol


class DeploymentLike(Protocol):
    @property
    def job_id(self) -> int: ...
    @property
    def pipeline_id(self) -> int: ...
    @property
    def ref(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def agent_id(self) -> int: ...
    @property
    def namespaces(self) -> tuple[str, ...]: ...
    @property
    def at(self) -> float: ...


class EnvironmentLike(Protocol):
    """``kasd.store.deployments.Environment``."""

    @property
    def id(self) -> int: ...
    @property
    def project_id(self) -> int: ...
    @property
    def project(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def slug(self) -> str: ...
    @property
    def tier(self) -> str | None: ...
    @property
    def state(self) -> str: ...
    @property
    def agents(self) -> tuple[int, ...]: ...
    @property
    def namespaces(self) -> tuple[str, ...]: ...
    @property
    def created_at(self) -> float: ...
    @property
    def updated_at(self) -> float: ...
    @property
    def stopped_at(self) -> float | None: ...
    @property
    def last_deployment(self) -> DeploymentLike | None: ...


class EnvironmentStore(Protocol):
    """The part of ``kasd.store``'s ``Store`` the web app reads."""

    async def environments(self, *, project_id: int | None = None, project_prefix: str | None = None,
                           tier: str | None = None, state: str | None = None) -> Sequence[EnvironmentLike]: ...

    async def environment(self, env_id: int) -> EnvironmentLike | None: ...

    async def deployments(self, env_id: int, limit: int = 50) -> Sequence[DeploymentLike]: ...


class KindProblemLike(Protocol):
    @property
    def group(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def message(self) -> str: ...


class SnapshotLike(Protocol):
    @property
    def objects(self) -> tuple[Mapping[str, Any], ...]: ...
    @property
    def problems(self) -> tuple[KindProblemLike, ...]: ...
    @property
    def hint(self) -> str | None: ...


class UpdateLike(Protocol):
    @property
    def type(self) -> str: ...
    @property
    def object(self) -> Mapping[str, Any] | None: ...
    @property
    def snapshot(self) -> SnapshotLike | None: ...


class AnswerLike(Protocol):
    """What the agent's API server answered to one request (``kasd.agentclient.Answer``)."""

    @property
    def status(self) -> int: ...
    #: the answer as JSON when it was a JSON object, else empty
    @property
    def body(self) -> Mapping[str, Any]: ...


class Views(Protocol):
    """``kasd.environments.EnvironmentViews``. A watch's iterator ends with ``ViewerTooSlow`` (any
    exception: the SSE stream says why and ends). When the agent cannot be asked, its methods raise
    ``kasd.agentclient.AgentRequestError`` (``status``, ``message``): ``WebApp(agent_errors=…)``
    names that class, and its answers become the caller's (``502``, ``504``, …)."""

    async def snapshot(self, env: Any, viewer: Any) -> SnapshotLike: ...

    def watch(self, env: Any, viewer: Any) -> AbstractAsyncContextManager[AsyncIterator[UpdateLike]]: ...

    async def request(self, viewer: Any, method: str, target: str, *, body: Mapping[str, Any] | None = None,
                      accept: str = "application/json", content_type: str = "application/json") -> AnswerLike: ...

    def stream(self, viewer: Any, target: str) -> AbstractAsyncContextManager[AsyncIterator[bytes]]: ...


class ConnectedAgents(Protocol):
    """The tunnels of ``agent_ids`` now: agent id → its connections (``{pod, pod_uid, pod_namespace,
    node, namespaces, version, since, replica}``), every replica's (their records in the store); a
    replica the directory names without records, with only ``replica`` known (the others null)."""

    async def connections(self, agent_ids: Sequence[int]) -> Mapping[int, Sequence[Mapping[str, Any]]]: ...

    async def cluster(self, agent_id: int) -> Sequence[Mapping[str, Any]]:
        """The agent's latest cluster report per pod (``{pod, pod_uid, replica, received_at, report}``)."""
        ...


#: ``kasd.envgraph.build_graph(objects, selector=…).to_json()``: the selector is the environment's
#: labels (which nodes are ``labelled``)
GraphOf = Callable[[Iterable[Mapping[str, Any]], Mapping[str, str]], dict[str, Any]]


def envgraph_json(objects: Iterable[Mapping[str, Any]], selector: Mapping[str, str]) -> dict[str, Any]:
    """The graph of ``objects`` as ``kasd.envgraph`` builds it (part A of issue 27)."""
    from kasd import envgraph  # type: ignore[attr-defined,unused-ignore]  # (merged by the lead)

    result: dict[str, Any] = envgraph.build_graph(objects, selector=selector).to_json()
    return result


def labels_of(env: EnvironmentLike) -> dict[str, str]:
    """The labels GitLab's dashboard selects an environment's objects by."""
    return {"app.gitlab.com/project_id": str(env.project_id), "app.gitlab.com/environment_slug": env.slug}

