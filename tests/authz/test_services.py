"""``services:`` of an agent's config.yaml: who may use which in-cluster service (a table of cases),
and the file's errors naming file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from kasctl.authsetup import AuthSetup
from kasd.authority import load_authorization
from kasd.authz.agentconfig import AgentConfigError, parse_agent_config
from kasd.authz.jobtokens import JobClaims
from kasd.authz.servicepolicy import authorize_service_job, authorize_service_user
from kasd.authz.snapshot import Snapshot
from kasd.config import config_from_mapping
from kasd.tokens import hash_token

pytestmark = pytest.mark.timeout(10)

CONFIG = """
ci_access:
  projects: [{id: acme/tools}]          # may use the agent, but no service: services are granted by name
user_access:
  projects: [{id: acme/tools}]
services:
  - name: prometheus
    ci_access:
      projects: [{id: acme/web/shop, environments: [production, "review/*"]}]
      groups: [{id: acme}]
    user_access:
      groups: [{id: acme/web}]
  - name: grafana
    user_access:
      projects: [{id: acme/tools}]
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Snapshot:
    auth = AuthSetup(tmp_path_factory.mktemp("services"))
    auth.agent_config("acme/infra", "prod", CONFIG)
    config = config_from_mapping({
        "agents": [{"id": 1, "name": "prod", "config_project": "acme/infra", "token_sha256": hash_token("a1")}],
        "groups": [{"path": "acme", "id": 10}, {"path": "acme/web", "id": 11}, {"path": "other", "id": 20}],
        "projects": [{"path": "acme/infra", "id": 40}, {"path": "acme/web/shop", "id": 41},
                     {"path": "acme/tools", "id": 42}, {"path": "other/app", "id": 50}],
        "users": [{"username": "alice", "memberships": {"acme/web": "developer"}},
                  {"username": "bob", "memberships": {"acme/web": "reporter", "acme/tools": "maintainer"}},
                  {"username": "carol"}],
        **auth.kasd_settings(),
    })
    return load_authorization(config, None).snapshot


def _job(project: str, environment: str | None = None) -> JobClaims:
    return JobClaims(project=project, job_id=9, pipeline_id=3, user="alice", ref="main", environment=environment)


@pytest.mark.parametrize(("project", "environment", "service", "agent", "status", "why"), [
    # the project's own entry decides, with its environments
    ("acme/web/shop", "production", "prometheus", 1, 200, "projects entry acme/web/shop"),
    ("acme/web/shop", "review/feat-1", "prometheus", 1, 200, "projects entry acme/web/shop"),
    ("acme/web/shop", "staging", "prometheus", 1, 403, "not in environment 'staging'"),
    ("acme/web/shop", None, "prometheus", 1, 403, "not without an environment"),
    # the nearest group entry above: any environment
    ("acme/tools", None, "prometheus", 1, 200, "groups entry acme"),
    # the agent's own ci_access lets acme/tools in, but grafana lists no CI access
    ("acme/tools", None, "grafana", 1, 403, "does not allow CI/CD jobs of project acme/tools"),
    # the agent's config project: no implicit access to a service
    ("acme/infra", None, "grafana", 1, 403, "does not allow CI/CD jobs of project acme/infra"),
    ("other/app", None, "prometheus", 1, 403, "does not allow CI/CD jobs of project other/app"),
    ("acme/web/shop", "production", "loki", 1, 404, "404 Service Not Found"),
    ("acme/web/shop", "production", "prometheus", 2, 404, "404 Agent Not Found"),
])
def test_a_ci_job_may_use_a_service_its_project_or_group_is_listed_for(
        world: Snapshot, project: str, environment: str | None, service: str, agent: int, status: int,
        why: str) -> None:
    compiled = world.agents.get(agent)
    decision = authorize_service_job(world.directory, agent, compiled.config if compiled else None, service,
                                     _job(project, environment))
    assert (decision.status, decision.principal) == (status, "ci_job:9")
    assert why in decision.reason


@pytest.mark.parametrize(("user", "service", "status", "why"), [
    ("alice", "prometheus", 200, "user_access group acme/web"),   # developer of the group
    ("bob", "prometheus", 403, "needs at least the Developer role"),  # reporter only
    ("bob", "grafana", 200, "user_access project acme/tools"),
    ("alice", "grafana", 403, "needs at least the Developer role"),  # user_access of the agent is not the service's
    ("carol", "prometheus", 403, "needs at least the Developer role"),
    ("nobody", "prometheus", 403, "needs at least the Developer role"),
    ("alice", "loki", 404, "404 Service Not Found"),
])
def test_a_user_needs_developer_on_a_listed_project_or_group(world: Snapshot, user: str, service: str, status: int,
                                                            why: str) -> None:
    decision = authorize_service_user(world.directory, 1, world.agents[1].config, service, user)
    assert (decision.status, decision.principal) == (status, f"user:{user}")
    assert why in decision.reason


@pytest.mark.parametrize(("text", "error"), [
    ("services: {name: x}", "x.yaml:1:11: services: must be a list of services, got a mapping"),
    ("services: [{name: Prom}]", "x.yaml:1:19: services[0].name: is not a service name"),
    ("services: [{ci_access: {}}]", "x.yaml:1:12: services[0].name: missing"),
    ("services: [{name: p}, {name: p}]", "x.yaml:1:30: services[1].name: 'p' is already services[0].name"),
    ("services: [{name: p, ci_access: {projects: [{id: a/b, env: []}]}}]",
     "services[0].ci_access.projects[0].env: unknown key (expected one of: id, environments)"),
    ("services: [{name: p, ci_access: {instance: {}}}]", "services[0].ci_access.instance: unknown key"),
    ("services: [{name: p, user_access: {groups: [{id: 3}]}}]",
     "services[0].user_access.groups[0].id: must be a string"),
    ("services: [{name: p, ci_access: {groups: [{id: a}, {id: A}]}}]",
     "services[0].ci_access.groups[1].id: 'A' is already services[0].ci_access.groups[0]"),
    ("services: [{name: p, user_acess: {}}]", "services[0].user_acess: unknown key (did you mean user_access?"),
])
def test_a_bad_services_section_names_file_line_and_key(text: str, error: str) -> None:
    with pytest.raises(AgentConfigError) as caught:
        parse_agent_config(text, "x.yaml")
    assert error in str(caught.value)


def test_an_agent_config_without_services_grants_none(tmp_path: Path) -> None:
    config = parse_agent_config("ci_access: {instance: {}}\n", str(tmp_path / "c.yaml")).config
    assert config.services == ()
