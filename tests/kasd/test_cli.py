"""The ``kasd`` command: configuration errors (exit 2, a message naming the key, no traceback),
``hash-token``, ``--help``, and a real process that serves, writes its ready file and drains on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import trio
import yaml

from kasctl.authsetup import AuthSetup
from kasd.tokens import hash_token
from tests.daemons import running_daemon
from tests.forkrun import run_module
from tests.kasd.helpers import (
    AGENT1_TOKEN,
    AUTH,
    CI_SECRET,
    CI_TOKEN,
    DIRECTORY,
    bearer,
    http_request,
)

pytestmark = pytest.mark.timeout(20)

GOOD_AGENT = {"id": 1, "name": "prod", "config_project": "g/p", "token_sha256": hash_token(AGENT1_TOKEN)}


def _kasd(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("kasd", *args, input=stdin, timeout=15, env=env)


def _write(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "kasd.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return str(path)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("agents: [\n", "not valid YAML at line"),
        ({"agents": [{**GOOD_AGENT, "token_sha256": "secret"}]}, "agents[0].token_sha256: must be 64 lower-case hex characters"),
        ({"agents": [{**GOOD_AGENT, "id": "one"}]}, "agents[0].id: must be a positive integer"),
        ({"agents": [GOOD_AGENT, GOOD_AGENT]}, "agents[1].id: agent id 1 is already used by agents[0]"),
        ({"agnets": []}, "agnets: unknown key"),
        ({"listeners": {"kubernetes_api": {"address": "8154"}}}, "listeners.kubernetes_api.address: '8154' is not host:port"),
        ({"listeners": {"agent": {"address": "0.0.0.0:99999"}}}, "listeners.agent.address: port 99999 is out of range"),
        ({"listeners": {"agent": {"tls": {"cert": "/nonexistent.crt", "key": "/nonexistent.key"}}}}, "listeners.agent.tls.cert: file '/nonexistent.crt' does not exist"),
        ({"access": []}, "access: unknown key"),  # the static list is gone (docs/authorization.md)
        (
            {"authorization": {"tokens": {"public_keys": ["/nonexistent.pub.pem"]}}},
            "authorization.tokens.public_keys[0]: file '/nonexistent.pub.pem' does not exist",
        ),
        (
            {"agents": [GOOD_AGENT], "projects": [{"path": "group/infra", "id": 1}]},
            "projects[0].path: the group 'group' of project 'group/infra' is not declared under groups:",
        ),
        ({"agent_wait_timeout": -1}, "agent_wait_timeout: must be greater than 0"),
        ({"log_level": "loud"}, "log_level: must be one of"),
    ],
)
def test_bad_config_exits_2_naming_the_key(tmp_path: Path, doc: object, message: str) -> None:
    result = _kasd("--config", _write(tmp_path, doc))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_config_file_and_bad_env(tmp_path: Path) -> None:
    result = _kasd("--config", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2 and "cannot read" in result.stderr and "Traceback" not in result.stderr
    result = _kasd(env={"KASD_AGENT_WAIT_TIMEOUT": "soon", "PATH": "/usr/bin"})
    assert result.returncode == 2 and "agent_wait_timeout: 'soon' is not a number of seconds" in result.stderr


def test_hash_token_and_help() -> None:
    result = _kasd("hash-token", stdin="s3cret\n")
    assert result.returncode == 0 and result.stdout.strip() == hash_token("s3cret")
    assert _kasd("hash-token", stdin="").returncode == 2
    help_text = _kasd("--help").stdout
    for needle in ("hash-token", "--config", "KASD_KUBERNETES_API_ADDRESS", "ci:<agent id>:<job token>", "--ready-file"):
        assert needle in help_text


async def test_process_serves_and_drains_on_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    config = _write(
        tmp_path,
        {
            "agents": [{**GOOD_AGENT, "config_project": "group/infra"}],
            **DIRECTORY,
            **AUTH.kasd_settings(),
            "agent_wait_timeout": 0.2,
        },
    )
    env = {"KASD_AGENT_ADDRESS": "127.0.0.1:0", "KASD_OBSERVABILITY_ADDRESS": "127.0.0.1:0"}
    args = ["--config", config, "--kubernetes-api-address", "127.0.0.1:0", "--ready-file", str(ready)]
    with trio.fail_after(15):
        async with running_daemon("kasd", args, env=env) as log:
            await log.until("kasd listening")
            addresses = json.loads(ready.read_text())
            assert set(addresses) == {"agent", "observability", "kubernetes_api"}
            port = int(addresses["kubernetes_api"].rsplit(":", 1)[1])
            reply = await http_request(port, "GET", "/api", [bearer(CI_TOKEN)])
            assert reply.status == 503 and json.loads(reply.body)["message"] == "agent 1 is not connected (waited 0.2s)"
    text = log.text
    assert "kasd stopped" in text
    assert "kasd.access" in text and "status=503" in text
    assert CI_SECRET not in text


async def test_sighup_and_file_changes_reload_and_a_bad_file_changes_nothing(tmp_path: Path) -> None:
    """The operator edits an agent's config.yaml: kasd picks it up (the watch, or SIGHUP at once);
    a broken edit is reported with file, line and column, and what was in force stays in force."""
    auth = AuthSetup(tmp_path / "auth")
    allow_app = "ci_access:\n  projects:\n    - id: group/app\n"
    path = auth.agent_config("group/infra", "prod", "ci_access:\n  projects:\n    - id: group/other\n")
    ready = tmp_path / "ready.json"
    config = _write(tmp_path, {
        "agents": [{**GOOD_AGENT, "config_project": "group/infra"}],
        "groups": [{"path": "group", "id": 10}],
        "projects": [{"path": "group/infra", "id": 1}, {"path": "group/app", "id": 42}, {"path": "group/other", "id": 43}],
        **auth.kasd_settings(), "agent_wait_timeout": 0.2,
        "listeners": {"agent": {"address": "127.0.0.1:0"}, "observability": {"address": "127.0.0.1:0"},
                      "kubernetes_api": {"address": "127.0.0.1:0"}},
    })
    token = bearer(f"ci:1:{auth.job_token('group/app', job_id=9)}")
    with trio.fail_after(20):
        async with running_daemon("kasd", ["--config", config, "--ready-file", str(ready)]) as log:
            await log.until("kasd listening")
            addresses = json.loads(ready.read_text())
            port = int(addresses["kubernetes_api"].rsplit(":", 1)[1])
            obs = int(addresses["observability"].rsplit(":", 1)[1])
            denied = await http_request(port, "GET", "/api", [token])
            assert denied.status == 403 and "does not authorize project group/app" in json.loads(denied.body)["message"]

            auth.agent_config("group/infra", "prod", allow_app)  # picked up by the watch
            await log.until("authorization reloaded (changed:")
            assert (await http_request(port, "GET", "/api", [token])).status == 503  # allowed; no agent

            auth.agent_config("group/infra", "prod", allow_app + "      rules:\n        - if: $CI_COMMIT_BRANCH == ( \n")
            os.kill(log.process.pid, signal.SIGHUP)  # (the watch may see it first: either way, once)
            await log.until("authorization reload failed")
            assert (await http_request(port, "GET", "/api", [token])).status == 503  # still allowed
            metrics = (await http_request(obs, "GET", "/metrics", [])).body.decode()
            assert "kasd_authz_config_ok 0.0" in metrics
            assert 'kasd_authz_reloads_total{result="failed"}' in metrics
    text = log.text
    assert f"{path}:5:36: ci_access.projects[0].rules[0].if: expected a value after '=='" in text
    assert "the previous configuration stays in force" in text
    assert "only a restart applies" not in text  # kasd.yaml itself did not change
    assert "kasd stopped" in text


def test_example_config_is_valid(tmp_path: Path) -> None:
    from kasd.authz.keys import write_key_pair
    from kasd.config import config_from_mapping

    examples = Path(__file__).parents[2] / "examples"
    keys = write_key_pair(tmp_path)
    text = (examples / "kasd.yaml").read_text().replace("/etc/kasd/keys/jobtoken-signing.pub.pem", str(keys.public))
    doc = yaml.safe_load(text.replace("/etc/kasd/config-projects", str(examples / "config-projects")))
    for listener in doc["listeners"].values():
        listener.pop("tls", None)  # the example's certificate paths exist only on a real host
    config = config_from_mapping(doc)
    assert [a.id for a in config.agents] == [1, 2]
    assert config.authorization.enabled and config.authorization.tokens.public_keys == (keys.public,)


def test_sd_notify_sends_to_the_notify_socket(tmp_path: Path) -> None:
    import socket

    from daemonkit.notify import sd_notify

    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        assert sd_notify("READY=1", {"NOTIFY_SOCKET": path})
        assert server.recv(100) == b"READY=1"
    assert not sd_notify("READY=1", {})


def test_keepalive_settings_parse_and_name_the_key() -> None:
    """What kasd tolerates of agents, and how often it pings a peer replica it dialled: settings, checked."""
    from kasd.config import ConfigError
    from kasd.config.loading import load_config

    defaults = load_config([], {})
    assert defaults.agent.session_keepalive == {"keepalive_interval": 15.0, "keepalive_timeout": 45.0}  # as before
    assert defaults.private.session_keepalive == {"keepalive_interval": 15.0, "keepalive_timeout": 45.0}
    raised = load_config(["--agent-keepalive-timeout", "900"], {"KASD_PRIVATE_KEEPALIVE_INTERVAL": "50"})
    # kasd accepted the agent's session: it pings only after two thirds of its bound (the agent pings first)
    assert raised.agent.session_keepalive == {"keepalive_interval": 300.0, "keepalive_timeout": 900.0}
    assert raised.private.session_keepalive == {"keepalive_interval": 50.0, "keepalive_timeout": 150.0}
    for argv, env, message in [
        (["--agent-keepalive-timeout", "2"], {}, "listeners.agent.keepalive_timeout: must be between 3 and 10800"),
        ([], {"KASD_AGENT_KEEPALIVE_TIMEOUT": "soon"}, "listeners.agent.keepalive_timeout: 'soon' is not a number"),
        ([], {"KASD_PRIVATE_KEEPALIVE_INTERVAL": "7200"},
         "listeners.private.keepalive_interval: must be between 1 and 3600 seconds"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(argv, env)
