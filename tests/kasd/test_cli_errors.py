"""What an operator sees when kasd cannot start: one line naming the problem and where the bad value
came from (the file, an environment variable, a flag), exit 2 for configuration and 1 for a port
that cannot be bound, never a traceback; plus ``--version`` and a case-insensitive ``--log-level``."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

import pytest
import trio
import trustme
import yaml

from kasd.tokens import hash_token
from tests.daemons import running_daemon
from tests.forkrun import run_module

pytestmark = pytest.mark.timeout(20)

AGENT = {"id": 1, "name": "prod", "config_project": "g/p", "token_sha256": hash_token("agent-one")}
PORT_0 = ["--agent-address", "127.0.0.1:0", "--observability-address", "127.0.0.1:0", "--kubernetes-api-address", "127.0.0.1:0"]


def _kasd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("kasd", *args, timeout=15, env={"PATH": "/usr/bin:/bin", **(env or {})})


def _config(tmp_path: Path, doc: object = None) -> str:
    path = tmp_path / "kasd.yaml"
    path.write_text("" if doc is None else yaml.safe_dump(doc))
    return str(path)


def _fails(result: subprocess.CompletedProcess[str], code: int, line: str) -> None:
    """``line`` is the whole of stderr that is not a log line: one line, no traceback."""
    assert result.returncode == code, result.stderr
    shown = [text for text in result.stderr.splitlines() if not text.startswith("time=")]
    assert shown == [line], result.stderr


@pytest.mark.parametrize("how", ["flag", "env"])
def test_ready_file_in_a_missing_directory_is_a_configuration_error(tmp_path: Path, how: str) -> None:
    ready = "/nonexistent/dir/r.json"
    if how == "flag":
        result = _kasd("--config", _config(tmp_path), *PORT_0, "--ready-file", ready)
        source = "--ready-file"
    else:
        result = _kasd("--config", _config(tmp_path), *PORT_0, env={"KASD_READY_FILE": ready})
        source = "KASD_READY_FILE"
    _fails(result, 2, f"kasd: configuration error: {source}: cannot write the ready file '{ready}': "
                      "directory /nonexistent/dir does not exist")


def test_ready_file_under_a_file_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("")
    result = _kasd(*PORT_0, "--ready-file", str(tmp_path / "plain" / "r.json"))
    _fails(result, 2, f"kasd: configuration error: --ready-file: cannot write the ready file "
                      f"'{tmp_path / 'plain' / 'r.json'}': {tmp_path / 'plain'} is not a directory")


def test_two_agents_with_one_token_are_a_configuration_error(tmp_path: Path) -> None:
    other = {**AGENT, "id": 2, "name": "staging"}
    config = _config(tmp_path, {"agents": [AGENT, other]})
    _fails(_kasd("--config", config), 2,
           f"kasd: configuration error: {config}: agents[1].token_sha256: agent 2 (staging) has the same token "
           "as agents[0], agent 1 (prod); each agent needs a token of its own")


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        ([], {"KASD_AGENT_WAIT_TIMEOUT": "abc"}, "KASD_AGENT_WAIT_TIMEOUT: agent_wait_timeout: 'abc' is not a number of seconds"),
        (["--shutdown-timeout", "-1"], {}, "--shutdown-timeout: shutdown_timeout: must be greater than 0 seconds, got -1.0"),
        (["--agent-address", "nonsense"], {}, "--agent-address: listeners.agent.address: 'nonsense' is not host:port (e.g. 0.0.0.0:8154)"),
        ([], {"KASD_OBSERVABILITY_ADDRESS": "h:x"}, "KASD_OBSERVABILITY_ADDRESS: listeners.observability.address: port 'x' is not a number (ASCII digits 0-9 only)"),
        ([], {"KASD_LOG_LEVEL": "loud"}, "KASD_LOG_LEVEL: log_level: must be one of debug, info, warning, error, got 'loud'"),
        ([], {"KASD_KUBERNETES_API_STRIP_REQUEST_HEADERS": "x-a,bad name"},
         "KASD_KUBERNETES_API_STRIP_REQUEST_HEADERS: listeners.kubernetes_api.strip_request_headers[1]: "
         "'bad name' is not a header name (or a prefix ending in '*')"),
        (["--kubernetes-api-strip-request-header", "a b"], {},
         "--kubernetes-api-strip-request-header: listeners.kubernetes_api.strip_request_headers[0]: "
         "'a b' is not a header name (or a prefix ending in '*')"),
        ([], {"KASD_AGENT_WAIT_TIMEOUT": "nan"}, "KASD_AGENT_WAIT_TIMEOUT: agent_wait_timeout: must be a finite number of seconds, got nan"),
    ],
)
def test_a_bad_environment_variable_or_flag_is_blamed_on_itself(
    tmp_path: Path, args: list[str], env: dict[str, str], line: str
) -> None:
    result = _kasd("--config", _config(tmp_path), *args, env=env)
    _fails(result, 2, f"kasd: configuration error: {line}")


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"listeners": {"kubernetes_api": {"header_timeout": float("nan")}}}, "listeners.kubernetes_api.header_timeout"),
        ({"listeners": {"agent": {"http2": {"reset_window": float("nan")}}}}, "listeners.agent.http2.reset_window"),
        ({"routing": {"breaker_initial_hold": float("inf")}}, "routing.breaker_initial_hold"),
    ],
)
def test_a_duration_that_is_not_a_finite_number_is_a_configuration_error(
    tmp_path: Path, doc: object, key: str
) -> None:
    """``.nan`` once passed (NaN is not <= 0) and every proxy connection then died on
    ``ValueError: deadline must not be NaN``."""
    config = _config(tmp_path, doc)
    result = _kasd("--config", config, *PORT_0)
    assert result.returncode == 2, result.stderr
    shown = [text for text in result.stderr.splitlines() if not text.startswith("time=")]
    assert len(shown) == 1 and shown[0].startswith(f"kasd: configuration error: {config}: {key}: must be a finite number"), result.stderr


def test_a_breaker_hold_that_starts_above_its_maximum_is_a_configuration_error(tmp_path: Path) -> None:
    config = _config(tmp_path, {"routing": {"breaker_initial_hold": 10, "breaker_max_hold": 5}})
    _fails(_kasd("--config", config, *PORT_0), 2,
           f"kasd: configuration error: {config}: routing.breaker_initial_hold: 10s is longer than "
           "routing.breaker_max_hold (5s), the longest hold")


def test_two_listeners_on_one_address_are_a_configuration_error(tmp_path: Path) -> None:
    config = _config(tmp_path, {"listeners": {"agent": {"address": "127.0.0.1:18150"}, "kubernetes_api": {"address": "127.0.0.1:18150"}}})
    _fails(_kasd("--config", config), 2,
           f"kasd: configuration error: {config}: listeners.kubernetes_api.address: 127.0.0.1:18150 is also "
           "the agent listener's address (each listener needs its own)")
    _fails(_kasd("--config", _config(tmp_path), "--agent-address", "127.0.0.1:18150", "--observability-address", "127.0.0.1:18150"), 2,
           "kasd: configuration error: --observability-address: listeners.observability.address: 127.0.0.1:18150 "
           "is also the agent listener's address (each listener needs its own)")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert, other = ca.issue_cert("kasd.example"), ca.issue_cert("other.example")
    cert.cert_chain_pems[0].write_to_path(str(d / "tls.crt"))
    cert.private_key_pem.write_to_path(str(d / "tls.key"))
    other.private_key_pem.write_to_path(str(d / "other.key"))
    (d / "junk.pem").write_text("not a PEM file\n")
    return d


@pytest.mark.parametrize(
    ("cert", "key", "problem"),
    [
        ("tls.crt", "other.key", "the key does not belong to the certificate"),
        ("tls.crt", "junk.pem", "no PEM private key in '{d}/junk.pem'"),
        ("junk.pem", "tls.key", "no PEM certificate in '{d}/junk.pem'"),
        ("tls.key", "tls.crt", "no PEM certificate in '{d}/tls.key'"),
    ],
)
def test_a_tls_pair_that_does_not_load_names_both_files(
    tmp_path: Path, tls_files: Path, cert: str, key: str, problem: str
) -> None:
    d = tls_files
    config = _config(tmp_path, {"listeners": {"kubernetes_api": {"tls": {"cert": str(d / cert), "key": str(d / key)}}}})
    _fails(_kasd("--config", config), 2,
           f"kasd: configuration error: {config}: listeners.kubernetes_api.tls: cannot load certificate "
           f"'{d / cert}' with key '{d / key}': {problem.format(d=d)}")


@pytest.mark.parametrize("listener", ["agent", "observability", "kubernetes_api"])
def test_a_port_in_use_names_its_listener(taken_port: int, listener: str) -> None:
    flag = f"--{listener.replace('_', '-')}-address"
    args = [*PORT_0, flag, f"127.0.0.1:{taken_port}"]  # the later flag wins
    _fails(_kasd(*args), 1,
           f"kasd: cannot listen on 127.0.0.1:{taken_port} (the {listener} listener): Address already in use")


def test_version() -> None:
    result = _kasd("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"kasd {metadata.version('kasd')}\n"


async def test_log_level_flag_is_case_insensitive() -> None:
    with trio.fail_after(10):
        async with running_daemon("kasd", [*PORT_0, "--log-level", "DEBUG"]) as log:
            await log.until("kasd listening")
    assert "kasd starting version=" in log.text


@pytest.mark.parametrize("listener", ["agent", "kubernetes_api", "api"])
def test_plain_text_beyond_loopback_needs_saying_so(tmp_path: Path, listener: str) -> None:
    """Without TLS, a listener beyond loopback is refused before kasd listens, naming the setting that allows it."""
    args = [*PORT_0, "--api-address", "127.0.0.1:0", f"--{listener.replace('_', '-')}-address", "0.0.0.0:0"]
    result = _kasd(*args)
    assert result.returncode == 2, result.stderr
    assert (f"kasd: configuration error: listeners.{listener}.tls: missing; the {listener} listener would serve "
            f"plain text on 0.0.0.0:0, beyond loopback") in result.stderr
    assert f"listeners.{listener}.insecure_plaintext: true (KASD_{listener.upper()}_INSECURE_PLAINTEXT)" in result.stderr
    assert "Traceback" not in result.stderr


def test_plain_text_beyond_loopback_on_purpose_is_a_warning_naming_the_listener(
        caplog: pytest.LogCaptureFixture) -> None:
    from kasd.config import config_from_mapping
    from kasd.listening import listener_names, warn_plaintext

    config = config_from_mapping({"listeners": {"agent": {"address": "10.0.0.5:8150", "insecure_plaintext": True},
                                                "observability": {"address": "0.0.0.0:8151"},
                                                "kubernetes_api": {"address": "127.0.0.1:8154"}}})
    warn_plaintext(config, listener_names(config, replicated=False))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2, warnings
    assert "the agent listener serves plain text beyond loopback: listeners.agent.insecure_plaintext is true" \
        in warnings[0] and "address=10.0.0.5:8150" in warnings[0]
    assert "observability listener serves health and metrics in plain text" in warnings[1]
