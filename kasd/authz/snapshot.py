"""One consistent view of everything that authorizes a request, and the verdict it gives.

A ``Snapshot`` is built whole from kasd's configuration (the directory, the token settings) and the
agents' ``config.yaml`` files, or not at all: a file that cannot be used raises, naming file, line,
column and problem, so a reload that fails leaves the previous snapshot in force (the caller keeps
it). ``Snapshot.authorize(kind, secret, agent_id, now=…)`` is the whole decision for one bearer token
and agent: verify the token, pick the ``ci_access`` entry (or ``user_access``), apply its ``rules:``,
resolve the namespace; the answer is a ``Grant`` (``kasd.authz.verdict``, the very value the
``Authority`` seam answers with), or an ``AccessDenied`` (401: who are you?; 403: not for this agent)
saying why not in words a client may read.

Pure, as the rest of this package: time is an argument, reading files is the only I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Container, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Protocol, TypeVar

import attrs

from kasd.authz.agentconfig import (
    AgentConfig,
    AgentConfigError,
    CiAccessEntry,
    agent_config_path,
    load_agent_config,
    project_root,
)
from kasd.authz.civars import ci_variables, guess_environment_tier
from kasd.authz.directory import Directory, Project
from kasd.authz.expand import RoleRef
from kasd.authz.gitsource import GitConfigError, GitSource, ProjectCommit, ProjectReader, unreadable
from kasd.authz.jobtokens import (
    DEFAULT_AUDIENCE,
    DEFAULT_ISSUER,
    DEFAULT_LEEWAY,
    JobClaims,
    PersonalClaims,
    TokenInvalid,
    verify_job_token,
    verify_personal_token,
)
from kasd.authz.keys import KeySet
from kasd.authz.policy import Decision, authorize_job, authorize_user
from kasd.authz.rules import (
    MAX_RULES,
    MAX_RULES_PROGRAM,
    Rule,
    compile_rules,
    first_match,
    program_size,
)
from kasd.authz.slugs import environment_slug, ref_slug
from kasd.authz.templates import (
    BUILTIN,
    EnvironmentTemplate,
    ManagedResources,
    TemplateError,
    load_templates,
    render,
    rules_objects,
    templates_dir,
)
from kasd.authz.verdict import AccessDenied, Grant

_Claims = TypeVar("_Claims", JobClaims, PersonalClaims)

__all__ = ["DEFAULT_MAX_JOB_TOKEN_LIFETIME", "CompiledAgent", "FinishedJobsView", "Snapshot", "TokenChecks",
           "compile_agent", "load_agents", "load_agents_from_git"]


class FinishedJobsView(Protocol):
    """The jobs recorded as finished (``kasd.store.finished.FinishedJobs``: kept in step by kasd's
    store, read here on every job token). Named here, by its one reader, not beside the
    implementation: ``kasd.store`` imports this package (its slugs), and this package never the store."""

    def until(self, job_id: int, now: float) -> int | None: ...


class _NoFinishedJobs:
    def until(self, job_id: int, now: float) -> int | None:
        return None


#: GitLab's tokens live as long as their job's timeout; kasd's, at most this long by default
DEFAULT_MAX_JOB_TOKEN_LIFETIME = timedelta(hours=24)


@attrs.frozen(kw_only=True)
class TokenChecks:
    """How job and personal tokens are checked: kasd's ``authorization.tokens`` once loaded. Not the
    settings class (``kasd.config``, which this package never imports): that one names key files and
    seconds as written, this one holds the keys read from them, durations and the finished jobs."""

    #: None: none configured, so every token is refused (saying so)
    keyset: KeySet | None
    audience: str = DEFAULT_AUDIENCE
    issuer: str = DEFAULT_ISSUER
    leeway: timedelta = DEFAULT_LEEWAY
    #: token ids (``jti``) refused before they expire
    revoked: Container[str] = frozenset()
    #: a job token living longer (``exp - iat``) is refused: a finished job's record lasts this long
    max_job_lifetime: timedelta = DEFAULT_MAX_JOB_TOKEN_LIFETIME
    #: jobs whose every token is refused (``PUT /api/v4/jobs/:id``, ``kasctl token revoke``)
    finished: FinishedJobsView = attrs.field(factory=_NoFinishedJobs)


@attrs.frozen(kw_only=True)
class CompiledAgent:
    """An agent's ``config.yaml`` with each entry's ``rules:`` parsed (once, at load)."""

    config: AgentConfig
    #: by entry: (kind, id) → its compiled rules; an entry without rules has none here
    rules: Mapping[tuple[str, str | None], tuple[Rule, ...]] = attrs.field(factory=dict)
    #: ``environment_templates/<name>.yaml`` by name (``default`` replaces the built-in one)
    templates: Mapping[str, EnvironmentTemplate] = attrs.field(factory=dict)

    def template(self) -> EnvironmentTemplate:
        """The template ``resource_management`` applies: the agent's ``default.yaml``, else the built-in."""
        return self.templates.get("default", BUILTIN)


def load_agents(directory: Directory, config_root: Path) -> tuple[dict[int, CompiledAgent], list[str]]:
    """Every agent's configuration, from ``<config_root>/<project>/.gitlab/agents/<name>/config.yaml``
    and its ``environment_templates/*.yaml``; ``AgentConfigError`` or ``TemplateError`` for the first
    file that cannot be used; the warnings to log once."""
    agents: dict[int, CompiledAgent] = {}
    warnings: list[str] = []
    for agent in directory.agents:
        loaded = load_agent_config(config_root, agent.config_project, agent.name)
        warnings.extend(loaded.warnings)
        config_file = agent_config_path(config_root, agent.config_project, agent.name)
        project = project_root(config_root, agent.config_project, TemplateError)
        agents[agent.id] = compile_agent(loaded.config, functools.partial(load_templates, templates_dir(config_file), project))
    return agents, warnings


def load_agents_from_git(directory: Directory, source: GitSource
                         ) -> tuple[dict[int, CompiledAgent], list[str], list[ProjectCommit]]:
    """``load_agents`` from Git (``kasd.authz.gitsource``): each config project's tree at the ref's
    commit, read once per project; also ``GitConfigError``; and the commit of each config project."""
    agents: dict[int, CompiledAgent] = {}
    warnings: list[str] = []
    commits: list[ProjectCommit] = []
    by_project: dict[str, list[int]] = {}
    for agent in directory.agents:
        by_project.setdefault(agent.config_project, []).append(agent.id)
    for project_path in sorted(by_project):
        try:
            with ProjectReader(source, project_path) as reader:
                for agent_id in by_project[project_path]:
                    found = directory.agent(agent_id)
                    assert found is not None
                    read = reader.read_agent(found.name)
                    warnings.extend(read.loaded.warnings)
                    agents[agent_id] = compile_agent(read.loaded.config, functools.partial(dict, read.templates))
                commits.append(ProjectCommit(project=project_path, ref=source.ref, commit=reader.commit))
        except (GitConfigError, AgentConfigError, TemplateError, AssertionError):
            raise
        except Exception as exc:  # a corrupt object or pack, an I/O error: named, not a kasd bug
            raise unreadable(project_path, exc) from None
    return agents, warnings, commits


def compile_agent(config: AgentConfig, templates: Callable[[], Mapping[str, EnvironmentTemplate]]) -> CompiledAgent:
    """An agent's checked configuration with its rules compiled and its templates (read last)."""
    rules: dict[tuple[str, str | None], tuple[Rule, ...]] = {}
    entries: list[tuple[str, CiAccessEntry]] = [
        *((f"ci_access.projects[{i}]", e) for i, e in enumerate(config.ci_access.projects)),
        *((f"ci_access.groups[{i}]", e) for i, e in enumerate(config.ci_access.groups)),
    ]
    if config.ci_access.instance is not None:
        entries.append(("ci_access.instance", config.ci_access.instance))
    program = count = 0
    for key, entry in entries:
        _check_roles_apply(entry, key, config.source)
        count += len(entry.rules)
        if count > MAX_RULES:
            problem = (f"the agent's entries hold more than {MAX_RULES} rules in all (a request tries them in "
                       "order on kasd's event loop)")
            raise AgentConfigError(f"{config.source}: {key}.rules: {problem}", key=f"{key}.rules", problem=problem)
        if entry.rules:
            try:
                rules[(entry.kind, entry.id)] = compile_rules(entry.rules, f"{key}.rules")
            except AgentConfigError as exc:
                if exc.mark is None:  # name the file at least
                    raise AgentConfigError(f"{config.source}: {exc}", key=exc.key, problem=exc.problem) from None
                raise
            program += sum(program_size(rule.if_) for rule in rules[(entry.kind, entry.id)])
            if program > MAX_RULES_PROGRAM:
                problem = (f"the regular expressions of the agent's rules: come to more than {MAX_RULES_PROGRAM} RE2 "
                           "instructions in all (each is matched on kasd's event loop); use fewer or simpler ones")
                raise AgentConfigError(f"{config.source}: {key}.rules: {problem}", key=f"{key}.rules", problem=problem)
    return CompiledAgent(config=config, rules=rules, templates=dict(templates()))


def _check_roles_apply(entry: CiAccessEntry, key: str, source: str) -> None:
    """``roles:`` only where kasd makes a binding (the job acts as itself): for ``agent`` and
    ``impersonate`` it would grant nothing, and a setting that does nothing must not look as if it did."""
    if entry.access_as.mode in ("ci_job", "ci_user"):
        return
    for i, rule in enumerate(entry.rules):
        if rule.roles:
            here, problem = f"{key}.rules[{i}].roles", (f"applies to access_as ci_job or ci_user only (with "
                                                       f"{entry.access_as.mode}, kasd binds nothing: RBAC is the operator's)")
            where = f"{rule.mark}: " if rule.mark is not None else f"{source}: "
            raise AgentConfigError(f"{where}{here}: {problem}", mark=rule.mark, key=here, problem=problem)


def _own_groups(decision: Decision, project: Project, slug: str) -> list[str]:
    """The groups of a job acting as itself that a rules namespace's RoleBinding names: the job's
    environment (``ci_job``), or its project; a ``ci_user`` job's developer role in the project
    (held by maintainers and owners too: role groups list every lower role)."""
    if decision.access_as == "ci_job":
        return [f"gitlab:project_env:{project.id}:{slug}" if slug else f"gitlab:project:{project.id}"]
    if decision.access_as == "ci_user":
        return [f"gitlab:project_role:{project.id}:developer"]
    return []  # the agent itself, or an identity the agent's config names: their RBAC is the operator's


@attrs.frozen(kw_only=True)
class Snapshot:
    directory: Directory
    tokens: TokenChecks
    agents: Mapping[int, CompiledAgent]
    #: warnings the load gave (unknown keys, missing files), logged once per load
    warnings: tuple[str, ...] = ()

    def authorize(self, kind: str, secret: str, agent_id: int, *, now: float) -> Grant:
        """The grant of bearer token ``<kind>:<agent_id>:<secret>``; ``AccessDenied`` otherwise."""
        if kind == "ci":
            return self._job(secret, agent_id, now)
        if kind == "pat":
            return self._user(secret, agent_id, now)
        raise AccessDenied(401, f"bad token: unknown token type {kind!r}")

    def _agent(self, agent_id: int, principal: str) -> CompiledAgent:
        compiled = self.agents.get(agent_id)
        if compiled is None:
            raise AccessDenied(403, f"agent {agent_id} is not known", principal=principal)
        return compiled

    def _keyset(self) -> KeySet:
        if self.tokens.keyset is None:
            raise AccessDenied(401, "bad token: kasd verifies no tokens (authorization.tokens.public_keys is empty)")
        return self.tokens.keyset

    def _verified(self, verify: Callable[..., _Claims], secret: str, what: str, now: float) -> _Claims:
        """``verify``'s claims of ``secret``; ``AccessDenied`` (401) saying which check failed."""
        t = self.tokens
        try:
            claims = verify(secret, self._keyset(), audience=t.audience, issuer=t.issuer, now=now,
                            leeway=t.leeway, revoked=t.revoked)
        except TokenInvalid as exc:
            raise AccessDenied(401, f"bad token: {what} {exc.reason}") from None
        assert claims.stamp is not None
        return claims

    def verify_job(self, secret: str, *, now: float) -> JobClaims:
        """The claims of a valid job token of a job not yet finished; ``AccessDenied`` (401) saying
        which check failed."""
        claims = self._verified(verify_job_token, secret, "CI job token", now)
        assert claims.stamp is not None
        longest = self.tokens.max_job_lifetime.total_seconds()
        if claims.stamp.expires_at - claims.stamp.issued_at > longest:
            raise AccessDenied(401, "bad token: CI job token lives longer than kasd accepts "
                              f"(authorization.tokens.max_job_token_lifetime: {longest:g} s)")
        if self.tokens.finished.until(claims.job_id, now) is not None:
            raise AccessDenied(401, f"bad token: CI job token revoked: job {claims.job_id} is finished",
                         principal=f"ci_job:{claims.job_id}")
        return claims

    def _job(self, secret: str, agent_id: int, now: float) -> Grant:
        return self.decide_job(self.verify_job(secret, now=now), agent_id)

    def decide_job(self, claims: JobClaims, agent_id: int) -> Grant:
        """What agent ``agent_id``'s configuration grants the verified job ``claims``; ``AccessDenied`` (403)."""
        assert claims.stamp is not None
        principal = f"ci_job:{claims.job_id}"
        compiled = self._agent(agent_id, principal)
        decision = authorize_job(self.directory, agent_id, compiled.config, claims, slug=environment_slug)
        if not decision.allowed:
            raise AccessDenied(403, f"forbidden: {decision.reason}", principal=principal)
        namespace = decision.default_namespace
        rules = compiled.rules.get((decision.entry_kind or "", decision.entry_id))
        project = self.directory.project(claims.project)
        assert project is not None  # authorize_job found it
        rules_namespace: str | None = None
        rules_roles: tuple[RoleRef, ...] = ()
        if rules:
            match = first_match(rules, ci_variables(claims, project))
            entry = f"ci_access.{decision.entry_kind}s entry {decision.entry_id}" if decision.entry_id else \
                f"ci_access.{decision.entry_kind}"
            if not match.allowed:
                raise AccessDenied(403, f"forbidden: agent {agent_id} does not allow this job: {entry}: {match.reason}",
                             principal=principal)
            if match.namespace is not None:
                namespace = rules_namespace = match.namespace
                rules_roles = match.roles
        managed = self._managed(compiled, decision, claims, project, rules_namespace, rules_roles)
        if managed is not None and managed.namespace is not None:
            namespace = managed.namespace
        return _grant(decision, kind="ci", namespace=namespace, environment=claims.environment, job=claims,
                      expires_at=claims.stamp.expires_at, managed=managed)

    def _managed(self, compiled: CompiledAgent, decision: Decision, claims: JobClaims, project: Project,
                 rules_namespace: str | None, rules_roles: tuple[RoleRef, ...] = ()) -> ManagedResources | None:
        """What kasd creates for this job: GitLab's form (``resource_management`` on a ``ci_job``
        entry, for a job with an environment: the agent's template) or the rules form (the namespace
        a rule resolved to, bound to the rule's ``roles``); None when neither applies."""
        gitlab_form = decision.resource_management and decision.access_as == "ci_job" and claims.environment
        if not gitlab_form and rules_namespace is None:
            return None
        agent = self.directory.agent(decision.agent_id)
        assert agent is not None  # authorize_job found it
        slug = environment_slug(claims.environment) if claims.environment is not None else ""
        user = self.directory.user(claims.user)
        variables: dict[str, str | int] = {
            "agent.id": agent.id, "agent.name": agent.name, "agent.url": "",
            "environment.id": "", "environment.name": claims.environment or "", "environment.slug": slug,
            "environment.url": "", "environment.page_url": "",
            "environment.tier": (claims.environment_tier or guess_environment_tier(claims.environment))
            if claims.environment is not None else "",
            "project.id": project.id, "project.slug": ref_slug(project.path), "project.path": project.path,
            "project.url": "", "ci_pipeline.id": claims.pipeline_id, "ci_job.id": claims.job_id,
            "user.id": user.id if user is not None and user.id is not None else "", "user.username": claims.user,
        }
        if gitlab_form:
            template = compiled.template()
        else:
            assert rules_namespace is not None
            template = rules_objects(rules_namespace, _own_groups(decision, project, slug), slug, rules_roles)
        objects = render(template, variables)
        names = [o["metadata"]["name"] for o in objects if o.get("kind") == "Namespace" and o.get("apiVersion") == "v1"]
        return ManagedResources(
            agent_id=agent.id, project_id=project.id, environment=claims.environment, slug=slug,
            source="rules" if not gitlab_form else f"resource_management (template {template.name})",
            namespace=names[0] if names else rules_namespace, objects=tuple(objects),
            delete_resources=template.delete_resources)

    def allowed_agents(self, secret: str, *, now: float) -> tuple[JobClaims, list[Grant]]:
        """The job a token proves, and its grant for every agent it may use (in agent id order);
        ``AccessDenied`` (401)
        for a token that proves nothing. What ``GET /api/v4/job/allowed_agents`` and ``kasctl
        kubeconfig`` answer."""
        claims = self.verify_job(secret, now=now)
        allowed: list[Grant] = []
        for agent_id in sorted(self.agents):
            try:
                allowed.append(self.decide_job(claims, agent_id))
            except AccessDenied:
                continue
        return claims, allowed

    def _user(self, secret: str, agent_id: int, now: float) -> Grant:
        claims = self._verified(verify_personal_token, secret, "personal token", now)
        assert claims.stamp is not None  # (a verified token's)
        principal = f"user:{claims.user}"
        compiled = self._agent(agent_id, principal)
        decision = authorize_user(self.directory, agent_id, compiled.config, claims.user)
        if not decision.allowed:
            raise AccessDenied(403, f"forbidden: {decision.reason}", principal=principal)
        return _grant(decision, kind="pat", user=claims.user, expires_at=claims.stamp.expires_at)


def _grant(decision: Decision, *, kind: str, namespace: str | None = None, environment: str | None = None,
           job: JobClaims | None = None, user: str | None = None, expires_at: int,
           managed: ManagedResources | None = None) -> Grant:
    """An allowed ``decision`` with what the rules and the entry resolved, as the one grant."""
    return Grant(kind=kind, agent_id=decision.agent_id, impersonate=decision.identity, subject=decision.principal,
                 access_as=decision.access_as or "agent", namespace=namespace, environment=environment,
                 managed=managed, job=job, user=user, entry_kind=decision.entry_kind, entry_id=decision.entry_id,
                 expires_at=expires_at)
