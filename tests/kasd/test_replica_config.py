"""The replica settings, as an operator meets them: each mistake is one line naming the key and the
problem, exit 2, and never a secret in it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kasd.config import ConfigError, config_from_mapping
from tests.kasd.test_cli_errors import PORT_0, _config, _kasd

SECRET = "peer-secret-0123456789abcdef0123456789"


def _replica(tmp_path: Path, **routing: object) -> dict[str, object]:
    (tmp_path / "secret").write_text(SECRET)
    return {
        "listeners": {"agent": {"address": "127.0.0.1:0"}, "observability": {"address": "127.0.0.1:0"},
                      "kubernetes_api": {"address": "127.0.0.1:0"}, "private": {"address": "127.0.0.1:0"}},
        "routing": {"redis": {"url": "redis://127.0.0.1:6379/0"}, "peer_secret_file": str(tmp_path / "secret"),
                    **routing},
    }


def test_a_lone_kasd_needs_none_of_it() -> None:
    config = config_from_mapping({})
    assert not config.routing.replicated and config.routing.weight == 10


def test_a_replica_configuration_loads_and_never_shows_the_secret(tmp_path: Path) -> None:
    config = config_from_mapping(_replica(tmp_path, weight=20, leave_timeout=0.5))
    assert config.routing.replicated and config.routing.weight == 20
    assert config.routing.leave_timeout == 0.5 and config_from_mapping({}).routing.leave_timeout == 2.0
    assert config.routing.peer_secret_file is not None and config.routing.peer_secret_file.value == SECRET
    assert SECRET not in repr(config)


@pytest.mark.parametrize(("routing", "words"), [
    ({"redis": {"url": "redis://user:hunter2@10.0.0.1:6379"}}, "must not hold a password (put it in routing.redis.password_file)"),
    ({"redis": {"url": "http://10.0.0.1"}}, "must start with one of redis://, rediss://, redis+cluster://, redis+sentinel://"),
    ({"redis": {"url": "redis+sentinel://10.0.0.1:26379"}}, "must name the master"),
    ({"weight": 0}, "routing.weight"),
    ({"name": "10.0.0.5:0"}, "must name a real port"),
    ({"private_url": "ftp://x"}, "must be http://host:port or https://host:port"),
    ({"leave_timeout": 0}, "routing.leave_timeout: must be greater than 0 seconds"),
])
def test_bad_replica_settings_name_the_key(tmp_path: Path, routing: dict[str, object], words: str) -> None:
    doc = _replica(tmp_path)
    merged = dict(doc["routing"])  # type: ignore[arg-type]
    for key, value in routing.items():
        merged[key] = {**merged[key], **value} if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    doc["routing"] = merged
    with pytest.raises(ConfigError) as error:
        config_from_mapping(doc)
    assert words in str(error.value)
    assert "hunter2" not in str(error.value)


def test_replicas_must_authenticate_each_other(tmp_path: Path) -> None:
    doc = _replica(tmp_path)
    del doc["routing"]["peer_secret_file"]  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"replicas must authenticate each other: set routing\.peer_secret_file"):
        config_from_mapping(doc)


def test_a_short_peer_secret_is_refused_without_showing_it(tmp_path: Path) -> None:
    doc = _replica(tmp_path)
    (tmp_path / "secret").write_text("short-secret")
    with pytest.raises(ConfigError) as error:
        config_from_mapping(doc)
    assert "is 12 characters; it needs at least 32" in str(error.value) and "short-secret" not in str(error.value)


@pytest.mark.parametrize(("private", "routing", "why"), [
    ({"address": "0.0.0.0:8155"}, {"private_url": "http://10.0.0.5:8155"},
     "listeners.private listens on 0.0.0.0:8155 without TLS"),
    ({"address": "10.0.0.5:8155"}, {}, "listeners.private listens on 10.0.0.5:8155 without TLS"),
    ({"address": "127.0.0.1:8155"}, {"private_url": "http://10.0.0.5:8155"},
     "routing.private_url 'http://10.0.0.5:8155' is plain http:// to another host"),
])
def test_a_peer_secret_that_would_cross_the_network_in_clear_is_refused(
        tmp_path: Path, private: dict[str, object], routing: dict[str, object], why: str) -> None:
    doc = _replica(tmp_path, **routing)
    doc["listeners"]["private"] = private  # type: ignore[index]
    with pytest.raises(ConfigError) as error:
        config_from_mapping(doc)
    message = str(error.value)
    assert message.startswith("listeners.private.tls: missing; the peer secret (routing.peer_secret_file) would "
                              f"cross the network in clear ({why})"), message
    assert "listeners.private.insecure_plaintext: true" in message and SECRET not in message
    doc["listeners"]["private"] = {**private, "insecure_plaintext": True}  # type: ignore[index]
    assert config_from_mapping(doc).private.insecure_plaintext  # on purpose: allowed (and a WARNING at start)


def test_a_private_port_with_tls_needs_the_ca_its_peers_are_checked_with(tmp_path: Path) -> None:
    # Without it, peers dial https:// trusting the system's CAs: a member URL written into Redis for a
    # host with any public certificate would receive the peer secret.
    import trustme

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    server.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    server.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    doc = _replica(tmp_path, private_url="https://127.0.0.1:8155")
    doc["listeners"]["private"] = {"address": "127.0.0.1:8155",  # type: ignore[index]
                                   "tls": {"cert": str(tmp_path / "cert.pem"), "key": str(tmp_path / "key.pem")}}
    with pytest.raises(ConfigError, match=r"^routing\.peer_ca_file: missing; listeners\.private has TLS, so peers "
                                          r"dial https://, and without the CA .* would trust the system's CAs"):
        config_from_mapping(doc)
    doc["routing"]["peer_ca_file"] = str(tmp_path / "ca.pem")  # type: ignore[index]
    assert config_from_mapping(doc).routing.peer_ca_file is not None


@pytest.mark.parametrize(("broken", "named"), [
    ("key.pem", "listeners.private.tls (this replica's client certificate to the others): no PEM private key in"),
    ("ca.pem", "listeners.private.client_ca: no PEM certificate in"),
])
def test_the_peer_pools_load_error_names_the_setting_of_the_file_at_fault(tmp_path: Path, broken: str,
                                                                           named: str) -> None:
    """Under mutual TLS the peer pool presents the private port's certificate, checked against
    client_ca: a file that no longer loads when kasd starts (replaced since the configuration was
    read) is named by its own setting."""
    import trustme

    from kasd.replicas import peer_client_ssl

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    server.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    server.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    doc = _replica(tmp_path, private_url="https://127.0.0.1:8155")
    del doc["routing"]["peer_secret_file"]  # type: ignore[attr-defined]
    doc["listeners"]["private"] = {  # type: ignore[index]
        "address": "127.0.0.1:8155", "client_ca": str(tmp_path / "ca.pem"),
        "tls": {"cert": str(tmp_path / "cert.pem"), "key": str(tmp_path / "key.pem")}}
    config = config_from_mapping(doc)
    assert peer_client_ssl(config) is not None
    (tmp_path / broken).write_text("not PEM\n")
    with pytest.raises(ConfigError) as error:
        peer_client_ssl(config)
    assert str(error.value).startswith(named) and str(tmp_path / broken) in str(error.value)


@pytest.mark.parametrize("address", ["127.0.0.1:0", "127.0.0.2:8155", "[::1]:8155", "localhost:8155"])
def test_a_loopback_private_port_needs_no_tls(tmp_path: Path, address: str) -> None:
    doc = _replica(tmp_path)
    doc["listeners"]["private"] = {"address": address}  # type: ignore[index]
    assert not config_from_mapping(doc).private.insecure_plaintext


def test_insecure_plaintext_from_the_environment(tmp_path: Path) -> None:
    from kasd.config import load_config

    doc = _replica(tmp_path)
    doc["listeners"]["private"] = {"address": "0.0.0.0:8155"}  # type: ignore[index]
    doc["routing"]["private_url"] = "http://10.0.0.5:8155"  # type: ignore[index]
    (tmp_path / "kasd.yaml").write_text(yaml.safe_dump(doc))
    argv = ["--config", str(tmp_path / "kasd.yaml")]
    with pytest.raises(ConfigError, match=r"kasd\.yaml: listeners\.private\.tls: missing"):
        load_config(argv, {})
    assert load_config(argv, {"KASD_PRIVATE_INSECURE_PLAINTEXT": "true"}).private.insecure_plaintext
    with pytest.raises(ConfigError, match=r"KASD_PRIVATE_INSECURE_PLAINTEXT: .*must be true or false, got 'yes'"):
        load_config(argv, {"KASD_PRIVATE_INSECURE_PLAINTEXT": "yes"})

def test_a_wildcard_listener_needs_an_explicit_name(tmp_path: Path) -> None:
    doc = _replica(tmp_path)
    doc["listeners"]["kubernetes_api"] = {"address": "0.0.0.0:8154"}  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"routing\.name.*missing.*cannot name this replica"):
        config_from_mapping(doc)


def test_the_command_line_says_it_in_one_line(tmp_path: Path) -> None:
    result = _kasd("--config", _config(tmp_path), *PORT_0, "--redis-url", "redis://:hunter2@127.0.0.1:6379")
    assert result.returncode == 2, result.stderr
    assert "--redis-url" in result.stderr and "must not hold a password" in result.stderr
    assert "hunter2" not in result.stderr and "Traceback" not in result.stderr
