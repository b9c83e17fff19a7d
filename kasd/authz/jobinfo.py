"""GitLab's answer to ``GET /api/v4/job/allowed_agents`` for a job and the agents it may use.

The shape is GitLab's (``lib/api/ci/jobs.rb`` and its entities, what gitlab-kas reads; the example
in GitLab's Jobs API documentation): ``allowed_agents``, each with ``id``, ``config_project`` (a
``ProjectIdentity``: ``id``, ``description``, ``name``, ``name_with_namespace``, ``path``,
``path_with_namespace``, ``created_at``) and ``configuration`` — the ``ci_access`` entry that allowed
the job as written in ``config.yaml``, without its ``id`` (``{}`` for the config project's implicit
access); ``job`` ``{id}``; ``pipeline`` ``{id}``; ``project`` ``{id, groups: [{id}], root first}``;
``user`` (``id``, ``name``, ``username``, ``state``, ``avatar_url``, ``web_url`` as documented, and
``roles_in_project`` as GitLab's code sends); ``environment`` ``{tier, slug}`` for a job with one.

Standalone kasd has no GitLab to ask for some of these; what it sends instead (docs/authorization.md):
a project's ``name`` is its path's last segment and ``name_with_namespace`` its path segments joined
by `` / `` (GitLab joins display names); ``description`` and ``created_at`` are null; a user's
``name`` is the username, ``state`` is ``active`` (the token verified), ``avatar_url`` and
``web_url`` are null; an ``id`` kasd's directory does not know is null.

kasd adds, beside GitLab's fields: ``project.path_with_namespace``, ``pipeline.ref``, and per allowed
agent ``kasd`` — what a kubeconfig needs and GitLab's answer leaves to its caller: the agent's
``name``, the kubeconfig ``context`` name (``<config project path>:<agent name>``), the
``namespace`` the job works in (a rule's, else the entry's ``default_namespace``) and the
``access_as`` mode in force. Pure.
"""

from __future__ import annotations

from typing import Any

from kasd.authz.civars import guess_environment_tier
from kasd.authz.jobtokens import JobClaims
from kasd.authz.slugs import environment_slug
from kasd.authz.snapshot import Snapshot
from kasd.authz.verdict import Grant

__all__ = ["allowed_agents_response", "context_name", "project_identity"]

def context_name(config_project: str, agent_name: str) -> str:
    """GitLab's kubeconfig context name for an agent: ``<config project path>:<agent name>``."""
    return f"{config_project}:{agent_name}"


#: GitLab's ``Gitlab::Access.sym_options_with_owner``, lowest first: ``roles_in_project`` lists those
#: up to the user's access level (kasd's directory has no Planner role; GitLab lists it below Reporter)
_GITLAB_ROLES = (("guest", 10), ("planner", 15), ("reporter", 20), ("developer", 30), ("maintainer", 40),
                 ("owner", 50))


def project_identity(path: str, project_id: int | None) -> dict[str, Any]:
    """GitLab's ``ProjectIdentity`` entity for the project at ``path`` (see the module docstring for
    what standalone kasd fills in)."""
    return {
        "id": project_id,
        "description": None,
        "name": path.rsplit("/", 1)[-1],
        "name_with_namespace": " / ".join(path.split("/")),
        "path": path.rsplit("/", 1)[-1],
        "path_with_namespace": path,
        "created_at": None,
    }


def allowed_agents_response(snapshot: Snapshot, claims: JobClaims, allowed: list[Grant]) -> dict[str, Any]:
    directory = snapshot.directory
    project = directory.project(claims.project)
    user = directory.user(claims.user)
    agents = []
    for grant in allowed:
        agent = directory.agent(grant.agent_id)
        assert agent is not None  # it was decided
        config_project = directory.project(agent.config_project)
        entry = _entry_of(snapshot, grant)
        agents.append({
            "id": agent.id,
            "config_project": project_identity(agent.config_project, config_project.id if config_project else None),
            "configuration": dict(entry.written) if entry is not None else {},
            "kasd": {"name": agent.name, "context": context_name(agent.config_project, agent.name),
                     "namespace": grant.namespace, "access_as": grant.access_as},
        })
    role = directory.role_of(user, project) if user is not None and project is not None else None
    body: dict[str, Any] = {
        "allowed_agents": agents,
        "job": {"id": claims.job_id},
        "pipeline": {"id": claims.pipeline_id, "ref": claims.ref},
        "project": {
            "id": project.id if project else claims.project_id,
            "path_with_namespace": claims.project,
            "groups": [{"id": g.id} for g in directory.ancestors(project)] if project else [],
        },
        "user": {
            "id": user.id if user else None,
            "name": claims.user,
            "username": claims.user,
            "state": "active",
            "avatar_url": None,
            "web_url": None,
            "roles_in_project": [name for name, level in _GITLAB_ROLES if role is not None and level <= role],
        },
    }
    if claims.environment is not None:
        # GitLab's deployment tier is never empty: given, or guessed from the name (as CI_ENVIRONMENT_TIER)
        body["environment"] = {"slug": environment_slug(claims.environment),
                               "tier": claims.environment_tier or guess_environment_tier(claims.environment)}
    return body


def _entry_of(snapshot: Snapshot, grant: Grant) -> Any:
    """The ``ci_access`` entry that allowed it (None for the implicit one of the config project)."""
    config = snapshot.agents[grant.agent_id].config.ci_access
    if grant.entry_kind == "instance":
        return config.instance
    entries = config.projects if grant.entry_kind == "project" else config.groups
    for entry in entries:
        if entry.id == grant.entry_id:
            return entry
    return None
