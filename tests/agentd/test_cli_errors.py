"""What an operator sees when agentd cannot start or meets an ordinary error: one line naming the
problem (``agentd: error: …`` and exit 2 for configuration, exit 1 for a health port that cannot be
bound), never a traceback and no usage text unless the command line itself is wrong; plus
``--version`` and a case-insensitive log level."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from agentd import __version__
from agentd.config import load_config
from tests.agentd.harness import AGENT_TOKEN, FakeKasd
from tests.daemons import running_daemon
from tests.forkrun import run_module
from wire.h2carrier import serve_h2_tunnels

pytestmark = pytest.mark.timeout(20)

KUBECONFIG = """\
apiVersion: v1
current-context: c
contexts: [{name: c, context: {cluster: c, user: u}}]
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: sa-token}}]
"""


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "agent.token").write_text(AGENT_TOKEN + "\n")
    (tmp_path / "k.kubeconfig").write_text(KUBECONFIG)
    return tmp_path


def base(d: Path, kas: str = "http://127.0.0.1:19150") -> list[str]:
    return ["--kas-address", kas, "--token-file", str(d / "agent.token"), "--kubeconfig", str(d / "k.kubeconfig")]


def run_agentd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("agentd", *args, timeout=15, env={"PATH": "/usr/bin:/bin", **(env or {})})


def fails(result: subprocess.CompletedProcess[str], code: int, line: str) -> None:
    """``line`` is all of stderr that is not a log line: no usage, no traceback."""
    assert result.returncode == code, result.stderr
    shown = [text for text in result.stderr.splitlines() if not text.startswith("time=")]
    assert shown == [line], result.stderr


def test_health_port_in_use(files: Path, taken_port: int) -> None:
    result = run_agentd(*base(files), "--health-address", f"127.0.0.1:{taken_port}")
    fails(result, 1, f"agentd: cannot listen on 127.0.0.1:{taken_port} (the health address): Address already in use")


@pytest.mark.parametrize("how", ["flag", "env", "file"])
def test_kas_ca_file_that_is_not_pem(files: Path, how: str) -> None:
    bad = files / "kas-ca.pem"
    bad.write_text("this is not a certificate\n")
    args, env = [*base(files, "https://127.0.0.1:19150"), "--health-address", "127.0.0.1:0"], {}
    if how == "flag":
        args += ["--kas-ca-file", str(bad)]
        where = "--kas-ca-file"
    elif how == "env":
        env = {"AGENTD_KAS_CA_FILE": str(bad)}
        where = "AGENTD_KAS_CA_FILE"
    else:
        (files / "agentd.yaml").write_text(f"kas_ca_file: {bad}\n")
        args += ["--config", str(files / "agentd.yaml")]
        where = f"kas_ca_file in {files / 'agentd.yaml'}"
    fails(run_agentd(*args, env=env), 2, f"agentd: error: {where}: CA file {bad} holds no PEM certificate")


def test_kas_ca_file_that_is_pem_is_accepted(files: Path) -> None:
    trustme.CA().cert_pem.write_to_path(str(files / "kas-ca.pem"))
    config = load_config([*base(files, "https://kas:8150/tunnel"), "--kas-ca-file", str(files / "kas-ca.pem")], {})
    assert config.kas_ca_file == files / "kas-ca.pem"


def test_ready_file_in_a_missing_directory(files: Path) -> None:
    ready = files / "x" / "nodir" / "ready.json"
    fails(run_agentd(*base(files), "--ready-file", str(ready)), 2,
          f"agentd: error: --ready-file: cannot write the ready file {ready}: directory {ready.parent} does not exist")
    (files / "plain").write_text("")
    (files / "agentd.yaml").write_text(f"ready_file: {files / 'plain' / 'ready.json'}\n")
    fails(run_agentd(*base(files), "--config", str(files / "agentd.yaml")), 2,
          f"agentd: error: ready_file in {files / 'agentd.yaml'}: cannot write the ready file "
          f"{files / 'plain' / 'ready.json'}: {files / 'plain'} is not a directory")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("connections: 3.7", "connections in {f}: expected a whole number, got 3.7"),
        ("connections: true", "connections in {f}: expected a whole number, got True"),
        ("pod_name: [a]", "pod_name in {f}: expected a string, got a list"),
        ("agent_id: true", "agent_id in {f}: expected a string, got true"),
        ("health_address: 8080", "health_address in {f}: expected a string, got an int"),
        ("log_level: {debug: 1}", "log_level in {f}: expected a string, got a mapping"),
        ("kube_context: 1.5", "kube_context in {f}: expected a string, got a float"),
    ],
)
def test_file_values_of_the_wrong_type(files: Path, text: str, problem: str) -> None:
    config = files / "agentd.yaml"
    config.write_text(text + "\n")
    fails(run_agentd(*base(files), "--config", str(config)), 2, f"agentd: error: {problem.format(f=config)}")


def test_agent_id_may_be_a_number(files: Path) -> None:
    (files / "agentd.yaml").write_text("agent_id: 42\n")
    assert load_config([*base(files), "--config", str(files / "agentd.yaml")], {}).agent_id == "42"


def test_configuration_errors_print_no_usage_but_a_wrong_command_line_does(files: Path) -> None:
    fails(run_agentd(*base(files), "--connections", "lots"), 2,
          "agentd: error: --connections: expected a whole number, got 'lots'")
    result = run_agentd(*base(files), "--bogus")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: agentd ")  # as kasd (argparse) does for a wrong command line
    assert result.stderr.endswith("agentd: error: unrecognized arguments: --bogus\n")
    assert "Traceback" not in result.stderr


def test_version() -> None:
    result = run_agentd("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"agentd {__version__}\n"


class GatedKasd(FakeKasd):
    """A FakeKasd that holds every tunnel request until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()

    async def authenticate(self, token: str, headers: dict[str, str]) -> Any:
        await self.gate.wait()
        return await super().authenticate(token, headers)


async def start_gated_kasd(nursery: trio.Nursery) -> GatedKasd:
    kasd = GatedKasd()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    await nursery.start(lambda task_status: serve_h2_tunnels(kasd.handler, listeners, authenticate=kasd.authenticate,
                                                             task_status=task_status))
    kasd.port = listeners[0].socket.getsockname()[1]
    return kasd


async def test_ready_file_that_cannot_be_written_later_is_logged_not_fatal(nursery: trio.Nursery, files: Path) -> None:
    kasd = await start_gated_kasd(nursery)
    run_dir = files / "run"
    run_dir.mkdir()
    args = [*base(files, kasd.url), "--connections", "1", "--health-address", "127.0.0.1:0",
            "--ready-file", str(run_dir / "ready.json")]
    with trio.fail_after(15):
        async with running_daemon("agentd", args) as log:
            await log.until("health listening")  # configuration checked; no tunnel yet (the gate)
            run_dir.rmdir()
            kasd.gate.set()
            await log.until("cannot write ready file")
            await log.until("\n")
    assert f"level=ERROR logger=daemonkit cannot write ready file path={run_dir / 'ready.json'} " \
           "error=No such file or directory" in log.text
    assert "agentd stopped" in log.text
    assert "Traceback" not in log.text


@pytest.mark.parametrize("how", ["flag", "env", "file"])
async def test_log_level_in_capitals(files: Path, how: str) -> None:
    args, env = [*base(files), "--health-address", "127.0.0.1:0"], {}
    if how == "flag":
        args += ["--log-level", "DEBUG"]
    elif how == "env":
        env["AGENTD_LOG_LEVEL"] = "DEBUG"
    else:
        (files / "agentd.yaml").write_text("log_level: DEBUG\n")
        args += ["--config", str(files / "agentd.yaml")]
    with trio.fail_after(15):
        async with running_daemon("agentd", args, env=env) as log:
            await log.until("health listening")
    assert "agentd stopped" in log.text
