"""`python -m kubesim` as the demo starts it: TLS, a token, a kubeconfig, clean SIGTERM."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import yaml

from tests.forkrun import run_module
from tests.kubesim.conftest import KUBECTLS

pytestmark = pytest.mark.timeout(30)


async def test_help_teaches() -> None:
    result = await trio.to_thread.run_sync(functools.partial(run_module, "kubesim", "--help"))
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "--kubeconfig-out" in text and "kubesim.io/crash-loop" in text and "TLS" in text


@pytest.mark.e2e  # a real kubectl against the kubesim process
@pytest.mark.parametrize("token_from", ["flag", "file"])
async def test_serves_kubectl_and_stops_on_sigterm(tmp_path: Path, token_from: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    token_args = ["--token", "cli-token"]
    if token_from == "file":  # kept out of `ps`, as the demo does; a trailing newline is not the token's
        (tmp_path / "token").write_text("cli-token\n")
        token_args = ["--token-file", str(tmp_path / "token")]
    async with trio.open_nursery() as nursery:
        process = await nursery.start(functools.partial(
            trio.run_process, [sys.executable, "-m", "kubesim", "--port", "0", *token_args, "--self-signed",
             "--kubeconfig-out", str(kubeconfig), "--log-requests"],
            stderr=subprocess.PIPE, env=env, check=False))
        buffer = b""
        with trio.fail_after(15):
            while b"kubeconfig_written" not in buffer:
                chunk = await process.stderr.receive_some()
                assert chunk, buffer
                buffer += chunk
        _, binary = KUBECTLS[0]
        result = await trio.run_process(
            [binary, "get", "namespaces", "-o", "name"], capture_stdout=True, capture_stderr=True,
            env=dict(os.environ, KUBECONFIG=str(kubeconfig), KUBECACHEDIR=str(tmp_path / "cache")))
        assert "namespace/default" in result.stdout.decode().split()
        written = yaml.safe_load(kubeconfig.read_text())
        assert written["users"][0]["user"]["token"] == "cli-token"
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            while True:
                chunk = await process.stderr.receive_some()
                if not chunk:
                    break
                buffer += chunk
            await process.wait()
    assert process.returncode == 0
    events = [json.loads(line) for line in buffer.decode().splitlines()]
    assert events[0]["event"] == "listening" and events[0]["url"].startswith("https://127.0.0.1:")
    assert any(e["event"] == "request" and e["path"] == "/api/v1/namespaces" for e in events)
    assert events[-1]["event"] == "stopped"


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ("", [], "is empty"),
        (None, [], "cannot read"),
        ("t", ["--token", "t"], "not allowed with argument"),
    ],
)
async def test_a_bad_token_file_is_a_usage_error(tmp_path: Path, content: str | None, extra: list[str], message: str) -> None:
    token = tmp_path / "token"
    if content is not None:
        token.write_text(content)
    with trio.fail_after(15):
        result = await trio.to_thread.run_sync(functools.partial(
            run_module, "kubesim", "--port", "0", "--token-file", str(token), *extra))
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("apiVersion: v1\nkind: Namespace\nmetadata: {name: ok}\n---\napiVersion: v1\nkind: Nope\nmetadata: {name: x}\n",
         'document 2: no kind "Nope" is registered for version "v1"'),
        ("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: b}\n"
         "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}\nsubjects: [{kind: Robot, name: r}]\n",
         'document 1: ClusterRoleBinding.rbac.authorization.k8s.io "b" is invalid: subjects[0].kind: Unsupported value'),
        ("- not an object\n", "document 1 is not an object with apiVersion and kind"),
        ("key: [\n", "is not YAML"),
    ],
)
async def test_a_manifest_the_cluster_refuses_stops_the_start_naming_file_and_document(
        tmp_path: Path, text: str, message: str) -> None:
    manifest = tmp_path / "rbac.yaml"
    manifest.write_text(text)
    with trio.fail_after(15):
        result = await trio.to_thread.run_sync(functools.partial(
            run_module, "kubesim", "--port", "0", "--manifest", str(manifest)))
    assert result.returncode == 2
    stderr = result.stderr
    assert f"--manifest: {manifest}" in stderr and message in stderr, stderr
