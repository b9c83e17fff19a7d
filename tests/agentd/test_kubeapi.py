"""Reaching the API server: in-cluster files and kubeconfigs (real TLS material from trustme)."""

from __future__ import annotations

import base64
import json
import ssl
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from agentd.kubeapi import KubeConfigError, TokenSource, in_cluster_target, kubeconfig_target
from agentd.upstream import UpstreamPool
from kubesim.server import open_kubesim
from tunnelhttp.head import Impersonation, RequestHead

pytestmark = pytest.mark.timeout(20)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def serviceaccount(tmp_path: Path, ca: trustme.CA) -> Path:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("sa-token-1\n")
    ca.cert_pem.write_to_path(str(sa / "ca.crt"))
    (sa / "namespace").write_text("gitlab-agent\n")
    return sa


def test_in_cluster(tmp_path: Path, ca: trustme.CA) -> None:
    sa = serviceaccount(tmp_path, ca)
    target = in_cluster_target(sa, {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"})
    assert (target.scheme, target.host, target.port) == ("https", "10.0.0.1", 6443)
    assert target.url == "https://10.0.0.1:6443"
    assert target.authorization() == "Bearer sa-token-1"
    assert target.namespace == "gitlab-agent"
    assert target.ssl_context is not None and target.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert "sa-token-1" not in repr(target)


def test_in_cluster_ipv6_and_default_port(tmp_path: Path, ca: trustme.CA) -> None:
    sa = serviceaccount(tmp_path, ca)
    target = in_cluster_target(sa, {"KUBERNETES_SERVICE_HOST": "fd00::1"})
    assert target.url == "https://[fd00::1]:443"
    assert target.host_header == "[fd00::1]"


@pytest.mark.parametrize(
    ("environ", "remove", "message"),
    [
        ({}, None, "KUBERNETES_SERVICE_HOST is not set"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "x"}, None, "not a port"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "\u00b2"}, None, "not a port"),
        ({"KUBERNETES_SERVICE_HOST": "h"}, "ca.crt", "no CA certificate"),
        ({"KUBERNETES_SERVICE_HOST": "h"}, "token", "no service account token"),
    ],
)
def test_in_cluster_errors(tmp_path: Path, ca: trustme.CA, environ: dict[str, str], remove: str | None,
                           message: str) -> None:
    sa = serviceaccount(tmp_path, ca)
    if remove:
        (sa / remove).unlink()
    with pytest.raises(KubeConfigError, match=message):
        in_cluster_target(sa, environ)


def test_token_file_is_reread_after_refresh(tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "token"
    path.write_text("one")
    source = TokenSource(path=path, refresh=60, clock=lambda: now[0])
    path.write_text("two")
    now[0] = 59
    assert source.get() == "one"
    now[0] = 60
    assert source.get() == "two"
    path.unlink()  # a failed re-read keeps the last good token
    now[0] = 200
    assert source.get() == "two"


def kubeconfig(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], *, name: str = "kc") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "main",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "main", "context": {"cluster": "c", "user": "u", "namespace": "ns1"}},
                     {"name": "other", "context": {"cluster": "c", "user": "missing"}}],
    }))
    return path


def test_kubeconfig_ca_data_and_token(tmp_path: Path, ca: trustme.CA) -> None:
    path = kubeconfig(tmp_path, {"server": "https://api.example:6443/prefix/",
                                 "certificate-authority-data": base64.b64encode(ca.cert_pem.bytes()).decode()},
                      {"token": "abc"})
    target = kubeconfig_target(path)
    assert (target.scheme, target.host, target.port, target.path_prefix) == ("https", "api.example", 6443, "/prefix")
    assert target.authorization() == "Bearer abc"
    assert target.namespace == "ns1"
    assert target.ssl_context is not None and target.ssl_context.verify_mode == ssl.CERT_REQUIRED


def test_kubeconfig_relative_files(tmp_path: Path, ca: trustme.CA) -> None:
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    (tmp_path / "tok").write_text("from-file\n")
    path = kubeconfig(tmp_path, {"server": "https://h", "certificate-authority": "ca.pem"}, {"tokenFile": "tok"})
    target = kubeconfig_target(path)
    assert target.port == 443
    assert target.authorization() == "Bearer from-file"


def test_kubeconfig_client_certificate(tmp_path: Path, ca: trustme.CA) -> None:
    client = ca.issue_cert("agentd@example")
    user = {"client-certificate-data": base64.b64encode(client.cert_chain_pems[0].bytes()).decode(),
            "client-key-data": base64.b64encode(client.private_key_pem.bytes()).decode()}
    target = kubeconfig_target(kubeconfig(tmp_path, {"server": "https://h", "insecure-skip-tls-verify": True}, user))
    assert target.client_certificate
    assert target.authorization() is None
    assert target.ssl_context is not None and target.ssl_context.verify_mode == ssl.CERT_NONE
    client.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    target = kubeconfig_target(kubeconfig(tmp_path, {"server": "https://h"},
                                          {"client-certificate": "cert.pem", "client-key": "key.pem"}))
    assert target.client_certificate


@pytest.mark.parametrize(
    ("cluster", "user", "context", "message"),
    [
        ({"server": "https://h"}, {"exec": {"command": "aws"}}, None, "exec credential plugin.*not support"),
        ({"server": "https://h"}, {"auth-provider": {"name": "gcp"}}, None, "auth-provider"),
        ({"server": "https://h"}, {"username": "a", "password": "b"}, None, "basic auth"),
        ({"server": "ftp://h"}, {}, None, "server must be an http"),
        ({}, {}, None, "has no server URL"),
        ({"server": "https://h"}, {}, "nope", "no context named 'nope'"),
        ({"server": "https://h"}, {}, "other", "no user named 'missing'"),
        ({"server": "https://h", "certificate-authority": "missing.pem"}, {}, None, "cannot load the cluster CA"),
        ({"server": "https://h"}, {"client-certificate": "c.pem"}, None, "client certificate"),
    ],
)
def test_kubeconfig_errors(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], context: str | None,
                           message: str) -> None:
    with pytest.raises(KubeConfigError, match=message):
        kubeconfig_target(kubeconfig(tmp_path, cluster, user), context=context)


@pytest.mark.parametrize("server", ["https://admin:s3cr3t-pw@h:99999", "ftp://admin:s3cr3t-pw@h", "https://admin:s3cr3t-pw@h",
                                    "http://admin:s3cr3t-pw@h"])
def test_a_kubeconfig_error_never_quotes_the_servers_user_information(tmp_path: Path, server: str) -> None:
    """agentd logs its configuration errors; a server URL may carry a password."""
    user = {"client-certificate-data": "eA=="} if server.startswith("http://") else {}
    with pytest.raises(KubeConfigError) as info:
        kubeconfig_target(kubeconfig(tmp_path, {"server": server}, user))
    assert "s3cr3t" not in str(info.value) and "admin" not in str(info.value)
    assert "…@h" in str(info.value)


def test_kubeconfig_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "kc"
    path.write_text("{ not: [yaml")
    with pytest.raises(KubeConfigError, match="not valid YAML"):
        kubeconfig_target(path)


async def test_upstream_over_tls_with_kubeconfig_ca(tmp_path: Path, ca: trustme.CA) -> None:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    async with open_kubesim(token="tls-token", tls=server, ca_pem=ca.cert_pem.bytes()) as sim:
        target = kubeconfig_target(sim.write_kubeconfig(tmp_path / "kubeconfig"))
        pool = UpstreamPool(target)
        head = RequestHead(method="GET", target="/version", headers=(), impersonate=Impersonation(user="bob"))
        async with pool.request(head, None) as response:
            body = b"".join([chunk async for chunk in response])
        assert response.status == 200
        assert "gitVersion" in json.loads(body)
        assert sim.requests[-1].bearer_token == "tls-token"
        assert sim.requests[-1].http_version == "1.1"
        await pool.aclose()


async def test_upstream_tls_untrusted_is_unreachable(tmp_path: Path, ca: trustme.CA) -> None:
    from agentd.upstream import UpstreamUnreachable

    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    other = trustme.CA()
    async with open_kubesim(token="t", tls=server, ca_pem=other.cert_pem.bytes()) as sim:
        pool = UpstreamPool(kubeconfig_target(sim.write_kubeconfig(tmp_path / "kubeconfig")))
        head = RequestHead(method="GET", target="/version", headers=())
        with pytest.raises(UpstreamUnreachable, match=r"cannot reach https://127.0.0.1:.*CERTIFICATE_VERIFY_FAILED"):
            async with pool.request(head, None):
                pass
    await trio.lowlevel.checkpoint()
