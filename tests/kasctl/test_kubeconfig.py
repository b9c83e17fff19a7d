"""kasctl kubeconfig --job-token: the job's kubeconfig from kasd's REST API, used by real kubectl."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from kasctl.__main__ import main
from kasctl.kubeconfig import KubeconfigError, build
from kasctl.stack import (
    AGENT_ID,
    CONFIG_PROJECT,
    OFFLINE_AGENT_ID,
    OTHER_PROJECT,
    Stack,
    find_kubectl,
)
from tests.forkrun import run_module

pytestmark = pytest.mark.timeout(120)


def _kasctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("kasctl", "kubeconfig", *args, timeout=60, env={"PATH": os.environ.get("PATH", ""), **(env or {})})


def test_the_job_gets_one_context_per_agent_it_may_use_and_kubectl_works(stack: Stack, tmp_path: Path) -> None:
    env = {"CI_JOB_TOKEN": stack.job_token, "KASCTL_API_URL": stack.api_url, "KASCTL_PROXY_URL": stack.proxy_url,
           "KASCTL_CA_FILE": str(stack.ca_file)}
    result = _kasctl(env=env)
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    # the demo job (of group/demo) may use the demo agent (ci_job) and the offline one (as the agent)
    assert [c["name"] for c in config["contexts"]] == [f"{CONFIG_PROJECT}:demo", "group/offline:offline"]
    assert config["current-context"] == f"{CONFIG_PROJECT}:demo"
    assert config["users"] == [
        {"name": f"agent:{AGENT_ID}", "user": {"token": f"ci:{AGENT_ID}:{stack.job_token}"}},
        {"name": f"agent:{OFFLINE_AGENT_ID}", "user": {"token": f"ci:{OFFLINE_AGENT_ID}:{stack.job_token}"}},
    ]
    assert config["clusters"][0]["cluster"]["server"] == stack.proxy_url
    kubectl = find_kubectl()
    assert kubectl is not None
    path = tmp_path / "job.kubeconfig"
    path.write_text(result.stdout)
    got = subprocess.run([kubectl, "--kubeconfig", str(path), "get", "namespaces", "-o", "name"],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 0 and "namespace/default" in got.stdout, got.stderr


def test_output_is_a_new_private_file(stack: Stack, tmp_path: Path) -> None:
    out = tmp_path / "k"
    args = ["--job-token", stack.job_token, "--api-url", stack.api_url, "--server", stack.proxy_url,
            "--certificate-authority", str(stack.ca_file), "--output", str(out)]
    assert _kasctl(*args).returncode == 0
    assert out.stat().st_mode & 0o777 == 0o600 and yaml.safe_load(out.read_text())["kind"] == "Config"
    again = _kasctl(*args)
    assert again.returncode == 2 and "already exists" in again.stderr


@pytest.mark.parametrize(
    ("change", "code", "message"),
    [
        ({"CI_JOB_TOKEN": "garbage"}, 1, "kasd refused (401): 401 Unauthorized: bad token: CI job token malformed"),
        ({"CI_JOB_TOKEN": ""}, 2, "missing --job-token: pass it or set CI_JOB_TOKEN"),
        ({"KASCTL_API_URL": "ftp://x"}, 2, "--api-url must be an https:// (or http://) URL"),
        ({"KASCTL_API_URL": "https://127.0.0.1:1"}, 1, "cannot reach kasd's REST API at https://127.0.0.1:1"),
    ],
)
def test_mistakes_are_one_line_without_the_token(stack: Stack, change: dict[str, str], code: int,
                                                 message: str) -> None:
    env = {"CI_JOB_TOKEN": stack.job_token, "KASCTL_API_URL": stack.api_url, "KASCTL_PROXY_URL": stack.proxy_url,
           "KASCTL_CA_FILE": str(stack.ca_file), **change}
    result = _kasctl(env=env)
    assert result.returncode == code and message in result.stderr, result.stderr
    assert result.stdout == "" and result.stderr.count("\n") == 1
    assert stack.job_token not in result.stderr


@pytest.mark.parametrize("agent_id", ["7", True, 2**63, -1, None])
def test_an_answer_whose_agent_id_is_not_an_id_is_refused_naming_it(agent_id: object) -> None:
    answer = {"allowed_agents": [{"id": agent_id, "config_project": {"path_with_namespace": "group/infra"}}]}
    with pytest.raises(KubeconfigError, match="kasd's answer is not what kasctl expects: agent id"):
        build(answer, "https://kasd.test:8154", "job-token", None)


def test_a_job_no_agent_allows_gets_no_kubeconfig_and_is_told_why(stack: Stack, tmp_path: Path) -> None:
    token = stack.auth.job_token(OTHER_PROJECT, job_id=8)
    out = tmp_path / "refused.kubeconfig"
    env = {"CI_JOB_TOKEN": token, "KASCTL_API_URL": stack.api_url, "KASCTL_PROXY_URL": stack.proxy_url,
           "KASCTL_CA_FILE": str(stack.ca_file)}
    result = _kasctl("--output", str(out), env=env)
    assert result.returncode == 1 and result.stdout == "" and not out.exists()
    assert result.stderr == (f"kasctl kubeconfig: no agent allows project {OTHER_PROJECT} (GET /api/v4/job/"
                             "allowed_agents answered an empty list): an agent's config file lets a project's jobs "
                             "in with a ci_access entry (docs/authorization.md)\n")


@pytest.mark.parametrize("command", [
    ["kubeconfig"],
    ["env", "stop", "--project", CONFIG_PROJECT, "--environment", "production"],
    ["agents"],
    ["promql", "--agent", str(AGENT_ID), "up"],
])
def test_api_url_at_the_proxy_port_says_which_port_it_wants(stack: Stack, command: list[str],
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in {"CI_JOB_TOKEN": stack.job_token, "KASCTL_TOKEN": stack.personal_token,
                        "KASCTL_API_URL": stack.proxy_url, "KASCTL_PROXY_URL": stack.proxy_url,
                        "KASCTL_CA_FILE": str(stack.ca_file)}.items():
        monkeypatch.setenv(name, value)
    assert main(command) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert f"{stack.proxy_url} looks like kasd's Kubernetes API proxy port (it answered 401 with a Kubernetes " \
           "Status); --api-url wants the REST API port (listeners.api)\n" in err
    assert stack.job_token not in err and stack.personal_token not in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == "kasctl 0.1.0\n"
