"""Which CI job deployed what where: each environment's agents, namespaces and deployment history,
kept in kasd's store (``Store.record_deployment`` and friends; ``kasd.store.sqlite``,
``kasd.store.redis``), and the ``DeploymentRecorder`` that the Kubernetes API proxy's pipeline
tells of every request a CI job with an environment makes.

A ``Deployment`` is one CI job's use of one agent for its environment: recorded at the job's first
authorized request through that agent, and again (the same record, its namespaces grown) each time
the job writes (POST/PUT/PATCH/DELETE) into a namespace not recorded for it yet. Its namespaces are
the grant's managed namespace (``kasd.managed``), if any, and every namespace the job wrote to: the
namespace of a job's kubeconfig context is not known to kasd (the job may change it), except where
it is the managed one; a ``kubectl apply`` into it names it in the path, and is recorded so.

An ``Environment`` is (project id, name): its ``agents`` and ``namespaces`` are the union over its
kept deployments, ``last_deployment`` the newest. A stopped environment (``POST
/api/v4/projects/:project/environments/:name/stop``) is marked ``stopped``, not forgotten; used
again by another job it is ``available`` again.

History is kept for ``environments.history_retention`` (default 90 days) and at most
``environments.max_deployments`` (default 100) per environment; the newest deployment of an
environment that is not stopped is always kept (it says where the environment lives), and a stopped
environment untouched for the retention is forgotten with its history. Both stores purge in their
purge loop (``kasd.store.protocol.purge_lapsed``).

The recorder never blocks or fails a request: the pipeline's calls only put a record on a bounded
queue (full: dropped, counted, a rate-limited line), which one task drains into the store; what was
recorded is remembered in memory (bounded) so a job's thousandth request costs a dict lookup.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import attrs
import trio

from daemonkit.logs import BurstLimitedLog
from kasd.authz.slugs import environment_slug
from kasd.authz.verdict import Grant
from kasd.config.store import (
    DEFAULT_HISTORY_RETENTION,
    DEFAULT_MAX_DEPLOYMENTS,
    EnvironmentSettings,
)
from kasd.store.errors import StoreError

log = logging.getLogger("kasd.store.deployments")

#: namespaces one deployment records: a job writing into more is recorded with the first ones
MAX_NAMESPACES = 32
#: the most environments a store records (as many as it has slugs: ``kasd.store.environments``)
MAX_RECORDED_ENVIRONMENTS = 100_000
#: records waiting for the store; beyond, dropped and counted
QUEUE_SIZE = 1024
#: (job, agent) uses remembered per replica (each with its ≤ 32 namespaces: ≤ ~15 MB): a forgotten
#: one is recorded again (the store merges it)
REMEMBERED = 4096
#: the most deployments ``Store.deployments`` answers with
MAX_LIMIT = 1000

STATES = ("available", "stopped")


@attrs.frozen(kw_only=True)
class Deployment:
    """One CI job's use of an agent for an environment."""

    project_id: int
    #: the project's full path, e.g. ``group/app``
    project: str
    environment: str
    slug: str
    tier: str | None
    agent_id: int
    #: sorted
    namespaces: tuple[str, ...]
    job_id: int
    pipeline_id: int
    ref: str
    user: str
    #: seconds since the epoch: the job's first use of the agent
    at: float


@attrs.frozen(kw_only=True)
class Environment:
    #: assigned by the store, unique in the store, never reused
    id: int
    project_id: int
    project: str
    name: str
    slug: str
    tier: str | None
    #: ``available`` or ``stopped``
    state: str
    #: every agent its kept deployments used, sorted
    agents: tuple[int, ...]
    #: the union of its kept deployments' namespaces, sorted
    namespaces: tuple[str, ...]
    created_at: float
    updated_at: float
    stopped_at: float | None
    last_deployment: Deployment | None


@attrs.frozen(kw_only=True)
class HistoryLimits:
    """How much history a store keeps (``environments:`` in kasd's configuration)."""

    retention: float = DEFAULT_HISTORY_RETENTION
    max_deployments: int = DEFAULT_MAX_DEPLOYMENTS

    @classmethod
    def of(cls, settings: EnvironmentSettings) -> HistoryLimits:
        return cls(retention=settings.history_retention, max_deployments=settings.max_deployments)


#: the defaults
HISTORY = HistoryLimits()


class DeploymentStore(Protocol):
    async def record_deployment(self, d: Deployment) -> Environment:
        """Record ``d`` (creating its environment, or merging into the record of the same job and
        agent); ``StoreError``."""
        ...


# ------------------------------------------------------------------ what both stores share


def deployment_to_json(d: Deployment) -> dict[str, Any]:
    return attrs.asdict(d, recurse=False) | {"namespaces": list(d.namespaces)}


def deployment_from_json(data: Mapping[str, Any]) -> Deployment:
    return Deployment(
        project_id=int(data["project_id"]), project=str(data["project"]), environment=str(data["environment"]),
        slug=str(data["slug"]), tier=data.get("tier") or None, agent_id=int(data["agent_id"]),
        namespaces=tuple(sorted(str(n) for n in data.get("namespaces") or ())), job_id=int(data["job_id"]),
        pipeline_id=int(data["pipeline_id"]), ref=str(data["ref"]), user=str(data["user"]), at=float(data["at"]))


def merged(old: Deployment | None, new: Deployment) -> Deployment:
    """``new`` recorded over ``old`` (the same job and agent): namespaces joined (at most
    ``MAX_NAMESPACES``), the first use kept."""
    if old is None:
        return attrs.evolve(new, namespaces=tuple(sorted(set(new.namespaces)))[:MAX_NAMESPACES])
    namespaces = list(old.namespaces)
    for ns in sorted(set(new.namespaces) - set(old.namespaces)):
        if len(namespaces) >= MAX_NAMESPACES:
            break
        namespaces.append(ns)
    return attrs.evolve(new, namespaces=tuple(sorted(namespaces)), at=min(old.at, new.at))


def newest_first(deployments: Iterable[Deployment]) -> list[Deployment]:
    return sorted(deployments, key=lambda d: (d.at, d.job_id, d.agent_id), reverse=True)


def environment_of(row: Mapping[str, Any], deployments: Iterable[Deployment]) -> Environment:
    """The environment ``row`` (its own fields) with what its kept ``deployments`` say."""
    kept = newest_first(deployments)
    return Environment(
        id=int(row["id"]), project_id=int(row["project_id"]), project=str(row["project"]), name=str(row["name"]),
        slug=str(row["slug"]), tier=row.get("tier") or None, state=str(row["state"]),
        agents=tuple(sorted({d.agent_id for d in kept})),
        namespaces=tuple(sorted({ns for d in kept for ns in d.namespaces})),
        created_at=float(row["created_at"]), updated_at=float(row["updated_at"]),
        stopped_at=None if row.get("stopped_at") is None else float(row["stopped_at"]),
        last_deployment=kept[0] if kept else None)


def environment_to_json(env: Environment) -> dict[str, Any]:
    data = attrs.asdict(env, recurse=False)
    data["agents"], data["namespaces"] = list(env.agents), list(env.namespaces)
    data["last_deployment"] = None if env.last_deployment is None else deployment_to_json(env.last_deployment)
    return data


def environment_from_json(data: Mapping[str, Any]) -> Environment:
    last = data.get("last_deployment")
    return Environment(
        id=int(data["id"]), project_id=int(data["project_id"]), project=str(data["project"]), name=str(data["name"]),
        slug=str(data["slug"]), tier=data.get("tier") or None, state=str(data["state"]),
        agents=tuple(sorted(int(a) for a in data.get("agents") or ())),
        namespaces=tuple(sorted(str(n) for n in data.get("namespaces") or ())),
        created_at=float(data["created_at"]), updated_at=float(data["updated_at"]),
        stopped_at=None if data.get("stopped_at") is None else float(data["stopped_at"]),
        last_deployment=deployment_from_json(last) if isinstance(last, Mapping) else None)


def matches(env: Environment, *, project_id: int | None, project_prefix: str | None, tier: str | None,
            state: str | None) -> bool:
    """``Store.environments``' filter: ``project_prefix="group/"`` is a group and its subgroups
    (paths compared without case, as GitLab's are)."""
    return ((project_id is None or env.project_id == project_id)
            and (project_prefix is None or env.project.lower().startswith(project_prefix.lower()))
            and (tier is None or env.tier == tier) and (state is None or env.state == state))


def too_many_environments(max_entries: int) -> str:
    return f"kasd records the history of at most {max_entries} environments and holds that many"


def clamp_limit(limit: int) -> int:
    return max(0, min(int(limit), MAX_LIMIT))


def dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


# ------------------------------------------------------------------ the recorder


#: (job id, agent id, environment): a job has one environment, but its id alone is not what is signed
_Key = tuple[int, int, str]


@attrs.define(eq=False)
class _Use:
    deployment: Deployment
    namespaces: set[str]


@attrs.frozen(kw_only=True)
class RecorderStatistics:
    queued: int
    remembered: int
    recorded: int
    dropped: int
    failed: int


class DeploymentRecorder:
    """What the pipeline tells of each CI job's requests (``used``, ``wrote``: never blocking,
    never raising), recorded in ``store`` by ``run`` (one task)."""

    def __init__(self, store: DeploymentStore, *, project_id: Callable[[str], int | None] = lambda _path: None,
                 clock: Callable[[], float] = time.time, queue_size: int = QUEUE_SIZE,
                 remembered: int = REMEMBERED, count: Callable[[str], object] = lambda _outcome: None) -> None:
        self.store = store
        #: told each record's outcome: ``recorded``, ``dropped`` (the queue full) or ``failed`` (the store)
        self._count = count
        #: a project's id from its path (``kasd.authz.directory``), for tokens that carry none
        self._project_id = project_id
        self._clock = clock
        self._remembered = remembered
        self._send, self._receive = trio.open_memory_channel[tuple[_Key, Deployment]](queue_size)
        self._uses: OrderedDict[_Key, _Use] = OrderedDict()
        self.recorded = self.dropped = self.failed = 0
        self._log = BurstLimitedLog(log, interval=60.0)

    # ---- the pipeline's side: synchronous, bounded, never raising

    def used(self, grant: Grant) -> None:
        """``grant`` (a CI job's, for an agent) was authorized for a request: recorded once per
        (job, agent), with the grant's managed namespace."""
        try:
            self._use(grant)
        except Exception as exc:  # a bug here must not fail the request
            self._bug(exc)

    def wrote(self, grant: Grant, namespace: str) -> None:
        """The job of ``grant`` wrote into ``namespace``: recorded if it is new for the job and agent."""
        try:
            self._wrote(grant, namespace)
        except Exception as exc:
            self._bug(exc)

    def _bug(self, exc: Exception) -> None:
        self._log.log(logging.ERROR, "bug", "deployment not recorded: the recorder failed unexpectedly error=%s",
                        type(exc).__name__)

    def _wrote(self, grant: Grant, namespace: str) -> None:
        if not namespace:
            return
        use = self._use(grant)
        if use is None or namespace in use.namespaces or len(use.namespaces) >= MAX_NAMESPACES:
            return
        use.namespaces.add(namespace)
        key = (use.deployment.job_id, use.deployment.agent_id, use.deployment.environment)
        if not self._queue(key, attrs.evolve(use.deployment, namespaces=tuple(sorted(use.namespaces)))):
            use.namespaces.discard(namespace)  # the next write into it tries again

    def _use(self, grant: Grant) -> _Use | None:
        job = grant.job
        if grant.kind != "ci" or job is None or job.environment is None:
            return None
        key = (job.job_id, grant.agent_id, job.environment)
        use = self._uses.get(key)
        if use is not None:
            self._uses.move_to_end(key)
            return use
        project_id = job.project_id if job.project_id is not None else self._project_id(job.project)
        if project_id is None:
            self._log.warning("no-project", "deployment not recorded: project %s has no id known to kasd job_id=%d",
                              job.project, job.job_id)
            return None
        managed = grant.managed.namespace if grant.managed is not None else None
        namespaces = {managed} if managed else set()
        deployment = Deployment(
            project_id=project_id, project=job.project, environment=job.environment,
            slug=environment_slug(job.environment), tier=job.environment_tier, agent_id=grant.agent_id,
            namespaces=tuple(sorted(namespaces)), job_id=job.job_id, pipeline_id=job.pipeline_id, ref=job.ref,
            user=job.user, at=self._clock())
        if not self._queue(key, deployment):
            return None  # not remembered: the job's next request tries again
        use = self._uses[key] = _Use(deployment, namespaces)
        if len(self._uses) > self._remembered:
            self._uses.popitem(last=False)  # the least recently seen
        return use

    def _queue(self, key: _Key, deployment: Deployment) -> bool:
        try:
            self._send.send_nowait((key, deployment))
        except trio.WouldBlock:
            self.dropped += 1
            self._count("dropped")
            self._log.warning("full", "deployment not recorded: the recorder's queue is full (the store is slow) "
                              "job_id=%d agent_id=%d dropped=%d", deployment.job_id, deployment.agent_id, self.dropped)
            return False
        return True

    # ---- the task that writes

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write what is queued into the store, one at a time, until cancelled. A store error is
        logged (rate-limited) and the use forgotten, so the job's next request records it again."""
        task_status.started()
        async for key, deployment in self._receive:
            try:
                await self.store.record_deployment(deployment)
            except StoreError as exc:
                self.failed += 1
                self._count("failed")
                self._uses.pop(key, None)
                self._log.warning("store", "deployment not recorded: the store failed job_id=%d agent_id=%d "
                                  "failed=%d error=%s", deployment.job_id, deployment.agent_id, self.failed, exc)
            else:
                self.recorded += 1
                self._count("recorded")

    def statistics(self) -> RecorderStatistics:
        return RecorderStatistics(queued=self._receive.statistics().current_buffer_used, remembered=len(self._uses),
                                  recorded=self.recorded, dropped=self.dropped, failed=self.failed)


__all__ = [
    "DEFAULT_HISTORY_RETENTION",
    "DEFAULT_MAX_DEPLOYMENTS",
    "HISTORY",
    "MAX_NAMESPACES",
    "Deployment",
    "DeploymentRecorder",
    "DeploymentStore",
    "Environment",
    "HistoryLimits",
    "RecorderStatistics",
]
