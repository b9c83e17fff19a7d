"""Managed namespaces, applied: before a CI job's first request through an agent, kasd creates the
objects of its environment's template (or its rules namespace) through the tunnel as the agent —
dry-run first, create-or-get, once under concurrency — and `POST .../environments/<name>/stop`
deletes only what kasd made. A real kasd, a real agentd and kubesim (enforcing RBAC) in-process."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from agentd.kubeapi import kubeconfig_target
from kasctl.authsetup import AuthSetup
from kasd.authz.expand import RoleRef
from kasd.authz.slugs import environment_slug
from kasd.authz.templates import VARIABLES, ManagedResources, render, rules_objects
from kasd.config import config_from_mapping
from kasd.managed.client import AgentClient, Answer
from kasd.managed.objects import users_of
from kasd.managed.provisioner import AgentProvisioner, ProvisionLimits
from kasd.restpaths import stop_path
from kasd.server import Runtime
from kasd.store.made import MadeObjects
from kasd.tokens import hash_token
from kubesim.server import KubeSim, open_kubesim
from tests.agentd.harness import AGENT_TOKEN, SIM_TOKEN, agent_config, running_agent
from tests.kasd.helpers import Reply, bearer, http_request, running_kasd, wait_sessions

pytestmark = pytest.mark.timeout(30)

ENV = "review/feat-x"
SLUG = environment_slug(ENV)
NAMESPACE = f"{SLUG}-42-7"  # the built-in template's {{ .environment.slug }}-{{ .project.id }}-{{ .agent.id }}
MANAGED = """\
ci_access:
  projects:
    - id: group/app
      access_as: {ci_job: {}}
      environments: ["review/*"]
      resource_management: {enabled: true}
"""


@asynccontextmanager
async def _stack(tmp_path: Path, agent_yaml: str = MANAGED, templates: dict[str, str] | None = None,
                 ) -> AsyncIterator[tuple[Runtime, KubeSim, AuthSetup]]:
    auth = AuthSetup(tmp_path / "auth")
    config_file = auth.agent_config("group/infra", "prod", agent_yaml)
    for name, text in (templates or {}).items():
        (config_file.parent / "environment_templates").mkdir(exist_ok=True)
        (config_file.parent / "environment_templates" / f"{name}.yaml").write_text(text)
    config = config_from_mapping({
        "listeners": {"agent": {"address": "127.0.0.1:0"}, "observability": {"address": "127.0.0.1:0"},
                      "kubernetes_api": {"address": "127.0.0.1:0"}, "api": {"address": "127.0.0.1:0"}},
        "agents": [{"id": 7, "name": "prod", "config_project": "group/infra", "token_sha256": hash_token(AGENT_TOKEN)}],
        "groups": [{"path": "group", "id": 10}],
        "projects": [{"path": "group/infra", "id": 1}, {"path": "group/app", "id": 42}],
        **auth.kasd_settings(), "agent_wait_timeout": 5, "shutdown_timeout": 5,
    })
    async with open_kubesim(token=SIM_TOKEN, bookmark_interval=3600) as sim, running_kasd(config) as kasd, \
            trio.open_nursery() as nursery:
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        async with running_agent(nursery, agent_config(tmp_path, kasd.agent_url), kubeconfig_target(tmp_path / "kubeconfig")):
            await wait_sessions(kasd, 7, 1)
            yield kasd, sim, auth
        nursery.cancel_scope.cancel()


def _provisioner(client: AgentClient, made: MadeObjects | None = None) -> AgentProvisioner:
    """Another replica's provisioner, with kasd's deadlines."""
    return AgentProvisioner(client, limits=ProvisionLimits(), made=made)


def _job(auth: AuthSetup, environment: str | None = ENV, job_id: int = 5) -> str:
    return f"ci:7:{auth.job_token('group/app', job_id=job_id, user='alice', environment=environment)}"


async def _call(kasd: Runtime, token: str, method: str, target: str, body: dict[str, Any] | None = None) -> Reply:
    headers = [bearer(token)]
    payload = b""
    if body is not None:
        payload = json.dumps(body).encode()
        headers.append(("content-type", "application/json"))
    return await http_request(kasd.port("kubernetes_api"), method, target, headers, payload)


def _creates(sim: KubeSim, path: str) -> int:
    """How many real (not dry-run) creates kubesim served at ``path``."""
    return sum(1 for r in sim.requests if r.method == "POST" and r.path == path and "dryRun" not in r.query)


def _stored(sim: KubeSim, group: str, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
    return sim.store.find(sim.store.kind(group, plural), namespace, name)


async def test_concurrent_first_requests_create_the_environment_once_and_the_job_works_in_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kasd.audit")
    async with _stack(tmp_path) as (kasd, sim, auth):
        token = _job(auth)
        answers: list[Reply] = []

        async def one() -> None:
            answers.append(await _call(kasd, token, "GET", f"/api/v1/namespaces/{NAMESPACE}/pods"))

        async with trio.open_nursery() as nursery:
            for _ in range(12):
                nursery.start_soon(one)
        assert [a.status for a in answers] == [200] * 12, [a.body[:200] for a in answers]
        assert _creates(sim, "/api/v1/namespaces") == 1
        assert _creates(sim, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings") == 1
        namespace = _stored(sim, "", "namespaces", None, NAMESPACE)
        assert namespace is not None
        labels = namespace["metadata"]["labels"]
        assert labels["kasd.gitlab-agent.io/managed-by"] == "kasd"
        for label in ("agent.gitlab.com/id-7", "agent.gitlab.com/project_id-42",
                      f"agent.gitlab.com/env-{SLUG}-42-7", f"agent.gitlab.com/environment_slug-{SLUG}"):
            assert labels[label] == ""
        annotation = json.loads(namespace["metadata"]["annotations"][f"agent.gitlab.com/env-{SLUG}-42-7"])
        assert annotation["environment_name"] == ENV and annotation["template_name"] == "default"
        binding = _stored(sim, "rbac.authorization.k8s.io", "rolebindings", NAMESPACE, f"bind-{SLUG}-42-7")
        assert binding is not None
        assert binding["subjects"][0]["name"] == f"gitlab:project_env:42:{SLUG}"
        assert binding["roleRef"]["name"] == "admin"
        # kubesim's RBAC: the job (ci_job access) is admin in its namespace and nothing elsewhere
        made = await _call(kasd, token, "POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps",
                           {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app"}})
        assert made.status == 201, made.body
        elsewhere = await _call(kasd, token, "GET", "/api/v1/namespaces/default/configmaps")
        assert elsewhere.status == 403
        assert elsewhere.json()["message"] == ('configmaps is forbidden: User "gitlab:ci_job:5" cannot list resource '
                                               '"configmaps" in API group "" in the namespace "default"')
    created = [r.getMessage() for r in caplog.records if r.getMessage().startswith("managed resource created")]
    assert len(created) == 2, created
    assert all("agent=7 project_id=42 environment=review/feat-x" in line and "outcome=created" in line
               for line in created), created
    assert not any(t in line for line in created for t in (token, token.split(":", 2)[2]))


async def test_stop_deletes_only_what_kasd_made(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kasd.audit")
    template = """\
objects:
  - apiVersion: v1
    kind: Namespace
    metadata: {name: 'env-{{ .environment.slug }}'}
  - apiVersion: v1
    kind: Namespace
    metadata: {name: shared-tools}
  - apiVersion: v1
    kind: ServiceAccount
    metadata: {name: deployer, namespace: 'env-{{ .environment.slug }}'}
  - apiVersion: rbac.authorization.k8s.io/v1
    kind: RoleBinding
    metadata: {name: job-edit, namespace: 'env-{{ .environment.slug }}'}
    subjects: [{kind: Group, apiGroup: rbac.authorization.k8s.io, name: 'gitlab:project_env:{{ .project.id }}:{{ .environment.slug }}'}]
    roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}
delete_resources: on_stop
"""
    namespace = f"env-{SLUG}"
    async with _stack(tmp_path, templates={"default": template}) as (kasd, sim, auth):
        # shared-tools exists already (an operator made it): kasd uses it, never adopts it.
        sim.store.create(sim.store.kind("", "namespaces"), None, {"metadata": {"name": "shared-tools"}})
        token = _job(auth)
        first = await _call(kasd, token, "GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/deployer")
        assert first.status == 200, first.body
        api = kasd.port("api")
        secret = token.split(":", 2)[2]
        wrong_env = auth.job_token("group/app", job_id=6, user="alice", environment="review/other")
        for headers, path, status in (
            ([], stop_path("group/app", ENV), 401),
            ([("job-token", wrong_env)], stop_path("group/app", ENV), 403),
            ([("job-token", secret)], stop_path("group/infra", ENV), 403),
        ):
            refused = await http_request(api, "POST", path, headers)
            assert refused.status == status, refused.body
        assert _stored(sim, "", "serviceaccounts", namespace, "deployer") is not None  # nothing deleted
        stopped = await http_request(api, "POST", stop_path("group/app", ENV), [("job-token", secret)])
        assert stopped.status == 200, stopped.body
        (agent,) = stopped.json()["agents"]
        assert agent["id"] == 7 and agent["namespace"] == namespace
        assert agent["deleted"] == [f"RoleBinding {namespace}/job-edit", f"ServiceAccount {namespace}/deployer",
                                    f"Namespace {namespace}"]
        assert agent["kept"] == ["Namespace shared-tools"]
        assert _stored(sim, "", "namespaces", None, "shared-tools") is not None
        assert _stored(sim, "", "namespaces", None, namespace) is None
        again = await http_request(api, "POST", stop_path("42", ENV), [("job-token", secret)])
        assert again.json()["agents"][0]["absent"] == [f"RoleBinding {namespace}/job-edit",
                                                      f"ServiceAccount {namespace}/deployer", f"Namespace {namespace}"]
        # The next request of a job in that environment makes them again.
        assert (await _call(kasd, token, "GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/deployer")).status == 200
    deleted = [r.getMessage() for r in caplog.records if r.getMessage().startswith("managed resource deleted")]
    assert any("name=shared-tools outcome=kept:not-made-by-kasd" in line for line in deleted), deleted


async def test_a_dry_run_refusal_creates_nothing_and_tells_the_job(tmp_path: Path) -> None:
    template = """\
objects:
  - apiVersion: v1
    kind: Namespace
    metadata: {name: 'ok-{{ .environment.slug }}'}
  - apiVersion: v1
    kind: Namespace
    metadata: {name: 'Not_A_Label-{{ .environment.slug }}'}
"""
    async with _stack(tmp_path, templates={"default": template}) as (kasd, sim, auth):
        answers: list[Reply] = []

        async def one() -> None:
            answers.append(await _call(kasd, _job(auth), "GET", "/api/v1/namespaces/default/pods"))

        async with trio.open_nursery() as nursery:  # the same plan, asked for at once
            for _ in range(6):
                nursery.start_soon(one)
        assert len({(a.status, a.body) for a in answers}) == 1
        # the first tried; those queued behind it got its answer without asking the cluster again
        dry_runs = [r for r in sim.requests if r.method == "POST" and r.path == "/api/v1/namespaces"]
        assert len(dry_runs) == 2, dry_runs  # ok-…, then Not_A_Label-…: once
        answer = answers[0]
        assert answer.status == 422, answer.body
        status = answer.json()
        assert status["reason"] == "Invalid"
        assert status["message"].startswith(
            f"cannot create Namespace Not_A_Label-{SLUG} for this job's environment (agent 7, dry run): ")
        assert _stored(sim, "", "namespaces", None, f"ok-{SLUG}") is None  # the valid one was not made either
        assert _creates(sim, "/api/v1/namespaces") == 0


async def test_nothing_is_granted_in_a_namespace_kasd_did_not_make(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A rule built from what a developer picks (the branch) could name kube-system: kasd uses the
    # namespace as it is and adds nothing to it.
    caplog.set_level(logging.INFO, logger="kasd.audit")
    rules = ("ci_access:\n  projects:\n    - id: group/app\n      access_as: {ci_job: {}}\n"
             "      rules:\n        - namespace: $CI_COMMIT_REF_SLUG\n")
    async with _stack(tmp_path, agent_yaml=rules) as (kasd, sim, auth):
        token = f"ci:7:{auth.job_token('group/app', job_id=9, user='alice', ref='kube-system')}"
        answer = await _call(kasd, token, "GET", "/api/v1/namespaces/kube-system/secrets")
        assert answer.status == 403, answer.body
        assert _stored(sim, "rbac.authorization.k8s.io", "rolebindings", "kube-system", "gitlab-job-access") is None
        kube_system = _stored(sim, "", "namespaces", None, "kube-system")
        assert kube_system is not None and "kasd.gitlab-agent.io/managed-by" not in (kube_system["metadata"].get("labels") or {})
        # and a stop of such a job deletes nothing there
        plan_stop = await http_request(kasd.port("api"), "POST", stop_path("group/app", "none"),
                                       [("job-token", token.split(":", 2)[2])])
        assert plan_stop.status == 403
        assert plan_stop.json()["message"] == "403 Forbidden: the job token has no environment; 'none' cannot be stopped with it"
    lines = [r.getMessage() for r in caplog.records]
    assert any("kind=Namespace" in line and "name=kube-system outcome=exists" in line for line in lines), lines
    assert any("kind=RoleBinding namespace=kube-system" in line and "outcome=skipped:namespace-not-made-by-kasd" in line
               for line in lines), lines


async def test_environments_sharing_a_rules_namespace_each_get_their_binding_and_keep_it(tmp_path: Path) -> None:
    rules = ("ci_access:\n  projects:\n    - id: group/app\n      access_as: {ci_job: {}}\n"
             "      rules:\n        - namespace: shared\n")
    async with _stack(tmp_path, agent_yaml=rules) as (kasd, sim, auth):
        a, b = _job(auth, "review/a", job_id=1), _job(auth, "review/b", job_id=2)
        for token, name in ((a, "from-a"), (b, "from-b")):
            made = await _call(kasd, token, "POST", "/api/v1/namespaces/shared/configmaps",
                               {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
            assert made.status == 201, made.body
        api = kasd.port("api")
        stopped = await http_request(api, "POST", stop_path("group/app", "review/a"), [("job-token", a.split(":", 2)[2])])
        (agent,) = stopped.json()["agents"]
        assert agent["deleted"] == [f"RoleBinding shared/gitlab-job-access-{environment_slug('review/a')}"]
        assert agent["kept"] == ["Namespace shared"]  # review/b's binding is still in it
        assert (await _call(kasd, b, "GET", "/api/v1/namespaces/shared/configmaps/from-a")).status == 200
        # review/a made the namespace; once review/b stops too, nothing holds it: it goes
        stopped = await http_request(api, "POST", stop_path("group/app", "review/b"), [("job-token", b.split(":", 2)[2])])
        (agent,) = stopped.json()["agents"]
        assert agent["deleted"] == [f"RoleBinding shared/gitlab-job-access-{environment_slug('review/b')}",
                                    "Namespace shared"]
        assert _stored(sim, "", "namespaces", None, "shared") is None
        assert (await _call(kasd, a, "GET", "/api/v1/namespaces/shared/configmaps")).status == 200  # made again


async def test_the_rules_form_creates_the_namespace_a_rule_resolved_to(tmp_path: Path) -> None:
    rules = """\
ci_access:
  projects:
    - id: group/app
      access_as: {ci_job: {}}
      rules:
        - namespace: ci-$CI_PROJECT_ID-$CI_COMMIT_REF_SLUG
"""
    async with _stack(tmp_path, agent_yaml=rules) as (kasd, sim, auth):
        token = _job(auth, environment=None)
        answer = await _call(kasd, token, "GET", "/api/v1/namespaces/ci-42-main/pods")
        assert answer.status == 200, answer.body
        namespace = _stored(sim, "", "namespaces", None, "ci-42-main")
        assert namespace is not None
        assert namespace["metadata"]["labels"]["kasd.gitlab-agent.io/managed-by"] == "kasd"
        binding = _stored(sim, "rbac.authorization.k8s.io", "rolebindings", "ci-42-main", "gitlab-job-access")
        assert binding is not None and binding["subjects"][0]["name"] == "gitlab:project:42"
        assert (await _call(kasd, token, "GET", "/api/v1/namespaces/default/pods")).status == 403


async def test_jobs_without_an_environment_or_resource_management_create_nothing(tmp_path: Path) -> None:
    plain = "ci_access:\n  projects:\n    - id: group/app\n      access_as: {ci_job: {}}\n"
    async with _stack(tmp_path, agent_yaml=plain) as (kasd, sim, auth):
        before = sim.store.count("", "namespaces")
        answer = await _call(kasd, _job(auth), "GET", "/api/v1/namespaces/default/pods")
        assert answer.status == 403  # no namespace of its own, and no binding anywhere
        assert sim.store.count("", "namespaces") == before
        assert _creates(sim, "/api/v1/namespaces") == 0


SHARED = """\
ci_access:
  projects:
    - id: group/app
      access_as: {access_as}
      rules:
        - namespace: app-$CI_PROJECT_ID
"""


@pytest.mark.parametrize("access_as", ["{agent: {}}", "{impersonate: {username: deployer}}", "{ci_job: {}}",
                                       "{ci_user: {}}"])
async def test_a_stop_keeps_a_namespace_another_environment_uses_in_every_access_mode(
        tmp_path: Path, access_as: str) -> None:
    # The issue's scenario: production and review/feat-y share app-42; review/feat-y stops.
    async with _stack(tmp_path, agent_yaml=SHARED.format(access_as=access_as)) as (kasd, sim, auth):
        prod, review = _job(auth, "production", job_id=1), _job(auth, "review/feat-y", job_id=2)
        for token in (prod, review):  # each one's first request (whatever the cluster then answers it)
            assert (await _call(kasd, token, "GET", "/api/v1/namespaces/app-42/configmaps")).status in (200, 403)
        # what production wrote there (as whichever identity its mode gives it)
        sim.store.create(sim.store.kind("", "configmaps"), "app-42", {"metadata": {"name": "prod-config"}})
        namespace = _stored(sim, "", "namespaces", None, "app-42")
        assert namespace is not None
        users = ["7:42:production", f"7:42:{environment_slug('review/feat-y')}"]
        assert users_of(namespace) == users
        bindings = access_as in ("{ci_job: {}}", "{ci_user: {}}")
        api = kasd.port("api")
        stopped = await http_request(api, "POST", stop_path("group/app", "review/feat-y"),
                                     [("job-token", review.split(":", 2)[2])])
        assert stopped.status == 200, stopped.body
        (agent,) = stopped.json()["agents"]
        assert agent["kept"] == ["Namespace app-42"] and "Namespace app-42" not in agent["deleted"]
        namespace = _stored(sim, "", "namespaces", None, "app-42")
        assert namespace is not None and users_of(namespace) == users[:1]
        assert _stored(sim, "", "configmaps", "app-42", "prod-config") is not None
        rbac = (sim, "rbac.authorization.k8s.io", "rolebindings", "app-42")
        assert (_stored(*rbac, "gitlab-job-access-production") is not None) == bindings
        assert _stored(*rbac, f"gitlab-job-access-{environment_slug('review/feat-y')}") is None
        # the last user stops: the namespace goes, with what is in it
        stopped = await http_request(api, "POST", stop_path("group/app", "production"),
                                     [("job-token", prod.split(":", 2)[2])])
        assert stopped.json()["agents"][0]["deleted"][-1] == "Namespace app-42", stopped.body
        assert _stored(sim, "", "namespaces", None, "app-42") is None


def _plan(environment: str, namespace: str = "app-42", project_id: int = 42,
          roles: tuple[RoleRef, ...] | None = None) -> ManagedResources:
    slug = environment_slug(environment)
    variables: dict[str, str | int] = {v: "" for v in VARIABLES}
    variables |= {"agent.id": 7, "project.id": project_id, "environment.slug": slug, "environment.name": environment}
    return ManagedResources(agent_id=7, project_id=project_id, environment=environment, slug=slug, source="rules",
                            namespace=namespace, objects=tuple(render(rules_objects(
                                namespace, [] if roles is None else [f"gitlab:project_env:{project_id}:{slug}"],
                                slug, roles or ()), variables)))


class _Gated(AgentClient):
    """Another replica's client, whose first request of ``method`` waits until ``arrived`` has
    been set ``waiting`` times (every replica got there) and ``opened`` is set."""

    def __init__(self, client: AgentClient, method: str, barrier: list[int], waiting: int,
                 opened: trio.Event, arrived: trio.Event) -> None:
        super().__init__(client.router)
        self.method, self.barrier, self.waiting, self.opened, self.arrived = method, barrier, waiting, opened, arrived
        self.held = False

    async def request(self, agent_id: int, method: str, target: str, body: Mapping[str, Any] | None = None) -> Answer:
        if method == self.method and not self.held:
            self.held = True
            self.barrier[0] += 1
            if self.barrier[0] == self.waiting:
                self.arrived.set()
            await self.opened.wait()
        return await super().request(agent_id, method, target, body)


async def test_first_requests_racing_on_two_replicas_are_both_recorded_and_a_racing_stop_keeps_the_namespace(
        tmp_path: Path) -> None:
    async with _stack(tmp_path) as (kasd, sim, _):
        assert kasd.router is not None
        client = AgentClient(kasd.router)
        made = MadeObjects()  # the replicas' store: what one made, the others trust
        await _provisioner(client, made=made).ensure(_plan("production"))
        # Two replicas record review/a and review/b at once: both read the same resourceVersion and
        # write; the loser's 409 is read again and retried.
        barrier, opened, arrived = [0], trio.Event(), trio.Event()
        replicas = [_provisioner(_Gated(client, "PUT", barrier, 2, opened, arrived), made=made) for _ in range(2)]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(replicas[0].ensure, _plan("review/a"))
            nursery.start_soon(replicas[1].ensure, _plan("review/b"))
            await arrived.wait()
            opened.set()
        namespace = _stored(sim, "", "namespaces", None, "app-42")
        assert namespace is not None
        assert sorted(users_of(namespace) or ()) == ["7:42:production", *(f"7:42:{environment_slug(f'review/{x}')}"
                                                                          for x in "ab")]
        puts = [r for r in sim.requests if r.method == "PUT" and r.path == "/api/v1/namespaces/app-42"]
        assert len(puts) == 3  # one of the two lost the race once
        # Two stops at once on two replicas: each removes only itself.
        barrier, opened, arrived = [0], trio.Event(), trio.Event()
        replicas = [_provisioner(_Gated(client, "PUT", barrier, 2, opened, arrived), made=made) for _ in range(2)]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(replicas[0].stop, _plan("review/a"))
            nursery.start_soon(replicas[1].stop, _plan("review/b"))
            await arrived.wait()
            opened.set()
        namespace = _stored(sim, "", "namespaces", None, "app-42")
        assert namespace is not None and users_of(namespace) == ["7:42:production"]
        # production's stop reads itself as the only user; review/c's first request records itself
        # before the delete is sent: the delete's precondition fails, and the namespace stays for review/c.
        barrier, opened, arrived = [0], trio.Event(), trio.Event()
        stopping = _provisioner(_Gated(client, "DELETE", barrier, 1, opened, arrived), made=made)
        reports = []

        async def stop() -> None:
            reports.append(await stopping.stop(_plan("production")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop)
            await arrived.wait()
            await _provisioner(client, made=made).ensure(_plan("review/c"))
            opened.set()
        assert reports[0].kept == ("Namespace app-42",) and reports[0].deleted == ()
        namespace = _stored(sim, "", "namespaces", None, "app-42")
        assert namespace is not None and users_of(namespace) == [f"7:42:{environment_slug('review/c')}"]


async def test_users_of_other_projects_are_recorded_and_a_stop_of_a_non_user_changes_nothing(tmp_path: Path) -> None:
    async with _stack(tmp_path) as (kasd, sim, _):
        assert kasd.router is not None
        provisioner = _provisioner(AgentClient(kasd.router))
        ours, theirs, idle = _plan("production"), _plan("production", project_id=43), _plan("review/idle")
        await provisioner.ensure(ours)
        await provisioner.ensure(theirs)  # project 43's job uses project 42's namespace (as the agent)
        namespace = _stored(sim, "", "namespaces", None, "app-42")
        assert namespace is not None and users_of(namespace) == ["7:42:production", "7:43:production"]
        # an environment that never used it (any job of the project may stop its own) changes nothing
        assert (await provisioner.stop(idle)).kept == ("Namespace app-42",)
        assert (await provisioner.stop(ours)).kept == ("Namespace app-42",)  # project 43 still uses it
        namespace = _stored(sim, "", "namespaces", None, "app-42")
        assert namespace is not None and users_of(namespace) == ["7:43:production"]
        assert (await provisioner.stop(theirs)).deleted == ("Namespace app-42",)
        assert _stored(sim, "", "namespaces", None, "app-42") is None


async def test_a_stop_deletes_the_environments_bindings_its_config_no_longer_names(tmp_path: Path) -> None:
    async with _stack(tmp_path) as (kasd, sim, _):
        assert kasd.router is not None
        provisioner = _provisioner(AgentClient(kasd.router))
        edit, view = RoleRef("ClusterRole", "edit"), RoleRef("ClusterRole", "view")
        await provisioner.ensure(_plan("production", roles=(edit,)))
        await provisioner.ensure(_plan("other", roles=(edit,)))
        await provisioner.ensure(_plan("production", roles=(view,)))  # roles: edited from edit to view
        report = await provisioner.stop(_plan("production", roles=(view,)))
        assert report.deleted == ("RoleBinding app-42/gitlab-job-access-production.clusterrole.edit",
                                  "RoleBinding app-42/gitlab-job-access-production.clusterrole.view")
        assert report.kept == ("Namespace app-42",)  # "other" uses it, and keeps its binding
        left = sim.store.list(sim.store.kind("rbac.authorization.k8s.io", "rolebindings"), "app-42").items
        assert [b["metadata"]["name"] for b in left] == ["gitlab-job-access-other.clusterrole.edit"]


async def test_a_namespace_without_a_record_of_its_users_is_never_deleted(tmp_path: Path) -> None:
    # Made by a kasd that kept no record: who uses it cannot be proved, so no stop deletes it.
    async with _stack(tmp_path) as (kasd, sim, _):
        assert kasd.router is not None
        plan = _plan("review/a")
        sim.store.create(sim.store.kind("", "namespaces"), None, {"metadata": {"name": "app-42", "labels": dict(
            plan.objects[0]["metadata"]["labels"])}})
        provisioner = _provisioner(AgentClient(kasd.router))
        await provisioner.ensure(plan)
        report = await provisioner.stop(plan)
        assert report.kept == ("Namespace app-42",)
        assert _stored(sim, "", "namespaces", None, "app-42") is not None


async def test_a_rules_roles_are_what_its_binding_grants_and_a_role_the_cluster_lacks_is_the_jobs_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    rules = """\
ci_access:
  projects:
    - id: group/app
      access_as: {ci_job: {}}
      rules:
        - if: $CI_ENVIRONMENT_NAME == "production"
          namespace: app-$CI_PROJECT_ID
          roles: [edit]
        - if: $CI_ENVIRONMENT_NAME == "staging"
          namespace: app-$CI_PROJECT_ID
          roles: [Role/reader]
        - namespace: app-$CI_PROJECT_ID
          roles: [view, ClusterRole/edti]
"""
    async with _stack(tmp_path, agent_yaml=rules) as (kasd, sim, auth):
        prod = _job(auth, "production", job_id=1)
        made = await _call(kasd, prod, "POST", "/api/v1/namespaces/app-42/configmaps",
                           {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app"}})
        assert made.status == 201, made.body
        rbac = (sim, "rbac.authorization.k8s.io", "rolebindings", "app-42")
        binding = _stored(*rbac, "gitlab-job-access-production.clusterrole.edit")
        assert binding is not None and binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                                              "kind": "ClusterRole", "name": "edit"}
        assert binding["subjects"][0]["name"] == "gitlab:project_env:42:production"
        assert _stored(*rbac, "gitlab-job-access-production") is None  # edit instead of admin, not besides it
        grant = await _call(kasd, prod, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/app-42/rolebindings",
                            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                             "metadata": {"name": "mine"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                                       "kind": "ClusterRole", "name": "admin"},
                             "subjects": [{"kind": "User", "name": "mallory"}]})
        assert grant.status == 403  # edit may not grant
        caplog.set_level(logging.INFO, logger="kasd.audit")
        review = _job(auth, "review/x", job_id=2)
        answer = await _call(kasd, review, "GET", "/api/v1/namespaces/app-42/configmaps")
        slug = environment_slug("review/x")
        assert answer.status == 422, answer.body
        assert answer.json()["message"] == (f"cannot create RoleBinding app-42/gitlab-job-access-{slug}.clusterrole.edti "
                                            "for this job's environment (agent 7): it grants ClusterRole 'edti', "
                                            "which the cluster does not have")
        assert _stored(*rbac, f"gitlab-job-access-{slug}.clusterrole.view") is None  # nothing half made
        # A Role is looked for in its namespace when the binding is made: until someone makes it, the
        # job is told; then the next request binds it.
        staging = _job(auth, "staging", job_id=3)
        answer = await _call(kasd, staging, "GET", "/api/v1/namespaces/app-42/configmaps")
        assert answer.status == 422, answer.body
        assert answer.json()["message"] == ("cannot create RoleBinding app-42/gitlab-job-access-staging.role.reader for "
                                            "this job's environment (agent 7): it grants Role 'reader' in namespace "
                                            "app-42, which the cluster does not have")
        sim.store.create(sim.store.kind("rbac.authorization.k8s.io", "roles"), "app-42", {
            "metadata": {"name": "reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]})
        assert kasd.provisioner is not None  # not answered from memory: tried again
        monkeypatch.setattr(kasd.provisioner, "limits", ProvisionLimits(failure_hold=0.0))
        answer = await _call(kasd, staging, "GET", "/api/v1/namespaces/app-42/configmaps")
        assert answer.status == 200, answer.body
        binding = _stored(*rbac, "gitlab-job-access-staging.role.reader")
        assert binding is not None and binding["roleRef"]["kind"] == "Role"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "kasd.audit"]
    assert warnings[0] == (f"managed resource refused agent=7 project_id=42 environment=review/x kind=RoleBinding "
                           f"namespace=app-42 name=gitlab-job-access-{slug}.clusterrole.edti role_kind=ClusterRole "
                           "role=edti problem=role-not-found")


async def test_rules_that_give_one_environments_jobs_different_roles_each_get_their_binding(tmp_path: Path) -> None:
    # Both plans have one key (agent, project, environment, namespace): the second is not taken for
    # the first, applied a moment ago. (The subjects are the environment's group: it holds both.)
    rules = """\
ci_access:
  projects:
    - id: group/app
      access_as: {ci_job: {}}
      rules:
        - if: $CI_COMMIT_REF_PROTECTED == "true"
          namespace: app-$CI_PROJECT_ID
          roles: [edit]
        - namespace: app-$CI_PROJECT_ID
          roles: [view]
"""
    async with _stack(tmp_path, agent_yaml=rules) as (kasd, sim, auth):
        protected = f"ci:7:{auth.job_token('group/app', job_id=1, user='alice', environment='production', protected=True)}"
        branch = f"ci:7:{auth.job_token('group/app', job_id=2, user='alice', environment='production', ref='feat')}"
        for token in (protected, branch):
            assert (await _call(kasd, token, "GET", "/api/v1/namespaces/app-42/configmaps")).status == 200
        rbac = (sim, "rbac.authorization.k8s.io", "rolebindings", "app-42")
        assert _stored(*rbac, "gitlab-job-access-production.clusterrole.edit") is not None
        assert _stored(*rbac, "gitlab-job-access-production.clusterrole.view") is not None


async def test_a_stop_whose_agent_hangs_is_a_504_at_the_callers_bound(tmp_path: Path, autojump_clock: Any) -> None:
    """The REST stop bounds each agent's part (``STOP_TIME_LIMIT``): an agent that never answers costs
    the stop job a 504 saying so, not an open-ended wait."""
    from kasd import restapi
    from kasd.authority import load_authorization
    from kasd.restapi import RestApi

    auth = AuthSetup(tmp_path / "auth")
    auth.agent_config("group/infra", "prod", MANAGED)
    config = config_from_mapping({
        "agents": [{"id": 7, "name": "prod", "config_project": "group/infra", "token_sha256": hash_token(AGENT_TOKEN)}],
        "groups": [{"path": "group", "id": 10}],
        "projects": [{"path": "group/infra", "id": 1}, {"path": "group/app", "id": 42}],
        **auth.kasd_settings(),
    })
    snapshot = load_authorization(config, None).snapshot
    stops: list[ManagedResources] = []

    class Hanging:
        async def stop(self, plan: ManagedResources) -> None:
            stops.append(plan)
            await trio.sleep_forever()

    api = RestApi(lambda: snapshot, Hanging())  # type: ignore[arg-type]
    secret = auth.job_token("group/app", job_id=5, user="alice", environment=ENV)
    started = trio.current_time()
    status, body = await api.stop_environment("POST", "group/app", ENV, secret)
    assert status == 504 and "agent 7" in body["message"] and "run the stop again" in body["message"], body
    assert trio.current_time() - started == pytest.approx(restapi.STOP_TIME_LIMIT)
    assert [plan.agent_id for plan in stops] == [7]


@pytest.mark.parametrize(("owner", "other"), [("review/feat-x", environment_slug("review/feat-x")),
                                               ("production", "production-")])
async def test_an_environment_whose_slug_is_anothers_gets_neither_its_namespace_nor_its_stop(
        tmp_path: Path, owner: str, other: str) -> None:
    # Two names, one slug (GitLab's database refuses the second; kasd's store does): the second would
    # hold the first's gitlab:project_env group, and its stop would delete the first's namespace.
    assert environment_slug(owner) == environment_slug(other)
    async with _stack(tmp_path, agent_yaml=MANAGED.replace('      environments: ["review/*"]\n', "")) as (kasd, sim, auth):
        first, second = _job(auth, owner, job_id=1), _job(auth, other, job_id=2)
        namespace = f"{environment_slug(owner)}-42-7"
        made = await _call(kasd, first, "POST", f"/api/v1/namespaces/{namespace}/configmaps",
                           {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app"}})
        assert made.status == 201, made.body
        refused = await _call(kasd, second, "GET", f"/api/v1/namespaces/{namespace}/configmaps/app")
        assert refused.status == 403
        assert f"environment {other!r} has the slug {environment_slug(owner)!r} of environment {owner!r}" in \
            refused.json()["message"]
        stopped = await http_request(kasd.port("api"), "POST", stop_path("group/app", other),
                                     [("job-token", second.split(":", 2)[2])])
        assert stopped.status == 403, stopped.body
        assert _stored(sim, "", "configmaps", namespace, "app") is not None
        assert (await _call(kasd, first, "GET", f"/api/v1/namespaces/{namespace}/configmaps/app")).status == 200


async def test_an_object_a_template_gives_every_environment_goes_only_with_the_last_of_them(tmp_path: Path) -> None:
    # A template's ServiceAccount with a fixed name is one object for every environment: the first
    # environment's stop used to delete it (its label) under the others.
    template = """\
objects:
  - apiVersion: v1
    kind: Namespace
    metadata: {name: tools}
  - apiVersion: v1
    kind: ServiceAccount
    metadata: {name: deployer, namespace: tools}
delete_resources: on_stop
"""
    async with _stack(tmp_path, templates={"default": template}) as (kasd, sim, auth):
        x, y = _job(auth, "review/x", job_id=1), _job(auth, "review/y", job_id=2)
        for token in (x, y):
            assert (await _call(kasd, token, "GET", "/api/v1/namespaces/tools/serviceaccounts")).status == 403
        account = _stored(sim, "", "serviceaccounts", "tools", "deployer")
        assert account is not None
        assert users_of(account) == [f"7:42:{environment_slug('review/x')}", f"7:42:{environment_slug('review/y')}"]
        api = kasd.port("api")
        stopped = await http_request(api, "POST", stop_path("group/app", "review/x"), [("job-token", x.split(":", 2)[2])])
        (agent,) = stopped.json()["agents"]
        assert agent["kept"] == ["ServiceAccount tools/deployer", "Namespace tools"], stopped.body
        account = _stored(sim, "", "serviceaccounts", "tools", "deployer")
        assert account is not None and users_of(account) == [f"7:42:{environment_slug('review/y')}"]
        stopped = await http_request(api, "POST", stop_path("group/app", "review/y"), [("job-token", y.split(":", 2)[2])])
        assert stopped.json()["agents"][0]["deleted"] == ["ServiceAccount tools/deployer", "Namespace tools"]
        assert _stored(sim, "", "namespaces", None, "tools") is None


async def test_a_store_that_cannot_say_who_owns_a_slug_is_a_503_never_a_pass(tmp_path: Path) -> None:
    from kasd.store.environments import EnvironmentSlugs
    from kasd.store.protocol import StoreError

    class Away:
        async def claim_environment(self, project_id: int, slug: str, name: str) -> str:
            raise StoreError("Redis unreachable: connection refused")

    async with _stack(tmp_path) as (kasd, sim, auth):
        assert kasd.authority is not None
        kasd.authority.environments = EnvironmentSlugs(Away())
        answer = await _call(kasd, _job(auth), "GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
        assert answer.status == 503, answer.body
        assert answer.json()["message"] == ("cannot check that environment 'review/feat-x' owns its slug: Redis "
                                            "unreachable: connection refused")
        assert _stored(sim, "", "namespaces", None, NAMESPACE) is None


async def test_kasds_marks_written_by_someone_else_make_it_neither_delete_nor_bind(tmp_path: Path) -> None:
    # Whoever may update a namespace (an impersonated identity allowed to patch namespaces but not
    # to delete them, say) can write kasd's mark, labels and record on it. kasd trusts them only on
    # what it recorded as made: its stop does not delete that namespace with the agent's rights, nor
    # does a job's first request bind a group in it.
    rules = ("ci_access:\n  projects:\n    - id: group/app\n      access_as: {ci_job: {}}\n"
             "      rules:\n        - namespace: $CI_COMMIT_REF_SLUG\n")
    slug = environment_slug("review/x")
    forged = {"kasd.gitlab-agent.io/managed-by": "kasd", "agent.gitlab.com/id-7": "",
              "agent.gitlab.com/project_id-42": "", f"agent.gitlab.com/env-{slug}-42-7": ""}
    async with _stack(tmp_path, agent_yaml=rules) as (kasd, sim, auth):
        for name in ("victim", "main"):
            sim.store.create(sim.store.kind("", "namespaces"), None, {"metadata": {
                "name": name, "labels": forged, "annotations": {"kasd.gitlab-agent.io/used-by": f'["7:42:{slug}"]'}}})
        token = auth.job_token("group/app", job_id=9, user="alice", environment="review/x", ref="victim")
        stopped = await http_request(kasd.port("api"), "POST", stop_path("group/app", "review/x"),
                                     [("job-token", token)])
        assert stopped.status == 200, stopped.body
        assert stopped.json()["agents"][0]["kept"] == ["Namespace victim"], stopped.body
        assert _stored(sim, "", "namespaces", None, "victim") is not None
        job = _job(auth, "review/x")  # ref main: its rule names the namespace main
        assert (await _call(kasd, job, "GET", "/api/v1/namespaces/main/configmaps")).status == 403
        assert _stored(sim, "rbac.authorization.k8s.io", "rolebindings", "main", f"gitlab-job-access-{slug}") is None
