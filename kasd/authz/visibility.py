"""Who may know that an agent exists (issue 28's audit): an agent the caller cannot see is answered
exactly as an agent that does not exist (``404 Agent Not Found``), on every route that names an
agent by id, so that ids and service names cannot be enumerated by anyone holding some token.

A user sees an agent that ``GET /api/kasd/v1/agents`` lists for them (the Developer role or more in its
configuration project, GitLab's role to view agents, or its ``user_access`` admits them) or whose ``services[].user_access`` admits
them. A CI job sees an agent whose configuration project is the job's own, or whose ``ci_access``
(``projects``, ``groups``, ``instance``) or ``services[].ci_access`` names the job's project or a group
above it, whatever the environment (the 403 then says which environment would be let in). Pure.

May import: this package's ``agentconfig``, ``directory``, ``jobtokens``, ``policy``, ``servicepolicy``.
"""

from __future__ import annotations

from kasd.authz.agentconfig import AgentConfig
from kasd.authz.directory import Directory, Role
from kasd.authz.jobtokens import JobClaims
from kasd.authz.policy import authorize_user
from kasd.authz.servicepolicy import authorize_service_user


def user_sees_agent(directory: Directory, agent_id: int, config: AgentConfig | None, username: str) -> bool:
    agent = directory.agent(agent_id)
    if agent is None or config is None:
        return False
    project = directory.project(agent.config_project)
    role = directory.role_of(username, project) if project is not None else None
    if role is not None and role >= Role.DEVELOPER:
        return True
    if authorize_user(directory, agent_id, config, username).allowed:
        return True
    return any(authorize_service_user(directory, agent_id, config, s.name, username).allowed for s in config.services)


def job_sees_agent(directory: Directory, agent_id: int, config: AgentConfig | None, job: JobClaims) -> bool:
    agent = directory.agent(agent_id)
    project = directory.project(job.project)
    if agent is None or config is None or project is None:
        return False
    if job.project_id is not None and job.project_id != project.id:
        return False
    if config.ci_access.instance is not None:
        return True
    paths = {project.path.lower(), *(group.path.lower() for group in directory.ancestors(project))}
    if agent.config_project.lower() == project.path.lower():
        return True
    named = [entry.id for entry in (*config.ci_access.projects, *config.ci_access.groups) if entry.id]
    named += [entry.id for access in config.services for entry in (*access.ci_projects, *access.ci_groups)]
    return any(name.lower() in paths for name in named)


__all__ = ["job_sees_agent", "user_sees_agent"]
