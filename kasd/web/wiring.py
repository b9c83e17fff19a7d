"""What ``kasd.server`` needs to put the web app on the API port: the connected agents from the
tunnel registry, the session key and settings from kasd's configuration, and the one app."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import trio
from starlette.routing import BaseRoute

from kasd.asgiport import AsgiApp
from kasd.authz.snapshot import Snapshot
from kasd.config import Config
from kasd.discovery import AgentPods
from kasd.restapi import RestApi
from kasd.web.app import WebApp, WebSettings, mount
from kasd.web.seams import EnvironmentStore, Views
from kasd.web.session import session_key
from routing.local import TunnelRegistry

if TYPE_CHECKING:  # (routing.directory pulls in coredis: only a kasd with routing.redis.url loads it)
    from routing.directory import TunnelDirectory


class RegistryAgents:
    """The agents connected to this replica (``routing.local.TunnelRegistry``); ``replica`` names it.
    ``pods`` (``kasd.discovery.AgentPods``): every replica's tunnels with their pod details (each
    replica's records in the store: Redis among replicas) and the agents' cluster reports. Among
    replicas, ``directory`` (the tunnel directory in Redis) adds any other replica holding an agent's
    tunnels whose records are missing (its records not written yet, say): one connection with only
    ``replica`` known (the rest null)."""

    def __init__(self, registry: TunnelRegistry, replica: str, directory: TunnelDirectory | None = None,
                 pods: AgentPods | None = None) -> None:
        self._registry = registry
        self._replica = replica
        self._directory = directory
        self._pods = pods

    async def connections(self, agent_ids: Sequence[int]) -> Mapping[int, Sequence[Mapping[str, Any]]]:
        wanted = set(agent_ids)
        out: dict[int, list[Mapping[str, Any]]] = {}
        if self._pods is not None:
            for agent_id, found in (await self._pods.connections(sorted(wanted))).items():
                out[agent_id] = list(found)
        else:
            offset = time.time() - trio.current_time()  # connected_at is Trio's clock
            for tunnel in self._registry.tunnels():
                if tunnel.agent_id not in wanted:
                    continue
                since = datetime.fromtimestamp(tunnel.connected_at + offset, UTC).isoformat(timespec="seconds")
                out.setdefault(tunnel.agent_id, []).append({
                    "pod": tunnel.pod_name, "pod_uid": tunnel.pod_uid, "pod_namespace": tunnel.pod_namespace,
                    "node": tunnel.node_name, "namespaces": list(tunnel.namespaces), "version": tunnel.version,
                    "since": since.replace("+00:00", "Z"), "replica": self._replica})
        if self._directory is not None:
            # (the directory's answers are cached, each read bounded; Redis away: no others)
            for agent_id in sorted(wanted):
                listed = {c.get("replica") for c in out.get(agent_id, ())}
                for name in sorted(await self._directory.holders(agent_id)):
                    if name not in listed:
                        out.setdefault(agent_id, []).append(
                            {"pod": None, "pod_uid": None, "pod_namespace": None, "node": None,
                             "namespaces": None, "version": None, "since": None, "replica": name})
        return out

    async def cluster(self, agent_id: int) -> Sequence[Mapping[str, Any]]:
        """The agent's latest cluster report per pod (``StoreError``)."""
        return await self._pods.reports(agent_id) if self._pods is not None else []


def web_settings(config: Config) -> WebSettings:
    return WebSettings(cors_origins=config.web.cors_origins, tls=config.listeners.api.tls is not None)


def api_app(rest: RestApi, config: Config, snapshot: Callable[[], Snapshot], store: EnvironmentStore, views: Views,
            registry: TunnelRegistry, replica: str, *, agent_errors: tuple[type[Exception], ...] = (),
            extra_routes: Sequence[BaseRoute] = (), directory: TunnelDirectory | None = None,
            pods: AgentPods | None = None) -> AsgiApp:
    """The API port's one app: ``rest`` (job tokens) and the web app. The session key is shared by
    every replica when they share a peer secret (``routing.peer_secret_file``); else random.
    ``agent_errors``: ``(kasd.agentclient.AgentRequestError,)``; ``extra_routes``: the dashboard's
    (``kasd.web.dashboard.dashboard_routes()``); ``directory``: among replicas, the tunnel directory
    (``/api/kasd/v1/agents`` then names the other replicas holding an agent's tunnels)."""
    secret = config.routing.peer_secret_file
    web = WebApp(snapshot, store, views, RegistryAgents(registry, replica, directory, pods),
                 key=session_key(secret.value if secret is not None else None), settings=web_settings(config),
                 agent_errors=agent_errors, extra_routes=extra_routes)
    return mount(rest, web)
