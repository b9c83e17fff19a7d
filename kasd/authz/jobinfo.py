"""GitLab's answer to ``GET /api/v4/job/allowed_agents`` for a job and the agents it may use.

The shape is GitLab's (``lib/api/ci/jobs.rb``, what gitlab-kas reads): ``allowed_agents`` (each with
``id``, ``config_project`` and ``configuration`` — the ``ci_access`` entry that allowed the job),
``job``, ``pipeline``, ``project`` (with its ``groups``, root first), ``user`` and, for a job with an
environment, ``environment``. kasd adds one object per allowed agent, ``kasd``, with what a
kubeconfig needs and GitLab's answer leaves to its caller: the agent's ``name``, the kubeconfig
``context`` name (``<config project path>:<agent name>``) and the ``namespace`` the job works in
(a rule's, else the entry's ``default_namespace``). Pure.
"""

from __future__ import annotations

from typing import Any

from kasd.authz.agentconfig import AccessAs
from kasd.authz.jobtokens import JobClaims
from kasd.authz.slugs import environment_slug
from kasd.authz.snapshot import Snapshot, Verdict

__all__ = ["ALLOWED_AGENTS_PATH", "allowed_agents_response", "context_name"]

#: GitLab's path of the call (kasd's REST API serves it, ``kasctl kubeconfig`` asks it)
ALLOWED_AGENTS_PATH = "/api/v4/job/allowed_agents"


def context_name(config_project: str, agent_name: str) -> str:
    """GitLab's kubeconfig context name for an agent: ``<config project path>:<agent name>``."""
    return f"{config_project}:{agent_name}"


def _access_as(access_as: AccessAs) -> dict[str, Any]:
    if access_as.mode == "impersonate" and access_as.impersonate is not None:
        imp = access_as.impersonate
        body: dict[str, Any] = {"username": imp.username}
        if imp.uid is not None:
            body["uid"] = imp.uid
        if imp.groups:
            body["groups"] = list(imp.groups)
        if imp.extra:
            body["extra"] = [{"key": key, "val": list(values)} for key, values in imp.extra]
        return {"impersonate": body}
    return {access_as.mode: {}}


def allowed_agents_response(snapshot: Snapshot, claims: JobClaims, allowed: list[Verdict]) -> dict[str, Any]:
    directory = snapshot.directory
    project = directory.project(claims.project)
    user = directory.user(claims.user)
    agents = []
    for verdict in allowed:
        agent = directory.agent(verdict.decision.agent_id)
        assert agent is not None  # it was decided
        config_project = directory.project(agent.config_project)
        entry = _entry_of(snapshot, verdict)
        configuration: dict[str, Any] = {}
        if entry is not None:
            if entry.default_namespace is not None:
                configuration["default_namespace"] = entry.default_namespace
            configuration["access_as"] = _access_as(entry.access_as)
        agents.append({
            "id": agent.id,
            "config_project": {"id": config_project.id if config_project else None,
                               "path_with_namespace": agent.config_project},
            "configuration": configuration,
            "kasd": {"name": agent.name, "context": context_name(agent.config_project, agent.name),
                     "namespace": verdict.namespace, "access_as": verdict.decision.access_as},
        })
    body: dict[str, Any] = {
        "allowed_agents": agents,
        "job": {"id": claims.job_id},
        "pipeline": {"id": claims.pipeline_id, "ref": claims.ref},
        "project": {
            "id": project.id if project else claims.project_id,
            "path_with_namespace": claims.project,
            "groups": [{"id": g.id} for g in directory.ancestors(project)] if project else [],
        },
        "user": {"id": user.id if user else None, "username": claims.user},
    }
    if claims.environment is not None:
        body["environment"] = {"slug": environment_slug(claims.environment), "tier": claims.environment_tier}
    return body


def _entry_of(snapshot: Snapshot, verdict: Verdict) -> Any:
    """The ``ci_access`` entry that allowed it (None for the implicit one of the config project)."""
    decision = verdict.decision
    config = snapshot.agents[decision.agent_id].config.ci_access
    if decision.entry_kind == "instance":
        return config.instance
    entries = config.projects if decision.entry_kind == "project" else config.groups
    for entry in entries:
        if entry.id == decision.entry_id:
            return entry
    return None
