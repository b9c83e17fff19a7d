"""The decision, as an isolation matrix: principals × agents × configurations, every cell asserted
(most of them denials), then the exact identities of each access_as."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kasd.authz.agentconfig import AgentConfig, parse_agent_config
from kasd.authz.directory import Directory, Role
from kasd.authz.jobtokens import JobClaims
from kasd.authz.policy import (
    CLIENT_IMPERSONATION_REFUSED,
    CLIENT_IMPERSONATION_STATUS,
    Decision,
    allows_client_impersonation,
    authorize_job,
    authorize_user,
    environment_matches,
)
from tunnelhttp.head import Impersonation

pytestmark = pytest.mark.timeout(10)


class _G:
    def __init__(self, path: str, id: int) -> None:
        self.path, self.id = path, id


class _U:
    def __init__(self, username: str, memberships: dict[str, Role], id: int | None = None) -> None:
        self.username, self.memberships, self.id = username, memberships, id


class _A:
    def __init__(self, id: int, name: str, config_project: str) -> None:
        self.id, self.name, self.config_project = id, name, config_project


DIRECTORY = Directory.build(
    groups=[_G("acme", 10), _G("acme/web", 11), _G("acme/web/frontend", 12), _G("other", 20)],
    projects=[_G("acme/infra", 42), _G("acme/web/shop", 43), _G("acme/web/frontend/ui", 44),
              _G("acme/tools", 48), _G("other/tool", 46), _G("other/infra", 47)],
    users=[
        _U("alice", {"acme/web": Role.DEVELOPER}, id=7),
        _U("bob", {"acme": Role.GUEST}),
        _U("carol", {}),
        _U("dave", {"acme/web/shop": Role.MAINTAINER}),
        _U("erin", {"acme": Role.MAINTAINER}),
        _U("frank", {"acme/web/frontend": Role.DEVELOPER}),
    ],
    agents=[_A(1, "prod", "acme/infra"), _A(2, "staging", "other/infra"), _A(3, "web", "acme/infra")],
    require_agent_projects=True,
)

PROD = """\
ci_access:
  projects:
    - id: ACME/web/shop            # paths match whatever their case
      default_namespace: shop
      access_as: {agent: {}}
      environments: [production, "review/*"]
      protected_branches_only: true
      rules: [{if: '$CI_COMMIT_BRANCH == "main"', namespace: shop-main}]
  groups:
    - id: acme/web
      access_as: {ci_job: {}}
      resource_management: {enabled: true}
user_access:
  access_as: {user: {}}
  projects: [{id: acme/web/shop}]
  groups: [{id: acme/web}]
"""
STAGING = ""  # no configuration: only its own config project's jobs
WEB = """\
ci_access:
  groups:
    - id: acme
      access_as: {ci_user: {}}
      protected_branches_only: true
  instance:
    access_as:
      impersonate:
        username: sandbox-deployer
        uid: "1001"
        groups: [sandboxes]
        extra: [{key: example.com/purpose, val: [sandbox, demo]}]
    environments: [sandbox]
user_access:
  access_as: {agent: {}}
  groups: [{id: acme}]
"""
CONFIGS: dict[int, AgentConfig] = {
    1: parse_agent_config(PROD, "prod/config.yaml").config,
    2: parse_agent_config(STAGING, "staging/config.yaml").config,
    3: parse_agent_config(WEB, "web/config.yaml").config,
    9: AgentConfig(source="ghost"),
}


def slug(name: str) -> str:
    """A stand-in for GitLab's CI_ENVIRONMENT_SLUG (the real one is kasd.authz.slugs)."""
    return "".join(c if c.isalnum() else "-" for c in name.lower())[:24]


def job(project: str, *, env: str | None = None, tier: str | None = None, protected: bool = False,
        project_id: int | None = None, user: str = "alice") -> JobClaims:
    return JobClaims(project=project, project_id=project_id, job_id=1001, pipeline_id=501, user=user, ref="main",
               ref_type="branch", protected=protected, environment=env, environment_tier=tier)


# (case, job, agent id, expected): expected is (entry kind, entry id, access_as) when allowed, or a
# piece of the denial's reason
JOB_MATRIX: list[tuple[str, JobClaims, int, Any]] = [
    ("project entry, its environment, protected", job("acme/web/shop", env="production", protected=True), 1,
     ("project", "ACME/web/shop", "agent")),
    ("project entry, unprotected ref", job("acme/web/shop", env="production"), 1,
     "only on protected branches and tags (protected_branches_only), and branch 'main' is not protected"),
    ("project entry refuses another environment; the group entry is not consulted",
     job("acme/web/shop", env="staging", protected=True), 1,
     "does not allow CI/CD jobs of project acme/web/shop in environment 'staging'"),
    ("environment wildcard", job("acme/web/shop", env="review/fix-42", protected=True), 1,
     ("project", "ACME/web/shop", "agent")),
    ("wildcard is anchored", job("acme/web/shop", env="pre-review/x", protected=True), 1, "in environment 'pre-review/x'"),
    ("environment names are case-sensitive", job("acme/web/shop", env="Production", protected=True), 1,
     "in environment 'Production'"),
    ("an entry with environments refuses a job without one", job("acme/web/shop", protected=True), 1,
     "only in certain environments, and this job has no environment"),
    ("a group entry covers its subgroups' projects", job("acme/web/frontend/ui"), 1, ("group", "acme/web", "ci_job")),
    ("the agent's own config project, implicitly", job("acme/infra"), 1, ("implicit", None, "agent")),
    ("a project beside the authorized group", job("acme/tools"), 1, "not configured to allow this project's CI/CD jobs"),
    ("another group's project", job("other/tool"), 1, "does not authorize project other/tool"),
    ("another agent's config project", job("other/infra"), 1, "does not authorize project other/infra"),
    ("one project's job against another project's agent", job("acme/infra"), 2, "does not authorize project acme/infra"),
    ("an agent without config.yaml, its own project", job("other/infra"), 2, ("implicit", None, "agent")),
    ("an agent without config.yaml, a sibling project", job("other/tool"), 2, "does not authorize project other/tool"),
    ("an agent without config.yaml, elsewhere", job("acme/web/shop", env="production", protected=True), 2,
     "does not authorize project acme/web/shop"),
    ("the nearest group entry beats the instance entry", job("acme/web/shop", env="sandbox", protected=True), 3,
     ("group", "acme", "ci_user")),
    ("the group entry refuses; the instance entry is not consulted", job("acme/web/shop", env="sandbox"), 3,
     "only on protected branches and tags"),
    ("a subgroup's project, unprotected", job("acme/web/frontend/ui"), 3, "only on protected branches and tags"),
    ("the instance entry", job("other/tool", env="sandbox"), 3, ("instance", None, "impersonate")),
    ("the instance entry's environments", job("other/tool", env="production"), 3, "in environment 'production'"),
    ("the instance entry, no environment", job("other/tool"), 3, "this job has no environment"),
    ("the implicit entry beats the group entry", job("acme/infra"), 3, ("implicit", None, "agent")),
    ("a project kasd does not know", job("ghost/app"), 1, "the job's project 'ghost/app' is not known to kasd"),
    ("a token whose project id is not the project's", job("acme/web/frontend/ui", project_id=43), 1,
     "the job token's project id 43 is not project 'acme/web/frontend/ui''s"),
    ("an agent kasd does not know", job("acme/infra"), 9, "agent 9 is not known"),
]


@pytest.mark.parametrize(("case", "the_job", "agent_id", "expected"), JOB_MATRIX, ids=[row[0] for row in JOB_MATRIX])
def test_job_matrix(case: str, the_job: JobClaims, agent_id: int, expected: Any) -> None:
    decision = authorize_job(DIRECTORY, agent_id, CONFIGS[agent_id], the_job, slug=slug)
    assert decision.agent_id == agent_id and decision.principal == "ci_job:1001"
    if isinstance(expected, tuple):
        assert decision.allowed, decision.reason
        assert (decision.entry_kind, decision.entry_id, decision.access_as) == expected
    else:
        assert not decision.allowed
        assert expected in decision.reason, decision.reason
        assert decision.identity is None and decision.access_as is None


def test_the_matrix_is_mostly_denials() -> None:
    grants = sum(isinstance(row[3], tuple) for row in JOB_MATRIX)
    assert grants < len(JOB_MATRIX) - grants


def test_a_project_entry_is_never_merged_with_its_group_entry() -> None:
    decision = authorize_job(DIRECTORY, 1, CONFIGS[1], job("acme/web/shop", env="production", protected=True), slug=slug)
    # the group entry's ci_job and resource_management do not leak into the project entry's decision
    assert decision.access_as == "agent" and decision.identity is None and not decision.resource_management
    assert decision.default_namespace == "shop"
    assert [r.namespace for r in decision.rules] == ["shop-main"]
    group = authorize_job(DIRECTORY, 1, CONFIGS[1], job("acme/web/frontend/ui"), slug=slug)
    assert group.resource_management and group.default_namespace is None and group.rules == ()


# ---------------------------------------------------------------------------- identities


def test_ci_job_identity_with_an_environment() -> None:
    decision = authorize_job(DIRECTORY, 1, CONFIGS[1],
                             job("acme/web/frontend/ui", env="Review/Fix 7", tier="development"), slug=slug)
    assert decision.identity is not None
    assert (decision.identity.user, decision.identity.groups) == (
        "gitlab:ci_job:1001",
        (
            "gitlab:ci_job",
            "gitlab:group:10", "gitlab:group_env_tier:10:development",
            "gitlab:group:11", "gitlab:group_env_tier:11:development",
            "gitlab:group:12", "gitlab:group_env_tier:12:development",
            "gitlab:project:44", "gitlab:project_env:44:review-fix-7", "gitlab:project_env_tier:44:development",
        ),
    )
    assert list(decision.identity.extra) == [
        ("agent.gitlab.com/id", ("1",)),
        ("agent.gitlab.com/config_project_id", ("42",)),
        ("agent.gitlab.com/project_id", ("44",)),
        ("agent.gitlab.com/ci_pipeline_id", ("501",)),
        ("agent.gitlab.com/ci_job_id", ("1001",)),
        ("agent.gitlab.com/username", ("alice",)),
        ("agent.gitlab.com/environment_slug", ("review-fix-7",)),
        ("agent.gitlab.com/environment_tier", ("development",)),
    ]
    assert not allows_client_impersonation(decision)


def test_ci_job_identity_without_an_environment_or_tier() -> None:
    bare = authorize_job(DIRECTORY, 1, CONFIGS[1], job("acme/web/frontend/ui"), slug=slug).identity
    assert bare is not None
    assert bare.groups == ("gitlab:ci_job", "gitlab:group:10", "gitlab:group:11", "gitlab:group:12", "gitlab:project:44")
    assert "agent.gitlab.com/environment_slug" not in dict(bare.extra)
    no_tier = authorize_job(DIRECTORY, 1, CONFIGS[1], job("acme/web/frontend/ui", env="qa"), slug=slug).identity
    assert no_tier is not None
    assert no_tier.groups[-2:] == ("gitlab:project:44", "gitlab:project_env:44:qa")
    assert dict(no_tier.extra)["agent.gitlab.com/environment_slug"] == ("qa",)
    assert "agent.gitlab.com/environment_tier" not in dict(no_tier.extra)


def test_ci_user_identity() -> None:
    decision = authorize_job(DIRECTORY, 3, CONFIGS[3], job("acme/web/shop", env="sandbox", tier="testing",
                                                           protected=True), slug=slug)
    assert decision.identity is not None
    assert decision.identity.user == "gitlab:user:alice"
    assert decision.identity.groups == (
        "gitlab:user",
        "gitlab:project_role:43:guest", "gitlab:project_role:43:reporter", "gitlab:project_role:43:developer",
        "gitlab:group_role:11:guest", "gitlab:group_role:11:reporter", "gitlab:group_role:11:developer",
    )
    assert [key for key, _ in decision.identity.extra][:2] == ["agent.gitlab.com/id", "agent.gitlab.com/config_project_id"]
    assert dict(decision.identity.extra)["agent.gitlab.com/id"] == ("3",)
    assert dict(decision.identity.extra)["agent.gitlab.com/environment_tier"] == ("testing",)
    stranger = authorize_job(DIRECTORY, 3, CONFIGS[3], job("acme/web/shop", protected=True, user="zed"), slug=slug)
    assert stranger.identity is not None and stranger.identity.groups == ("gitlab:user",)


def test_impersonate_identity_is_as_configured() -> None:
    decision = authorize_job(DIRECTORY, 3, CONFIGS[3], job("other/tool", env="sandbox"), slug=slug)
    assert decision.identity == Impersonation(
        user="sandbox-deployer", groups=("sandboxes",), uid="1001", extra=(("example.com/purpose", ("sandbox", "demo")),))
    # the decision's identity is the value the proxy sends: these are the headers agentd adds
    assert decision.identity.headers() == (
        ("impersonate-user", "sandbox-deployer"), ("impersonate-group", "sandboxes"), ("impersonate-uid", "1001"),
        ("impersonate-extra-example.com%2Fpurpose", "sandbox"), ("impersonate-extra-example.com%2Fpurpose", "demo"))
    assert not allows_client_impersonation(decision)


def test_agent_mode_has_no_identity_and_lets_the_client_impersonate() -> None:
    decision = authorize_job(DIRECTORY, 1, CONFIGS[1], job("acme/infra"), slug=slug)
    assert decision.allowed and decision.identity is None and allows_client_impersonation(decision)
    denied = authorize_job(DIRECTORY, 1, CONFIGS[1], job("other/tool"), slug=slug)
    assert not allows_client_impersonation(denied)
    assert CLIENT_IMPERSONATION_STATUS == 400 and "Impersonate-*" in CLIENT_IMPERSONATION_REFUSED


# ---------------------------------------------------------------------------- personal tokens

USER_MATRIX: list[tuple[str, str, int, Any]] = [
    ("no membership anywhere", "carol", 1, "needs at least the Developer role"),
    ("guest in the authorized group's parent", "bob", 1, "needs at least the Developer role"),
    ("guest in the authorized group", "bob", 3, "needs at least the Developer role"),
    ("developer via the authorized group", "alice", 1, "user"),
    ("developer in a subgroup only, not the authorized group", "frank", 1, "needs at least the Developer role"),
    ("developer of acme/web is no member of acme", "alice", 3, "needs at least the Developer role"),
    ("maintainer of the authorized project only", "dave", 1, "user"),
    ("maintainer via the authorized group, agent mode", "erin", 3, "agent"),
    ("a user kasd does not know", "zed", 1, "user 'zed' is not known to kasd"),
    ("an agent without user_access", "erin", 2, "agent 2 is not configured for user access (user_access)"),
    ("an agent kasd does not know", "alice", 9, "agent 9 is not known"),
]


@pytest.mark.parametrize(("case", "username", "agent_id", "expected"), USER_MATRIX, ids=[row[0] for row in USER_MATRIX])
def test_user_matrix(case: str, username: str, agent_id: int, expected: str) -> None:
    decision = authorize_user(DIRECTORY, agent_id, CONFIGS[agent_id], username)
    assert decision.principal == f"user:{username}"
    if expected in ("user", "agent"):
        assert decision.allowed and decision.access_as == expected and decision.entry_kind == "user_access"
    else:
        assert not decision.allowed and expected in decision.reason, decision.reason


def test_user_identity() -> None:
    alice = authorize_user(DIRECTORY, 1, CONFIGS[1], "alice").identity
    assert alice is not None
    assert (alice.user, alice.groups) == (
        "gitlab:user:alice",
        ("gitlab:user",
                "gitlab:project_role:43:guest", "gitlab:project_role:43:reporter", "gitlab:project_role:43:developer",
                "gitlab:group_role:11:guest", "gitlab:group_role:11:reporter", "gitlab:group_role:11:developer"),
    )
    assert list(alice.extra) == [
        ("agent.gitlab.com/id", ("1",)),
        ("agent.gitlab.com/username", ("alice",)),
        ("agent.gitlab.com/access_type", ("personal_access_token",)),
        ("agent.gitlab.com/config_project_id", ("42",)),
    ]
    dave = authorize_user(DIRECTORY, 1, CONFIGS[1], "dave").identity
    assert dave is not None and dave.groups == ("gitlab:user", "gitlab:project_role:43:guest", "gitlab:project_role:43:reporter",
                                                "gitlab:project_role:43:developer", "gitlab:project_role:43:maintainer")
    erin = authorize_user(DIRECTORY, 3, CONFIGS[3], "erin")
    assert erin.identity is None and allows_client_impersonation(erin)


@pytest.mark.parametrize(("pattern", "environment", "matches"), [
    ("production", "production", True),
    ("production", "production-2", False),
    ("review/*", "review/a/b", True),
    ("review/*", "review/", True),
    ("*", "anything", True),
    ("*-prod", "eu-prod", True),
    ("*-prod", "eu-prod-2", False),
    ("a.b", "axb", False),  # only * is special
    ("review/*", None, False),
    ("a*b*c", "abc", True),
    ("a*b*c", "aXbYbZc", True),
    ("a*b*c", "acb", False),
    ("ab*ba", "aba", False),  # the start and the end may not overlap
    ("ab*ba", "abba", True),
    ("a**b", "ab", True),
    ("*a*", "bab", True),
    ("*a*", "bbb", False),
])
def test_environment_matching(pattern: str, environment: str | None, matches: bool) -> None:
    assert environment_matches(pattern, environment) is matches


def test_environment_matching_takes_time_linear_in_the_name() -> None:
    """Many ``*`` against a name that almost matches: a backtracking regular expression took 3.3 s
    here (43 s with two more ``*a``), on kasd's event loop, for each request of such a job."""
    started = time.perf_counter()
    assert not environment_matches("*a" * 8 + "*b", "a" * 40)
    assert environment_matches("*a" * 8 + "*b", "a" * 40 + "b")
    assert time.perf_counter() - started < 0.1


def test_decisions_are_values() -> None:
    decision = authorize_job(DIRECTORY, 1, CONFIGS[1], job("acme/infra"), slug=slug)
    assert isinstance(decision, Decision)
    assert decision == authorize_job(DIRECTORY, 1, CONFIGS[1], job("acme/infra"), slug=slug)
