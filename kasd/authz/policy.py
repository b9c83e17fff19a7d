"""The decision: may this CI job (or this user) use this agent, and as whom does the agent act.

Pure functions over the directory (``kasd.authz.directory``) and one agent's loaded configuration
(``kasd.authz.agentconfig``), GitLab's semantics (docs/authorization.md):

- a CI job: ``authorize_job``. The job's project picks **one** ``ci_access`` entry, the most
  specific that names it — its ``projects`` entry, else the implicit one of the agent's own config
  project, else the nearest ``groups`` entry above it (a group covers its subgroups), else
  ``instance`` — and that entry alone decides (``environments``, ``protected_branches_only``,
  ``access_as``); entries are never merged, and an entry that refuses the job does not pass it on
  to a less specific one.
- a personal token: ``authorize_user``. ``user_access`` admits members with at least the Developer
  role of a listed project, or of a listed group (own or inherited membership).

A ``Decision`` says allowed or denied, with a reason safe to show the client; an allowed one carries
the access mode and whom agentd impersonates (``tunnelhttp.head.Impersonation``, the value the proxy
sends; None when the agent acts as itself) with GitLab's exact user, group and extra strings (extras
in GitLab's order). The job is the verified token's own value (``kasd.authz.jobtokens.JobClaims``). The environment slug is computed by the ``slug`` function the
caller passes (GitLab's ``CI_ENVIRONMENT_SLUG``, kasd.authz.slugs), never here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import attrs

from kasd.authz.agentconfig import AgentConfig, CiAccessEntry, EntryKind, RawRule
from kasd.authz.directory import Agent, Directory, Group, Project, Role, User
from kasd.authz.jobtokens import JobClaims
from tunnelhttp.head import CLIENT_IMPERSONATION_REFUSED, Impersonation

#: how the agent acts: itself, a configured identity, the CI job, the CI job's user, the token's user
AccessMode = Literal["agent", "impersonate", "ci_job", "ci_user", "user"]
Slug = Callable[[str], str]

#: the status and message when a client sends ``Impersonate-*`` headers but the decision's identity
#: is not the agent's own (kasd's wording: GitLab's agentk refuses such requests too)
CLIENT_IMPERSONATION_STATUS = 400

#: the role ``user_access`` asks of a member (GitLab's ``use_k8s_proxies``)
USER_ACCESS_MIN_ROLE = Role.DEVELOPER


@attrs.frozen(kw_only=True)
class Decision:
    """What one agent's configuration says of a job or a user: the entry that decided and what it
    asks for (``default_namespace``, ``rules``, ``resource_management``), before the rules run. Not a
    ``Grant``: the snapshot turns it, with the rules' namespace and the managed resources, into one
    (``kasd.authz.snapshot``); a denied one into an ``AccessDenied``."""

    allowed: bool
    #: denied: why, safe to show the client (a 403's message); allowed: which entry, for logs
    reason: str
    agent_id: int
    #: who asked, for logs: ``ci_job:<id>`` or ``user:<username>``
    principal: str
    #: the entry that decided: a ci_access entry's kind, or ``user_access``
    entry_kind: EntryKind | Literal["user_access"] | None = None
    #: its project or group path (None for instance, implicit and user_access)
    entry_id: str | None = None
    access_as: AccessMode | None = None
    #: whom agentd impersonates; None: the agent acts as itself (``agent``)
    identity: Impersonation | None = None
    default_namespace: str | None = None
    #: the entry's rules, as written, for the rules engine
    rules: tuple[RawRule, ...] = ()
    resource_management: bool = False


def allows_client_impersonation(decision: Decision) -> bool:
    """Whether a request may carry its own ``Impersonate-*`` headers: only when the agent acts as
    itself (``access_as: agent``), where the agent's service account's RBAC decides them. Otherwise
    answer ``CLIENT_IMPERSONATION_STATUS`` with ``CLIENT_IMPERSONATION_REFUSED``."""
    return decision.allowed and decision.access_as == "agent"


# --------------------------------------------------------------------------- CI jobs


def environment_matches(pattern: str, environment: str | None) -> bool:
    """GitLab's environment matcher (``Gitlab::Ci::EnvironmentMatcher``): the name itself, or with
    ``*`` standing for any run of characters (``/`` included), case-sensitive, whole name. A job
    without an environment matches no pattern."""
    if environment is None:
        return False
    if pattern == environment:
        return True
    if "*" not in pattern:
        return False
    # Linear in the name: the first part is its start, the last its end, and each part between found
    # leftmost after the one before (the leftmost place leaves the most room for the rest, so this
    # never misses a match). A regular expression ``.*a.*a…`` backtracks: the pattern
    # ``*a*a*a*a*a*a*a*a*b`` against an environment of 40 ``a`` held the event loop 3.3 s, two more
    # ``*a`` 43 s, and both are the job's and the config's writers' to choose.
    first, *middle, last = pattern.split("*")
    if len(first) + len(last) > len(environment) or not environment.startswith(first) \
            or not environment.endswith(last):
        return False
    position, end = len(first), len(environment) - len(last)
    for part in middle:
        found = environment.find(part, position, end)
        if found < 0:
            return False
        position = found + len(part)
    return True


_IMPLICIT = CiAccessEntry(kind="implicit")


def _same(a: str, b: str | None) -> bool:
    return b is not None and a.lower() == b.lower()


def select_entry(directory: Directory, agent: Agent, config: AgentConfig, project: Project) -> CiAccessEntry | None:
    """The one ``ci_access`` entry that decides for ``project``'s jobs (see the module docstring)."""
    for entry in config.ci_access.projects:
        if _same(project.path, entry.id):
            return entry
    if _same(project.path, agent.config_project):
        return _IMPLICIT
    for group in reversed(directory.ancestors(project)):  # nearest first
        for entry in config.ci_access.groups:
            if _same(group.path, entry.id):
                return entry
    return config.ci_access.instance


def authorize_job(directory: Directory, agent_id: int, config: AgentConfig, job: JobClaims, *,
                  slug: Slug) -> Decision:
    """May ``job`` use agent ``agent_id`` (configured by ``config``), and as whom."""
    principal = f"ci_job:{job.job_id}"

    def deny(reason: str, entry: CiAccessEntry | None = None) -> Decision:
        return Decision(allowed=False, reason=reason, agent_id=agent_id, principal=principal,
                        entry_kind=entry.kind if entry else None, entry_id=entry.id if entry else None)

    agent = directory.agent(agent_id)
    if agent is None:
        return deny(f"agent {agent_id} is not known")
    project = directory.project(job.project)
    if project is None:
        return deny(f"the job's project {job.project!r} is not known to kasd")
    if job.project_id is not None and job.project_id != project.id:
        return deny(f"the job token's project id {job.project_id} is not project {job.project!r}'s")
    entry = select_entry(directory, agent, config, project)
    if entry is None:
        return deny(f"the agent is not configured to allow this project's CI/CD jobs: agent {agent_id} "
                    f"does not authorize project {project.path} (ci_access)")
    if entry.environments:
        if job.environment is None:
            return deny(f"agent {agent_id} allows CI/CD jobs of project {project.path} only in certain "
                        "environments, and this job has no environment", entry)
        if not any(environment_matches(pattern, job.environment) for pattern in entry.environments):
            return deny(f"agent {agent_id} does not allow CI/CD jobs of project {project.path} in environment "
                        f"{job.environment!r}", entry)
    if entry.protected_branches_only and not job.protected:
        return deny(f"agent {agent_id} allows CI/CD jobs of project {project.path} only on protected branches "
                    f"and tags (protected_branches_only), and {job.ref_type} {job.ref!r} is not protected", entry)
    config_project = directory.project(agent.config_project)
    mode = entry.access_as.mode
    identity: Impersonation | None = None
    if mode == "impersonate":
        imp = entry.access_as.impersonate
        assert imp is not None
        identity = Impersonation(user=imp.username, uid=imp.uid, groups=imp.groups,
                                 extra=tuple((k, tuple(v)) for k, v in dict(imp.extra).items()))
    elif mode in ("ci_job", "ci_user"):
        if config_project is None:
            return deny(f"agent {agent_id}'s config project {agent.config_project!r} is not known to kasd", entry)
        extra = _ci_extra(agent, config_project, project, job, slug)
        if mode == "ci_job":
            identity = Impersonation(user=f"gitlab:ci_job:{job.job_id}",
                                     groups=_ci_job_groups(directory.ancestors(project), project, job, slug),
                                     extra=extra)
        else:
            user = directory.user(job.user)
            identity = Impersonation(user=f"gitlab:user:{job.user}",
                                     groups=_ci_user_groups(directory, user, project), extra=extra)
    where = {"project": f"ci_access.projects entry {entry.id}", "group": f"ci_access.groups entry {entry.id}",
             "instance": "ci_access.instance", "implicit": "the agent's own config project"}[entry.kind]
    return Decision(
        allowed=True, reason=f"{where}, access_as {mode}", agent_id=agent_id, principal=principal,
        entry_kind=entry.kind, entry_id=entry.id, access_as=mode, identity=identity,
        default_namespace=entry.default_namespace, rules=entry.rules, resource_management=entry.resource_management,
    )


def _ci_job_groups(ancestors: list[Group], project: Project, job: JobClaims, slug: Slug) -> tuple[str, ...]:
    """GitLab's order: ``gitlab:ci_job``; each group root first, with its environment tier; the
    project; its environment and tier."""
    groups = ["gitlab:ci_job"]
    for group in ancestors:
        groups.append(f"gitlab:group:{group.id}")
        if job.environment is not None and job.environment_tier is not None:
            groups.append(f"gitlab:group_env_tier:{group.id}:{job.environment_tier}")
    groups.append(f"gitlab:project:{project.id}")
    if job.environment is not None:
        groups.append(f"gitlab:project_env:{project.id}:{slug(job.environment)}")
        if job.environment_tier is not None:
            groups.append(f"gitlab:project_env_tier:{project.id}:{job.environment_tier}")
    return tuple(groups)


def _ci_extra(agent: Agent, config_project: Project, project: Project, job: JobClaims,
              slug: Slug) -> tuple[tuple[str, tuple[str, ...]], ...]:
    extra: dict[str, tuple[str, ...]] = {
        "agent.gitlab.com/id": (str(agent.id),),
        "agent.gitlab.com/config_project_id": (str(config_project.id),),
        "agent.gitlab.com/project_id": (str(project.id),),
        "agent.gitlab.com/ci_pipeline_id": (str(job.pipeline_id),),
        "agent.gitlab.com/ci_job_id": (str(job.job_id),),
        "agent.gitlab.com/username": (job.user,),
    }
    if job.environment is not None:
        extra["agent.gitlab.com/environment_slug"] = (slug(job.environment),)
        if job.environment_tier is not None:
            extra["agent.gitlab.com/environment_tier"] = (job.environment_tier,)
    return tuple(extra.items())


def _role_groups(kind: str, item_id: int, role: Role | None) -> list[str]:
    return [f"gitlab:{kind}_role:{item_id}:{r.label}" for r in role.and_below()] if role is not None else []


def _ci_user_groups(directory: Directory, user: User | None, project: Project) -> tuple[str, ...]:
    """``ci_user`` (GitLab planned it, never shipped it): the job's user's roles in the job's project
    and in each group above it (root first), each role with every lower one."""
    groups = ["gitlab:user"]
    if user is not None:
        groups += _role_groups("project", project.id, directory.role_of(user, project))
        for group in directory.ancestors(project):
            groups += _role_groups("group", group.id, directory.group_role(user, group))
    return tuple(groups)


# --------------------------------------------------------------------------- personal tokens


def authorize_user(directory: Directory, agent_id: int, config: AgentConfig, username: str, *,
                   access_type: str = "personal_access_token") -> Decision:
    """May ``username`` (who proved it with a personal token) use agent ``agent_id``, and as whom."""
    principal = f"user:{username}"

    def deny(reason: str) -> Decision:
        return Decision(allowed=False, reason=reason, agent_id=agent_id, principal=principal,
                        entry_kind="user_access" if config.user_access else None)

    agent = directory.agent(agent_id)
    if agent is None:
        return deny(f"agent {agent_id} is not known")
    access = config.user_access
    if access is None:
        return deny(f"agent {agent_id} is not configured for user access (user_access)")
    user = directory.user(username)
    if user is None:
        return deny(f"user {username!r} is not known to kasd")
    projects: list[tuple[Project, Role]] = []
    for path in access.projects:
        project = directory.project(path)
        role = directory.role_of(user, project) if project is not None else None
        if project is not None and role is not None and role >= USER_ACCESS_MIN_ROLE:
            projects.append((project, role))
    groups: list[tuple[Group, Role]] = []
    for path in access.groups:
        group = directory.group(path)
        role = directory.group_role(user, group) if group is not None else None
        if group is not None and role is not None and role >= USER_ACCESS_MIN_ROLE:
            groups.append((group, role))
    if not projects and not groups:
        return deny(f"user {user.username} needs at least the Developer role in a project or group that agent "
                    f"{agent_id} authorizes for user access (user_access)")
    identity: Impersonation | None = None
    if access.access_as == "user":
        config_project = directory.project(agent.config_project)
        if config_project is None:
            return deny(f"agent {agent_id}'s config project {agent.config_project!r} is not known to kasd")
        names = ["gitlab:user"]
        for project, role in projects:
            names += _role_groups("project", project.id, role)
        for group, role in groups:
            names += _role_groups("group", group.id, role)
        identity = Impersonation(
            user=f"gitlab:user:{user.username}", groups=tuple(names),
            extra=(
                ("agent.gitlab.com/id", (str(agent.id),)),
                ("agent.gitlab.com/username", (user.username,)),
                ("agent.gitlab.com/access_type", (access_type,)),
                ("agent.gitlab.com/config_project_id", (str(config_project.id),)),
            ),
        )
    return Decision(allowed=True, reason=f"user_access, access_as {access.access_as}", agent_id=agent_id,
                    principal=principal, entry_kind="user_access", access_as=access.access_as, identity=identity)


__all__ = [
    "CLIENT_IMPERSONATION_REFUSED",
    "CLIENT_IMPERSONATION_STATUS",
    "USER_ACCESS_MIN_ROLE",
    "AccessMode",
    "Decision",
    "allows_client_impersonation",
    "authorize_job",
    "authorize_user",
    "environment_matches",
    "select_entry",
]
