"""Receptive agents' settings as an operator meets them, on both sides: kasd's ``agents[].receptive``
and agentd's ``--receptive-*`` flags; each mistake names the key and the problem, never a key's bytes."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from agentd.config import ConfigError as AgentdConfigError
from agentd.config import load_config as load_agentd_config
from kasd.config import ConfigError, config_from_mapping
from kasd.tokens import hash_token

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "tls.pem"))
    key = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "jwt.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    (tmp_path / "jwt.pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    # GitLab's form: base64 of the raw 32 bytes
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    (tmp_path / "jwt.pub.b64").write_text(base64.b64encode(raw).decode() + "\n")
    (tmp_path / "token").write_text("agent-token\n")
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\n")
    (tmp_path / "not-a-key").write_text("hunter2 hunter2\n")
    # a client key under a passphrase: refused by name, never prompted for on a terminal
    client = ca.issue_cert("kasd")
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    client_key = serialization.load_pem_private_key(client.private_key_pem.bytes(), password=None)
    (tmp_path / "client-encrypted.key").write_bytes(client_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"hunter2")))
    return tmp_path


def _kasd(receptive: dict[str, Any]) -> Any:
    return config_from_mapping({"agents": [{"id": 1, "name": "a", "config_project": "group/a",
                                            "token_sha256": hash_token("t"), "receptive": receptive}],
                                "projects": [{"path": "group/a", "id": 1}], "groups": [{"path": "group", "id": 1}]})


def test_kasd_loads_a_receptive_agent_either_way(files: Path) -> None:
    jwt = _kasd({"url": "grpcs://10.0.0.7:8082", "ca_cert_file": str(files / "ca.pem"),
                 "private_key_file": str(files / "jwt.key")}).agents[0].receptive
    assert jwt.auth == "jwt" and (jwt.host, jwt.port) == ("10.0.0.7", 8082)
    mtls = _kasd({"url": "https://agent.example:8082", "tls_host": "agentd.internal",
                  "client_cert_file": str(files / "tls.pem"), "client_key_file": str(files / "tls.pem")})
    assert mtls.agents[0].receptive.auth == "mtls"


@pytest.mark.parametrize(("receptive", "words"), [
    ({"url": "grpc://10.0.0.7:8082", "private_key_file": "{d}/jwt.key"},
     "agents[0].receptive.url: 'grpc://10.0.0.7:8082' is plaintext"),
    ({"url": "grpcs://10.0.0.7", "private_key_file": "{d}/jwt.key"}, "names no port"),
    ({"url": "grpcs://10.0.0.7:8082"}, "choose one way to authenticate to agentd"),
    ({"url": "grpcs://10.0.0.7:8082", "private_key_file": "{d}/jwt.key", "client_cert_file": "{d}/tls.pem",
      "client_key_file": "{d}/tls.pem"}, "choose one way to authenticate to agentd"),
    ({"url": "grpcs://10.0.0.7:8082", "client_cert_file": "{d}/tls.pem"}, "needs both client_cert_file and client_key_file"),
    ({"url": "grpcs://10.0.0.7:8082", "private_key_file": "{d}/not-a-key"}, "neither PEM nor the base64"),
    ({"url": "grpcs://10.0.0.7:8082", "private_key_file": "{d}/jwt.pub"}, "must hold an Ed25519 private key"),
    ({"url": "grpcs://10.0.0.7:8082", "private_key_file": "{d}/jwt.key", "ca_cert_file": "{d}/token"},
     "holds no PEM certificate"),
    ({"url": "grpcs://10.0.0.7:8082", "private_key_file": "{d}/jwt.key", "tls": {}}, "unknown"),
    ({"url": "grpcs://10.0.0.7:8082", "client_cert_file": "{d}/client.pem",
      "client_key_file": "{d}/client-encrypted.key"}, "the key is encrypted (kasd needs it without a passphrase)"),
])
def test_kasd_names_what_is_wrong(files: Path, receptive: dict[str, Any], words: str) -> None:
    filled = {k: v.format(d=files) if isinstance(v, str) else v for k, v in receptive.items()}
    with pytest.raises(ConfigError) as error:
        _kasd(filled)
    assert words in str(error.value)
    assert "agents[0].receptive" in str(error.value)
    assert "hunter2" not in str(error.value)


def _agentd(files: Path, *flags: str) -> Any:
    return load_agentd_config(["--token-file", str(files / "token"), "--kubeconfig", str(files / "kubeconfig"),
                               *flags], {})


def test_agentd_in_receptive_mode_needs_no_kasd_address(files: Path) -> None:
    tls = ["--receptive-listen-address", "0.0.0.0:8082", "--receptive-cert-file", str(files / "tls.pem"),
           "--receptive-key-file", str(files / "tls.pem")]
    for auth in (["--receptive-jwt-file", str(files / "jwt.pub"), "--agent-id", "42"],
                 ["--receptive-jwt-file", str(files / "jwt.pub.b64"), "--agent-id", "42"],
                 ["--receptive-ca-cert-file", str(files / "ca.pem"), "--receptive-client-name", "kasd.internal"]):
        config = _agentd(files, *tls, *auth)
        assert config.kas_addresses == () and config.receptive_listen_address.port == 8082
    with pytest.raises(AgentdConfigError, match="no kasd address"):
        _agentd(files)  # neither dialling nor receptive


@pytest.mark.parametrize(("extra", "words"), [
    ([], "receptive_cert_file is needed with --receptive-listen-address"),
    (["--receptive-cert-file", "{d}/tls.pem", "--receptive-key-file", "{d}/tls.pem"],
     "set either receptive_jwt_file (JWT) or receptive_ca_cert_file (mutual TLS)"),
    (["--receptive-cert-file", "{d}/tls.pem", "--receptive-key-file", "{d}/tls.pem",
      "--receptive-jwt-file", "{d}/jwt.pub", "--receptive-ca-cert-file", "{d}/ca.pem"], "set either"),
    (["--receptive-cert-file", "{d}/tls.pem", "--receptive-key-file", "{d}/tls.pem",
      "--receptive-jwt-file", "{d}/jwt.pub"], "agent_id is needed with --receptive-jwt-file"),
    (["--receptive-cert-file", "{d}/tls.pem", "--receptive-key-file", "{d}/tls.pem",
      "--receptive-ca-cert-file", "{d}/ca.pem"], "receptive_client_name is needed with --receptive-ca-cert-file"),
    (["--receptive-cert-file", "{d}/tls.pem", "--receptive-key-file", "{d}/tls.pem",
      "--receptive-jwt-file", "{d}/not-a-key", "--agent-id", "42"], "neither PEM nor the base64 of 32 bytes"),
    (["--receptive-cert-file", "{d}/tls.pem", "--receptive-key-file", "{d}/tls.pem",
      "--receptive-jwt-file", "{d}/jwt.key", "--agent-id", "42"], "must hold an Ed25519 public key only"),
    (["--receptive-cert-file", "{d}/token", "--receptive-key-file", "{d}/tls.pem",
      "--receptive-jwt-file", "{d}/jwt.pub", "--agent-id", "42"], "--receptive-cert-file / --receptive-key-file: no PEM certificate in"),
])
def test_agentd_names_what_is_wrong(files: Path, extra: list[str], words: str) -> None:
    with pytest.raises(AgentdConfigError) as error:
        _agentd(files, "--receptive-listen-address", "0.0.0.0:8082", *(a.format(d=files) for a in extra))
    assert words in str(error.value)
    assert "hunter2" not in str(error.value)
