"""The decision: may this CI job (or this user) use this in-cluster service of this agent
(``services:`` of the agent's ``config.yaml``, ``kasd.authz.services``). Pure, like ``policy``.

May import: this package's ``agentconfig``, ``directory``, ``jobtokens``, ``policy``, ``services``.
"""

from __future__ import annotations

import attrs

from kasd.authz.agentconfig import AgentConfig
from kasd.authz.directory import Directory, Group, Project
from kasd.authz.jobtokens import JobClaims
from kasd.authz.policy import USER_ACCESS_MIN_ROLE, environment_matches
from kasd.authz.services import ServiceAccess, ServiceCiEntry


@attrs.frozen(kw_only=True)
class ServiceDecision:
    """May the caller use the service: ``status`` 200 (yes), 403 (listed, not for this caller) or
    404 (the agent or the service is not known); ``reason`` is safe to show the caller."""

    status: int
    reason: str
    #: who asked, for logs: ``ci_job:<id>`` or ``user:<username>``
    principal: str

    @property
    def allowed(self) -> bool:
        return self.status == 200


# --------------------------------------------------------------------------- the decision


def _find(config: AgentConfig, service: str) -> ServiceAccess | None:
    for access in config.services:
        if access.name == service:
            return access
    return None


def _same(a: str, b: str) -> bool:
    return a.lower() == b.lower()


def authorize_service_job(directory: Directory, agent_id: int, config: AgentConfig | None, service: str,
                          job: JobClaims) -> ServiceDecision:
    """May the verified ``job`` use ``service`` of agent ``agent_id``: the most specific entry naming
    the job's project decides (its ``projects`` entry, else the nearest ``groups`` entry above it),
    as in ``ci_access``; its ``environments`` filter the job's environment."""
    principal = f"ci_job:{job.job_id}"
    found = _known(directory, agent_id, config, service, principal)
    if isinstance(found, ServiceDecision):
        return found
    project = directory.project(job.project)
    if project is None or (job.project_id is not None and job.project_id != project.id):
        return ServiceDecision(status=403, principal=principal,
                               reason=f"the job's project {job.project!r} is not known to kasd")
    entry = _select(directory, found, project)
    if entry is None:
        return ServiceDecision(status=403, principal=principal,
                               reason=f"agent {agent_id} does not allow CI/CD jobs of project {project.path} to use "
                                      f"service {service!r} (services[].ci_access)")
    if entry.environments and not any(environment_matches(p, job.environment) for p in entry.environments):
        which = f"in environment {job.environment!r}" if job.environment is not None else "without an environment"
        return ServiceDecision(status=403, principal=principal,
                               reason=f"agent {agent_id} allows CI/CD jobs of project {project.path} to use service "
                                      f"{service!r} only in certain environments, not {which}")
    return ServiceDecision(status=200, principal=principal,
                           reason=f"services[{service}].ci_access.{entry.kind}s entry {entry.id}")


def _select(directory: Directory, access: ServiceAccess, project: Project) -> ServiceCiEntry | None:
    for entry in access.ci_projects:
        if _same(project.path, entry.id):
            return entry
    for group in reversed(directory.ancestors(project)):  # nearest first
        for entry in access.ci_groups:
            if _same(group.path, entry.id):
                return entry
    return None


def authorize_service_user(directory: Directory, agent_id: int, config: AgentConfig | None, service: str,
                           username: str) -> ServiceDecision:
    """May ``username`` (proved by a personal token) use ``service`` of agent ``agent_id``: at least
    the Developer role in a listed project or group (own or inherited), as ``user_access``."""
    principal = f"user:{username}"
    found = _known(directory, agent_id, config, service, principal)
    if isinstance(found, ServiceDecision):
        return found
    user = directory.user(username)
    if user is not None:
        for path in found.user_projects:
            project = directory.project(path)
            role = directory.role_of(user, project) if project is not None else None
            if role is not None and role >= USER_ACCESS_MIN_ROLE:
                return ServiceDecision(status=200, principal=principal,
                                       reason=f"services[{service}].user_access project {path}")
        for path in found.user_groups:
            group: Group | None = directory.group(path)
            role = directory.group_role(user, group) if group is not None else None
            if role is not None and role >= USER_ACCESS_MIN_ROLE:
                return ServiceDecision(status=200, principal=principal,
                                       reason=f"services[{service}].user_access group {path}")
    return ServiceDecision(status=403, principal=principal,
                           reason=f"user {username} needs at least the Developer role in a project or group that agent "
                                  f"{agent_id} authorizes for service {service!r} (services[].user_access)")


def _known(directory: Directory, agent_id: int, config: AgentConfig | None, service: str,
           principal: str) -> ServiceAccess | ServiceDecision:
    if directory.agent(agent_id) is None or config is None:
        return ServiceDecision(status=404, principal=principal, reason="404 Agent Not Found")
    access = _find(config, service)
    if access is None:
        return ServiceDecision(status=404, principal=principal, reason="404 Service Not Found")
    return access


__all__ = ["ServiceDecision", "authorize_service_job", "authorize_service_user"]
