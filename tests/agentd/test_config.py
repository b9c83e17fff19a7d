"""Configuration: file < environment < flags, and errors that say what is wrong (exit code 2)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import trio
import trio.testing
import trustme

from agentd.config import AgentdConfig, ConfigError, load_config
from kasd.config.loading import load_config as load_kasd_config
from tests.forkrun import run_module
from wire.session import Session, connect_session

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text("secret-agent-token\n")
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\n")
    return tmp_path


def base_flags(d: Path) -> list[str]:
    return ["--token-file", str(d / "token"), "--kubeconfig", str(d / "kubeconfig")]


def test_defaults(files: Path) -> None:
    config = load_config(["--kas-address", "http://kas:8150/tunnel", *base_flags(files)], {"POD_NAME": "p-1"})
    assert config.kas_addresses == ("http://kas:8150/tunnel",)
    assert config.connections == 2
    assert config.health_address == "0.0.0.0:8080"
    assert config.log_level == "info"
    assert config.pod_name == "p-1"
    assert not config.in_cluster
    assert "secret-agent-token" not in repr(config)


def test_file_env_flag_precedence(files: Path) -> None:
    (files / "agentd.yaml").write_text(
        "kas_address: [https://file-a/tunnel, https://file-b/tunnel]\n"
        f"token_file: {files / 'token'}\n"
        f"kubeconfig: {files / 'kubeconfig'}\n"
        "connections: 5\nhealth_address: 127.0.0.1:9000\nagent_id: from-file\nlog_level: warning\n"
    )
    only_file = load_config(["--config", str(files / "agentd.yaml")], {})
    assert only_file.kas_addresses == ("https://file-a/tunnel", "https://file-b/tunnel")
    assert (only_file.connections, only_file.health_port, only_file.agent_id) == (5, 9000, "from-file")

    env = {"AGENTD_CONFIG": str(files / "agentd.yaml"), "AGENTD_KAS_ADDRESS": "http://env-1:8150/tunnel,http://env-2",
           "AGENTD_CONNECTIONS": "3", "AGENTD_AGENT_ID": "from-env", "POD_UID": "u-1"}
    with_env = load_config([], env)
    assert with_env.kas_addresses == ("http://env-1:8150/tunnel", "http://env-2/tunnel")
    assert (with_env.connections, with_env.agent_id, with_env.pod_uid) == (3, "from-env", "u-1")
    assert with_env.health_port == 9000  # still from the file
    assert with_env.log_level == "warning"

    with_flags = load_config(["--kas-address", "http://flag/tunnel", "--kas-address", "http://flag2/tunnel",
                              "--connections", "1", "--health-address", "127.0.0.1:0", "--log-level", "debug"], env)
    assert with_flags.kas_addresses == ("http://flag/tunnel", "http://flag2/tunnel")
    assert (with_flags.connections, with_flags.health_port, with_flags.log_level) == (1, 0, "debug")
    assert with_flags.agent_id == "from-env"


def test_later_source_picks_kubeconfig_over_in_cluster(files: Path) -> None:
    (files / "agentd.yaml").write_text(f"kas_address: http://k/tunnel\ntoken_file: {files / 'token'}\nin_cluster: true\n")
    config = load_config(["--config", str(files / "agentd.yaml"), "--kubeconfig", str(files / "kubeconfig")], {})
    assert config.kubeconfig == files / "kubeconfig" and not config.in_cluster
    config = load_config(["--config", str(files / "agentd.yaml")], {"KUBERNETES_SERVICE_HOST": "h"})
    assert config.in_cluster and config.kubeconfig is None


def test_example_config_file_loads(files: Path) -> None:
    example = Path(__file__).parents[2] / "examples" / "agentd.yaml"
    text = example.read_text().replace("/etc/agentd/token", str(files / "token"))
    trustme.CA().cert_pem.write_to_path(str(files / "kas-ca.pem"))  # the CA file must hold a certificate
    text = text.replace("kas_ca_file: /etc/agentd/kas-ca.pem", f"kas_ca_file: {files / 'kas-ca.pem'}")
    (files / "webhook-secret").write_text("example-webhook-secret\n")
    text = text.replace("/etc/agentd/webhook-secret", str(files / "webhook-secret"))
    (files / "example.yaml").write_text(text)
    config = load_config(["--config", str(files / "example.yaml")], {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert config.kas_addresses == ("https://kas.example.com:8150/tunnel",)
    assert config.in_cluster and config.connections == 2 and config.agent_id == "1"
    assert [(h.type, h.action) for h in config.events.handlers] == [("push", "webhook"), ("push", "annotate"),
                                                                     ("*", "annotate")]


def test_websocket_addresses_mixed_with_http2_ones(files: Path) -> None:
    # The scheme picks the carrier per address: wss:// (ws://) a WebSocket, https:// (http://) HTTP/2.
    config = load_config(["--kas-address", "wss://kas-a:8150", "--kas-address", "https://kas-b:8150/tunnel",
                          "--kas-address", "ws://127.0.0.1:8150/tunnel", *base_flags(files)], {})
    assert config.kas_addresses == ("wss://kas-a:8150/tunnel", "https://kas-b:8150/tunnel", "ws://127.0.0.1:8150/tunnel")


def test_plain_text_to_kasd_beyond_loopback_is_a_warning_at_start(files: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Plain text is the URL's explicit choice; across a network it carries the agent token in clear.
    from agentd.agent import warn_plaintext

    config = load_config(["--kas-address", "http://10.0.0.7:8150/tunnel", "--kas-address", "ws://kasd.example/tunnel",
                          "--kas-address", "wss://kasd.example/tunnel", "--kas-address", "http://127.0.0.1:8150",
                          "--kas-address", "ws://localhost:8150", *base_flags(files)], {})
    caplog.set_level("WARNING", logger="agentd")
    warn_plaintext(config)
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [line.split()[8] for line in lines] == ["url=http://10.0.0.7:8150/tunnel:", "url=ws://kasd.example/tunnel:"]
    assert all("use https:// or wss://" in line for line in lines) and "secret-agent-token" not in caplog.text


def test_in_cluster_is_the_default_inside_a_pod(files: Path) -> None:
    config = load_config(["--kas-address", "http://k/tunnel", "--token-file", str(files / "token")],
                         {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    assert config.in_cluster and config.kubernetes_service_host == "10.0.0.1"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no kasd address"),
        (["--kas-address", "ftp://kas/tunnel"], "must be https://host:port/tunnel .HTTP/2., wss://host:port/tunnel"),
        (["--kas-address", "http://kas:99999/tunnel"], "bad port"),
        (["--connections", "many"], "--connections: expected a whole number, got 'many'"),
        (["--connections", "0"], "--connections: must be between 1 and 64"),
        (["--health-address", "localhost"], "--health-address: expected HOST:PORT"),
        # digits str.isdigit() takes and int() refuses, or reads as others: each named, never a traceback
        (["--health-address", "h:\u00b2"], "--health-address: expected HOST:PORT .*port '\u00b2' is not a number"),
        (["--health-address", "h:" + "8" * 5000], "--health-address: expected HOST:PORT .*port '8+'… is too long"),
        (["--connections", "\u0663"], "--connections: expected a whole number"),
        (["--log-level", "loud"], "--log-level: must be one of"),
        (["--kas-ca-file", "/nonexistent/ca.pem"], "CA file /nonexistent/ca.pem does not exist"),
        (["--in-cluster"], "choose one way to reach the API server"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--upstream-response-header-timeout", "soon"],
         "--upstream-response-header-timeout: expected a number of seconds, got 'soon'"),
        (["--upstream-response-header-timeout", "-1"], "--upstream-response-header-timeout: must be 0 \\(off\\) or more"),
        (["--reconnect-quick-window", "inf"], "--reconnect-quick-window: expected a number of seconds, got 'inf'"),
    ],
)
def test_errors_name_the_problem(files: Path, args: list[str], message: str) -> None:
    flags = [] if args == [] else ["--kas-address", "http://kas/tunnel"]
    with pytest.raises(ConfigError, match=message.replace("?", r"\?")):
        load_config([*flags, *base_flags(files), *args], {})


@pytest.mark.parametrize("address", ["http://admin:s3cr3t@kas/tunnel", "http://admin:s3cr3t@kas:99999/tunnel",
                                     "ftp://admin:s3cr3t@kas/tunnel"])
def test_a_kasd_address_with_user_information_is_refused_without_quoting_it(files: Path, address: str) -> None:
    """Every tunnel log line names its URL: a password there would be in all of them."""
    with pytest.raises(ConfigError) as info:
        load_config(["--kas-address", address, *base_flags(files)], {})
    assert "s3cr3t" not in str(info.value) and "admin" not in str(info.value) and "…@kas" in str(info.value)


def test_timeouts_from_file_environment_and_flags(files: Path) -> None:
    defaults = load_config(["--kas-address", "http://k/tunnel", *base_flags(files)], {})
    assert (defaults.upstream_response_header_timeout, defaults.reconnect_quick_window) == (90.0, 60.0)
    (files / "agentd.yaml").write_text("upstream_response_header_timeout: 120\nreconnect_quick_window: 45.5\n")
    from_file = load_config(["--config", str(files / "agentd.yaml"), "--kas-address", "http://k/tunnel",
                             *base_flags(files)], {})
    assert (from_file.upstream_response_header_timeout, from_file.reconnect_quick_window) == (120.0, 45.5)
    env = {"AGENTD_UPSTREAM_RESPONSE_HEADER_TIMEOUT": "0", "AGENTD_RECONNECT_QUICK_WINDOW": "10"}
    from_env = load_config(["--config", str(files / "agentd.yaml"), "--kas-address", "http://k/tunnel",
                            *base_flags(files)], env)
    assert (from_env.upstream_response_header_timeout, from_env.reconnect_quick_window) == (0.0, 10.0)
    from_flags = load_config(["--kas-address", "http://k/tunnel", *base_flags(files),
                              "--upstream-response-header-timeout", "2.5", "--reconnect-quick-window", "0"], env)
    assert (from_flags.upstream_response_header_timeout, from_flags.reconnect_quick_window) == (2.5, 0.0)
    (files / "bad.yaml").write_text("upstream_response_header_timeout: true\n")
    with pytest.raises(ConfigError, match=r"upstream_response_header_timeout in .*bad.yaml: expected a number of seconds"):
        load_config(["--config", str(files / "bad.yaml"), "--kas-address", "http://k/tunnel", *base_flags(files)], {})


def test_token_and_kubeconfig_errors(files: Path) -> None:
    kas = ["--kas-address", "http://kas/tunnel"]
    with pytest.raises(ConfigError, match="no agent token"):
        load_config([*kas, "--kubeconfig", str(files / "kubeconfig")], {})
    with pytest.raises(ConfigError, match=r"token file .*missing does not exist"):
        load_config([*kas, "--token-file", str(files / "missing"), "--kubeconfig", str(files / "kubeconfig")], {})
    (files / "empty").write_text("  \n")
    with pytest.raises(ConfigError, match=r"--token-file: token file .*empty is empty"):
        load_config([*kas, "--token-file", str(files / "empty"), "--kubeconfig", str(files / "kubeconfig")], {})
    with pytest.raises(ConfigError, match="no way to reach the Kubernetes API"):
        load_config([*kas, "--token-file", str(files / "token")], {})
    with pytest.raises(ConfigError, match=r"kubeconfig file .*nope does not exist"):
        load_config([*kas, "--token-file", str(files / "token"), "--kubeconfig", str(files / "nope")], {})


def test_file_errors(files: Path) -> None:
    bad = files / "bad.yaml"
    bad.write_text("kas_adress: http://typo\n")
    with pytest.raises(ConfigError, match=r"unknown key.*kas_adress"):
        load_config(["--config", str(bad)], {})
    bad.write_text("kas_address: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(["--config", str(bad)], {})
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(["--config", str(bad)], {})
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(["--config", str(files / "absent.yaml")], {})
    bad.write_text(f"kas_address: http://k/tunnel\ntoken_file: {files / 'token'}\nin_cluster: maybe\n")
    with pytest.raises(ConfigError, match=r"in_cluster in .*expected true or false"):
        load_config(["--config", str(bad)], {})


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("agentd", *args, timeout=15, env={"PATH": "/usr/bin:/bin", **(env or {})})


def test_cli_bad_input_exits_2_with_a_clear_message(files: Path) -> None:
    result = run_cli("--kas-address", "http://kas/tunnel", *base_flags(files), "--connections", "lots")
    assert result.returncode == 2
    assert "agentd: error: --connections: expected a whole number, got 'lots'" in result.stderr
    assert "usage: agentd" not in result.stderr  # one line; the usage is for a wrong command line
    assert "Traceback" not in result.stderr

    result = run_cli("--kas-address", "http://kas/tunnel", "--token-file", str(files / "nope"),
                     "--kubeconfig", str(files / "kubeconfig"))
    assert result.returncode == 2
    assert "token file" in result.stderr and "does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_bad_kubeconfig_exits_2(files: Path) -> None:
    (files / "kubeconfig").write_text(
        "current-context: c\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "clusters: [{name: c, cluster: {server: 'https://h'}}]\n"
        "users: [{name: u, user: {exec: {command: aws}}}]\n")
    result = run_cli("--kas-address", "http://kas/tunnel", *base_flags(files))
    assert result.returncode == 2
    assert "exec credential plugin" in result.stderr
    assert "secret-agent-token" not in result.stderr + result.stdout


def test_cli_help_teaches_with_examples() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    assert "examples:" in result.stdout
    assert "--kas-address" in result.stdout and "AGENTD_TOKEN_FILE" in result.stdout


def test_config_is_frozen(files: Path) -> None:
    config = load_config(["--kas-address", "http://k/tunnel", *base_flags(files)], {})
    assert isinstance(config, AgentdConfig)
    with pytest.raises(AttributeError):
        config.connections = 3  # type: ignore[misc]


def test_keepalive_interval_and_timeout_are_settings(files: Path) -> None:
    """The tunnel's keepalive follows the network's idle timeouts: file, env or flag, each checked."""
    flags = ["--kas-address", "http://kas:8150/tunnel", *base_flags(files)]
    assert load_config(flags, {}).session_keepalive == {"keepalive_interval": 15.0, "keepalive_timeout": 45.0}
    # the timeout follows the interval unless set
    assert load_config([*flags, "--keepalive-interval", "50"], {}).session_keepalive == {
        "keepalive_interval": 50.0, "keepalive_timeout": 150.0}
    from_env = load_config(flags, {"AGENTD_KEEPALIVE_INTERVAL": "30", "AGENTD_KEEPALIVE_TIMEOUT": "60"})
    assert from_env.session_keepalive == {"keepalive_interval": 30.0, "keepalive_timeout": 60.0}
    (files / "agentd.yaml").write_text("keepalive_interval: 240\n")
    assert load_config([*flags, "--config", str(files / "agentd.yaml")], {}).keepalive_interval == 240.0

    for argv, env, message in [
        (["--keepalive-interval", "0"], {}, "--keepalive-interval: must be between 1 and 3600 seconds, got '0'"),
        (["--keepalive-interval", "soon"], {}, "--keepalive-interval: expected a number of seconds, got 'soon'"),
        ([], {"AGENTD_KEEPALIVE_INTERVAL": "7200"}, "AGENTD_KEEPALIVE_INTERVAL: must be between 1 and 3600"),
        (["--keepalive-interval", "30", "--keepalive-timeout", "45"], {},
         "--keepalive-timeout (45 s) must be at least twice --keepalive-interval (30 s)"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config([*flags, *argv], env)
    (files / "agentd.yaml").write_text("keepalive_interval: true\n")
    with pytest.raises(ConfigError, match=r"keepalive_interval in .*agentd\.yaml: expected a number of seconds"):
        load_config([*flags, "--config", str(files / "agentd.yaml")], {})


async def test_a_configured_keepalive_is_what_the_tunnel_uses(files: Path, autojump_clock: trio.abc.Clock) -> None:
    """agentd set to ping every 40 s (not the default 15) and kasd tolerating 120 s of silence: over an
    idle tunnel agentd pings every 40 s, kasd never does, and the tunnel stays up."""
    agent = load_config(["--kas-address", "http://kas:8150/tunnel", *base_flags(files), "--keepalive-interval", "40"],
                        {})
    kasd = load_kasd_config(["--agent-keepalive-timeout", "120"], {})
    left, right = trio.testing.memory_stream_pair()
    pings: dict[str, list[float]] = {"agentd": [], "kasd": []}
    async with trio.open_nursery() as nursery:
        sessions: dict[str, Session] = {}

        async def start(name: str, transport: trio.abc.Stream, client: bool, keepalive: dict[str, float]) -> None:
            sessions[name] = await connect_session(nursery, transport, client=client, **keepalive)

        async with trio.open_nursery() as starter:
            starter.start_soon(start, "agentd", left, True, agent.session_keepalive)
            starter.start_soon(start, "kasd", right, False, kasd.agent.session_keepalive)
        dialled, accepted = sessions["agentd"], sessions["kasd"]
        started = trio.current_time()
        # Each PING sent moves its connection's next opaque on: looked at every second, half a second
        # after the whole seconds the timers fire on (the mux may run compiled, where ping() cannot
        # be replaced on an instance to record the calls).
        sent = {name: session.connection._next_ping for name, session in sessions.items()}
        await trio.sleep(0.5)
        for _ in range(170):
            await trio.sleep(1)
            for name, session in sessions.items():
                if session.connection._next_ping != sent[name]:
                    sent[name] = session.connection._next_ping
                    pings[name].append(round(trio.current_time() - started - 0.5))
        assert pings == {"agentd": [40, 80, 120, 160], "kasd": []}
        assert not dialled.closed and not accepted.closed
        nursery.cancel_scope.cancel()


def test_the_kas_ca_file_is_read_again_for_the_next_dial(files: Path) -> None:
    """agentd's kas_ca_file is looked at every kas_ca_reload_interval (and on SIGHUP): a bundle that
    gains kasd's new CA verifies the next dial without a restart."""
    import ssl

    from agentd.agent import kas_ssl_context
    from netio.tlsreload import reload_all

    old, new = trustme.CA(), trustme.CA()
    old.cert_pem.write_to_path(str(files / "kas-ca.pem"))
    config = load_config(["--kas-address", "https://kas:8150/tunnel", "--token-file", str(files / "token"),
                          "--kas-ca-file", str(files / "kas-ca.pem"), "--kas-ca-reload-interval", "30"],
                         {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert config.kas_ca_reload_interval == 30
    context = kas_ssl_context(config)
    assert context is not None

    def trusted() -> list[object]:
        """The CAs the next dial verifies kasd by."""
        probe = context.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), server_hostname="kas")
        return probe.context.get_ca_certs()

    assert len(trusted()) == 1  # that CA alone, never the system's too
    files.joinpath("kas-ca.pem").write_bytes(old.cert_pem.bytes() + new.cert_pem.bytes())
    reload_all([context])  # what SIGHUP does
    assert len(trusted()) == 2


def test_the_health_certificate_comes_with_its_key_and_must_load(files: Path) -> None:
    """health_cert_file and health_key_file go together and are loaded at start: a wrong one is an
    error naming the settings and the file (never a key's bytes)."""
    import trustme

    leaf = trustme.CA().issue_cert("127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(str(files / "tls.crt"))
    leaf.private_key_pem.write_to_path(str(files / "tls.key"))
    base = ["--kas-address", "https://kas:8150/tunnel", "--token-file", str(files / "token")]
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    config = load_config([*base, "--health-cert-file", str(files / "tls.crt"), "--health-key-file",
                          str(files / "tls.key"), "--tls-reload-interval", "0"], env)
    assert (config.health_cert_file, config.tls_reload_interval) == (files / "tls.crt", 0)
    with pytest.raises(ConfigError, match="--health-cert-file and health_key_file go together"):
        load_config([*base, "--health-cert-file", str(files / "tls.crt")], env)
    with pytest.raises(ConfigError) as error:
        load_config([*base, "--health-cert-file", str(files / "tls.key"), "--health-key-file",
                     str(files / "tls.key")], env)
    assert f"--health-cert-file / --health-key-file: no PEM certificate in {str(files / 'tls.key')!r}" \
        in str(error.value)
