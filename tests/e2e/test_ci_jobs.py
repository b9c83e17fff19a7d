"""CI jobs through real kubectl (every version found): an allowed job works from its own kubeconfig
and the cluster sees the job; a refused job is told why, in kubectl's words; a reload that breaks
the agent's config.yaml changes nothing. The module's own stack (conftest's ``stack`` is one per
module, so editing its files touches no other module)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kasctl.stack import AGENT_ID, AGENT_NAME, APP_PROJECT, CONFIG_PROJECT, OTHER_PROJECT, Stack
from tests.e2e.conftest import KUBECTL_CAP

pytestmark = pytest.mark.timeout(120)


def _job_kubeconfig(stack: Stack, token: str) -> dict[str, object]:
    env = {"CI_JOB_TOKEN": token, "KASCTL_API_URL": stack.api_url, "KASCTL_PROXY_URL": stack.proxy_url,
           "KASCTL_CA_FILE": str(stack.ca_file), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "kasctl", "kubeconfig"], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)  # type: ignore[no-any-return]


def _kubectl(binary: str, config: object, *args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    path = tmp / "job.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([binary, "--kubeconfig", str(path), *args], capture_output=True, text=True,
                          timeout=KUBECTL_CAP)


def test_an_allowed_job_works_from_its_kubeconfig_as_the_job(stack: Stack, kubectl_bin: str, tmp_path: Path) -> None:
    token = stack.auth.job_token(APP_PROJECT, job_id=41, pipeline_id=5, user="demo", ref="feat",
                                    environment="review/feat", environment_tier="development")
    config = _job_kubeconfig(stack, token)
    (context,) = config["contexts"]  # type: ignore[index]
    assert context["name"] == f"{CONFIG_PROJECT}:{AGENT_NAME}"
    namespace = context["context"]["namespace"]
    assert namespace.startswith("review-review-feat-")
    whoami = _kubectl(kubectl_bin, config, "auth", "whoami", "-o", "json", tmp=tmp_path)
    assert whoami.returncode == 0, whoami.stderr
    user = json.loads(whoami.stdout)["status"]["userInfo"]
    assert user["username"] == "gitlab:ci_job:41"
    assert f"gitlab:project_env:3:{namespace.removeprefix('review-')}" in user["groups"]
    assert "gitlab:project_env_tier:3:development" in user["groups"]
    listed = _kubectl(kubectl_bin, config, "get", "pods", tmp=tmp_path)  # in its namespace
    assert listed.returncode == 0, listed.stderr


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
    assert _job_kubeconfig(stack, token)["contexts"] == []  # no context for an agent it may not use
    config = yaml.safe_load(stack.kubeconfig.read_text())
    for user in config["users"]:
        user["user"]["token"] = f"ci:{AGENT_ID}:{token}"
    refused = _kubectl(kubectl_bin, config, "get", "pods", tmp=tmp_path)
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
