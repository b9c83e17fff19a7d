"""Real kubectl (every version found) → kasd → tunnel → agentd → kubesim, all real processes."""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from kasctl.stack import AGENT_ID, OFFLINE_AGENT_ID, Stack
from tests.e2e.conftest import LineReader, kubectl


def _suffix(kubectl_bin: str) -> str:
    """Names unique per kubectl binary: the module's tests share one cluster."""
    return "k" + str(abs(hash(kubectl_bin)) % 10_000)


def _ok(result: object) -> str:
    assert result.returncode == 0, (result.stdout, result.stderr)  # type: ignore[attr-defined]
    return result.stdout  # type: ignore[attr-defined,no-any-return]


def _ready_pod(kubectl_bin: str, stack: Stack, prefix: str) -> str:
    """A busybox pod made and waited for through the tunnel; its name."""
    name = f"{prefix}-{_suffix(kubectl_bin)}"
    _ok(kubectl(kubectl_bin, stack, "run", name, "--image=busybox"))
    _ok(kubectl(kubectl_bin, stack, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=15s"))
    return name


def test_create_get_and_rollout(stack: Stack, kubectl_bin: str) -> None:
    name = "web-" + _suffix(kubectl_bin)
    _ok(kubectl(kubectl_bin, stack, "create", "deployment", name, "--image=nginx", "--replicas=2"))
    _ok(kubectl(kubectl_bin, stack, "rollout", "status", f"deployment/{name}", "--timeout=15s"))
    out = _ok(kubectl(kubectl_bin, stack, "get", "pods", "-l", f"app={name}"))
    rows = [line.split() for line in out.splitlines()]
    assert rows[0][:3] == ["NAME", "READY", "STATUS"]
    assert len(rows) == 3 and all(row[1] == "1/1" and row[2] == "Running" for row in rows[1:])


def test_list_across_namespaces(stack: Stack, kubectl_bin: str) -> None:
    ns = "team-" + _suffix(kubectl_bin)
    _ok(kubectl(kubectl_bin, stack, "create", "namespace", ns))
    _ok(kubectl(kubectl_bin, stack, "-n", ns, "create", "configmap", "settings", "--from-literal=a=1"))
    out = _ok(kubectl(kubectl_bin, stack, "get", "configmaps", "-A"))
    assert any(line.split()[:2] == [ns, "settings"] for line in out.splitlines())


def test_impersonation_is_what_the_cluster_sees(stack: Stack, kubectl_bin: str) -> None:
    # kasd maps the CI token to an identity; agentd impersonates it with its own credentials.
    out = json.loads(_ok(kubectl(kubectl_bin, stack, "auth", "whoami", "-o", "json")))
    assert out["status"]["userInfo"]["username"] == "gitlab:ci_job:1"
    assert "gitlab:ci_job" in out["status"]["userInfo"]["groups"]


def test_watch_sees_a_change_while_open(stack: Stack, kubectl_bin: str) -> None:
    ns = "watch-" + _suffix(kubectl_bin)
    _ok(kubectl(kubectl_bin, stack, "create", "namespace", ns))
    watch = LineReader([kubectl_bin, "--kubeconfig", str(stack.kubeconfig), "-n", ns, "get", "configmaps", "-w"])
    try:
        watch.wait_for("kube-root-ca.crt")  # the initial list arrived; the watch is now open
        _ok(kubectl(kubectl_bin, stack, "-n", ns, "create", "configmap", "arrived-later"))
        watch.wait_for("arrived-later")
    finally:
        watch.stop()


def test_logs_follow_streams(stack: Stack, kubectl_bin: str) -> None:
    name = _ready_pod(kubectl_bin, stack, "logger")
    logs = LineReader([kubectl_bin, "--kubeconfig", str(stack.kubeconfig), "logs", "-f", name])
    try:
        logs.wait_for("ready")
        assert logs.proc.poll() is None  # still following
    finally:
        logs.stop()


def test_exec_without_and_with_stdin(stack: Stack, kubectl_bin: str) -> None:
    name = _ready_pod(kubectl_bin, stack, "shell")
    result = kubectl(kubectl_bin, stack, "exec", name, "--", "sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3")
    assert result.stdout == "to-stdout\n"
    assert "to-stderr" in result.stderr
    assert result.returncode == 3
    payload = "line one\nline two\n" * 1000
    result = kubectl(kubectl_bin, stack, "exec", "-i", name, "--", "cat", stdin=payload)
    assert result.returncode == 0, result.stderr
    assert result.stdout == payload


def test_apply_change_unchanged_and_delete(stack: Stack, kubectl_bin: str, tmp_path: Path) -> None:
    name = "applied-" + _suffix(kubectl_bin)
    manifest = tmp_path / "cm.yaml"

    def write(value: str) -> None:
        manifest.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": value}}))

    write("one")
    assert "created" in _ok(kubectl(kubectl_bin, stack, "apply", "-f", str(manifest)))
    write("two")
    assert "configured" in _ok(kubectl(kubectl_bin, stack, "apply", "-f", str(manifest)))
    assert "unchanged" in _ok(kubectl(kubectl_bin, stack, "apply", "-f", str(manifest)))
    assert _ok(kubectl(kubectl_bin, stack, "get", "configmap", name, "-o", "jsonpath={.data.k}")) == "two"
    assert "deleted" in _ok(kubectl(kubectl_bin, stack, "delete", "configmap", name))
    gone = kubectl(kubectl_bin, stack, "get", "configmap", name)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_a_5_mib_object_streams_through(stack: Stack, kubectl_bin: str, tmp_path: Path) -> None:
    name = "big-" + _suffix(kubectl_bin)
    blob = os.urandom(5 * 1024 * 1024 // 2).hex()  # 5 MiB of text
    manifest = tmp_path / "big.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"blob": blob}}))
    # `apply` copies the object into its last-applied-configuration annotation, which an API server
    # refuses past 256 KiB (kubesim does too): the 5 MiB go through, the refusal comes back.
    refused = kubectl(kubectl_bin, stack, "apply", "-f", str(manifest))
    assert refused.returncode == 1
    assert "metadata.annotations: Too long: may not be more than 262144 bytes" in refused.stderr
    assert "created" in _ok(kubectl(kubectl_bin, stack, "create", "-f", str(manifest)))
    back = _ok(kubectl(kubectl_bin, stack, "get", "configmap", name, "-o", "jsonpath={.data.blob}"))
    assert back == blob


# ---------------------------------------------------------------------------- errors, as Status JSON


def _get(stack: Stack, path: str, token: str | None) -> tuple[int, dict[str, object]]:
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(cadata=stack.ca.cert_pem.bytes().decode())
    request = urllib.request.Request(stack.proxy_url + path)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        assert exc.headers["content-type"].startswith("application/json")
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    ("token", "status", "reason", "message"),
    [
        (None, 401, "Unauthorized", "missing bearer token"),
        ("ci:1:not-the-job-token", 401, "Unauthorized", "bad token"),
        ("nonsense", 401, "Unauthorized", "bad token"),
        ("pat:{agent}:{pat}", 403, "Forbidden", "not configured for user access"),
        ("ci:{offline}:{job}", 503, "ServiceUnavailable", "not connected"),
    ],
)
def test_errors_are_status_json_that_say_what_is_wrong(
    stack: Stack, token: str | None, status: int, reason: str, message: str
) -> None:
    if token is not None:
        token = token.format(agent=AGENT_ID, offline=OFFLINE_AGENT_ID, pat=stack.personal_token, job=stack.job_token)
    code, body = _get(stack, "/api/v1/namespaces", token)
    assert code == status
    assert body["kind"] == "Status" and body["code"] == status and body["reason"] == reason
    assert message in str(body["message"])


def test_kubectl_reports_a_bad_token(stack: Stack, kubectl_bin: str, tmp_path: Path) -> None:
    config = yaml.safe_load(stack.kubeconfig.read_text())
    config["users"][0]["user"]["token"] = "ci:1:wrong"
    bad = tmp_path / "bad.kubeconfig"
    bad.write_text(yaml.safe_dump(config))
    result = kubectl(kubectl_bin, stack, "--kubeconfig", str(bad), "get", "pods")
    assert result.returncode != 0
    assert "Unauthorized" in result.stderr or "logged in" in result.stderr
