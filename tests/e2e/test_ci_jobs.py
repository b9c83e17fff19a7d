"""CI jobs through real kubectl (every version found): an allowed job works from its own kubeconfig
and the cluster sees the job; a refused job is told why, in kubectl's words; a reload that breaks
the agent's config.yaml changes nothing. The module's own stack (conftest's ``stack`` is one per
module, so editing its files touches no other module)."""

from __future__ import annotations

import json
import subprocess
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import yaml

from kasctl.stack import AGENT_ID, AGENT_NAME, APP_PROJECT, CONFIG_PROJECT, OTHER_PROJECT, Stack
from kasd.authz.slugs import environment_slug
from kasd.store.deployments import Environment
from kasd.store.sqlite import SqliteStore
from tests.e2e.conftest import KUBECTL_CAP
from tests.forkrun import run_module

pytestmark = pytest.mark.timeout(120)


def _run_kubeconfig(stack: Stack, token: str) -> subprocess.CompletedProcess[str]:
    env = {"CI_JOB_TOKEN": token, "KASCTL_API_URL": stack.api_url, "KASCTL_PROXY_URL": stack.proxy_url,
           "KASCTL_CA_FILE": str(stack.ca_file), "PATH": "/usr/bin:/bin"}
    return run_module("kasctl", "kubeconfig", timeout=60, env=env)


def _job_kubeconfig(stack: Stack, token: str) -> dict[str, object]:
    result = _run_kubeconfig(stack, token)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)  # type: ignore[no-any-return]


def _kubectl(binary: str, config: object, *args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    path = tmp / "job.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([binary, "--kubeconfig", str(path), *args], capture_output=True, text=True,
                          timeout=KUBECTL_CAP)


def _environment_when(stack: Stack, name: str, ready: Callable[[Environment], bool]) -> Environment:
    """Project 3's environment ``name`` in the stack's kasd store (its SQLite file, read beside kasd)
    once ``ready`` says so: the recorder writes off the request's path (polled, bounded)."""

    async def read() -> Environment | None:
        store = SqliteStore.open_sync(stack.dir / "kasd.sqlite3", max_entries=10)
        try:
            return await store.environment_named(3, name)
        finally:
            await store.aclose()

    deadline = time.monotonic() + 10
    while True:
        env = trio.run(read)
        if env is not None and ready(env):
            return env
        assert time.monotonic() < deadline, f"kasd's store has {env}"
        time.sleep(0.05)


def test_an_allowed_job_works_in_its_managed_namespace_until_the_environment_stops(
        stack: Stack, kubectl_bin: str, tmp_path: Path) -> None:
    environment = f"review/feat-{zlib.crc32(kubectl_bin.encode()) % 10000}"  # one per kubectl
    token = stack.auth.job_token(APP_PROJECT, job_id=41, pipeline_id=5, user="demo", ref="feat",
                                 environment=environment, environment_tier="development")
    config = _job_kubeconfig(stack, token)
    (context,) = config["contexts"]  # type: ignore[index]
    assert context["name"] == f"{CONFIG_PROJECT}:{AGENT_NAME}"
    namespace = context["context"]["namespace"]
    assert namespace == f"review-{environment_slug(environment)}"  # the demo's rule: review-$CI_ENVIRONMENT_SLUG
    whoami = _kubectl(kubectl_bin, config, "auth", "whoami", "-o", "json", tmp=tmp_path)
    assert whoami.returncode == 0, whoami.stderr
    user = json.loads(whoami.stdout)["status"]["userInfo"]
    assert user["username"] == "gitlab:ci_job:41"
    assert f"gitlab:project_env:3:{environment_slug(environment)}" in user["groups"]
    assert "gitlab:project_env_tier:3:development" in user["groups"]
    # kasd made the namespace on the job's first request, bound the job's environment to admin in
    # it (kubesim's RBAC decides from here), and marked it as its own.
    made = _kubectl(kubectl_bin, config, "create", "deployment", "web", "--image=nginx", tmp=tmp_path)
    assert made.returncode == 0, made.stderr
    assert _kubectl(kubectl_bin, config, "get", "deployment", "web", tmp=tmp_path).returncode == 0
    assert _kubectl(kubectl_bin, config, "auth", "can-i", "create", "rolebindings", tmp=tmp_path).stdout.strip() == "yes"
    elsewhere = _kubectl(kubectl_bin, config, "-n", "default", "get", "pods", tmp=tmp_path)
    assert elsewhere.returncode == 1
    assert ('Error from server (Forbidden): pods is forbidden: User "gitlab:ci_job:41" cannot list resource '
            '"pods" in API group "" in the namespace "default"') in elsewhere.stderr
    admin = [kubectl_bin, "--kubeconfig", str(stack.kubeconfig)]  # the demo project's job: cluster-admin
    labels = json.loads(subprocess.run([*admin, "get", "namespace", namespace, "-o", "json"], capture_output=True,
                                       text=True, timeout=KUBECTL_CAP, check=True).stdout)["metadata"]["labels"]
    assert labels["kasd.gitlab-agent.io/managed-by"] == "kasd"
    # kasd's store holds the deployment: the job, its agent, the namespace it wrote into
    deployed = _environment_when(stack, environment, lambda env: env.last_deployment is not None
                                 and env.namespaces == (namespace,))
    assert (deployed.project_id, deployed.tier, deployed.agents, deployed.state) == (3, "development", (AGENT_ID,),
                                                                                    "available")
    last = deployed.last_deployment
    assert last is not None and (last.job_id, last.pipeline_id, last.user, last.ref) == (41, 5, "demo", "feat")
    # The stop job (GitLab's environment: action: stop) stops it: kasd deletes what it made.
    stop_token = stack.auth.job_token(APP_PROJECT, job_id=42, pipeline_id=5, user="demo", ref="feat",
                                      environment=environment)
    env = {"CI_JOB_TOKEN": stop_token, "CI_PROJECT_PATH": APP_PROJECT, "CI_ENVIRONMENT_NAME": environment,
           "KASCTL_API_URL": stack.api_url, "KASCTL_CA_FILE": str(stack.ca_file), "PATH": "/usr/bin:/bin"}
    stopped = run_module("kasctl", "env", "stop", timeout=60, env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert f"deleted  RoleBinding {namespace}/gitlab-job-access-{environment_slug(environment)}" in stopped.stdout
    assert f"deleted  Namespace {namespace}" in stopped.stdout
    assert _environment_when(stack, environment, lambda env: env.state == "stopped").id == deployed.id  # not forgotten
    gone = subprocess.run([*admin, "get", "deployment", "web", "-n", namespace], capture_output=True, text=True,
                          timeout=KUBECTL_CAP)
    assert "NotFound" in gone.stderr, gone.stderr
    denied = run_module("kasctl", "env", "stop", timeout=60, env={**env, "CI_ENVIRONMENT_NAME": "review/other"})
    assert denied.returncode == 1
    assert "kasd refused (403): 403 Forbidden: the job token is for environment" in denied.stderr
    assert stop_token not in denied.stderr


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ({"project": OTHER_PROJECT}, "the agent is not configured to allow this project's CI/CD jobs"),
        ({"project": APP_PROJECT}, f"agent {AGENT_ID} allows CI/CD jobs of project group/app only in certain "
                                   "environments, and this job has no environment"),
        ({"project": APP_PROJECT, "environment": "production"}, "in environment 'production'"),
    ],
)
def test_a_refused_job_is_told_why_by_kubectl(stack: Stack, kubectl_bin: str, tmp_path: Path,
                                              claims: dict[str, str], message: str) -> None:
    token = stack.auth.job_token(claims["project"], job_id=42, environment=claims.get("environment"))
    # no kubeconfig for a job no agent lets in: one line saying why, exit 1
    none = _run_kubeconfig(stack, token)
    assert none.returncode == 1 and none.stdout == "", (none.stdout, none.stderr)
    assert f"no agent allows project {claims['project']}" in none.stderr, none.stderr
    config = yaml.safe_load(stack.kubeconfig.read_text())
    for user in config["users"]:
        user["user"]["token"] = f"ci:{AGENT_ID}:{token}"
    # kubectl prints a Status's message for an API request, but its own "unknown" for a refused
    # discovery request (kubernetes/kubernetes#61805, on any API server): the refusal is read as a
    # user whose kubectl has already cached the server's discovery sees it (the admin's kubectl
    # fills the cache first), not as the order of the tests happened to leave ~/.kube/cache.
    cache = tmp_path / "kube-cache"
    warm = subprocess.run([kubectl_bin, "--kubeconfig", str(stack.kubeconfig), "--cache-dir", str(cache),
                           "api-resources", "-o", "name"], capture_output=True, text=True, timeout=KUBECTL_CAP)
    assert warm.returncode == 0, warm.stderr
    refused = _kubectl(kubectl_bin, config, "--cache-dir", str(cache), "get", "pods", tmp=tmp_path)
    assert refused.returncode != 0
    assert "Forbidden" in refused.stderr or "forbidden" in refused.stderr, refused.stderr
    assert message in refused.stderr, refused.stderr


def test_a_reload_that_breaks_the_file_changes_nothing(stack: Stack, kubectl_bin: str, tmp_path: Path) -> None:
    path = stack.auth.config_root / CONFIG_PROJECT / ".gitlab" / "agents" / AGENT_NAME / "config.yaml"
    good = path.read_text()
    try:
        stack.auth.agent_config(CONFIG_PROJECT, AGENT_NAME, good + "      rules: [{if: '$X =='}]\n")
        kasd = stack.kasd
        assert kasd is not None
        line = _wait_for_line(kasd.log, "authorization reload failed", 10)
        assert f"{path}:" in line and "the previous configuration stays in force" in line
        listed = subprocess.run([kubectl_bin, "--kubeconfig", str(stack.kubeconfig), "get", "pods"],
                                capture_output=True, text=True, timeout=KUBECTL_CAP)
        assert listed.returncode == 0, listed.stderr  # the previous configuration is in force
    finally:
        stack.auth.agent_config(CONFIG_PROJECT, AGENT_NAME, good)


def _wait_for_line(log: Path, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text()
        if needle in text:
            return next(line for line in text.splitlines() if needle in line)
        time.sleep(0.1)  # the daemon's log file: it signals nothing to a test
    raise AssertionError(f"{needle!r} not in {log} after {timeout}s")
