"""kasctl proxy: a local plain-HTTP port that adds the token, for kubectl (with exec through an
upgrade), curl-like clients and browsers; loopback only unless told."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kasctl.errors import CommandError
from kasctl.proxy import _listen_address
from kasctl.stack import Stack, find_kubectl
from tests.e2e.conftest import LineReader

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def proxy(stack: Stack, tmp_path: Path) -> Iterator[str]:
    token = tmp_path / "token"
    token.write_text(stack.ci_token + "\n")
    reader = LineReader([sys.executable, "-m", "kasctl", "proxy", "--token-file", str(token),
                         "--server", stack.proxy_url, "--certificate-authority", str(stack.ca_file),
                         "--listen", "127.0.0.1:0"])
    try:
        line = reader.wait_for("Starting to serve on", timeout=30)
        yield "http://" + line.split("Starting to serve on ", 1)[1].split()[0]
    finally:
        reader.stop()


def test_kubectl_and_a_plain_client_go_through_with_the_token_added(stack: Stack, proxy: str) -> None:
    kubectl = find_kubectl()
    assert kubectl is not None
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kubectl, "--server", proxy, *args], input=stdin, capture_output=True, text=True,
                              timeout=60, env=env)

    created = run("run", "through-proxy", "--image=busybox", "--", "sleep", "3600")  # a POST with a body
    assert created.returncode == 0, created.stderr
    assert run("wait", "--for=condition=Ready", "pod/through-proxy", "--timeout=30s").returncode == 0
    with urllib.request.urlopen(f"{proxy}/api/v1/namespaces/default/pods/through-proxy", timeout=30) as response:
        assert json.loads(response.read())["metadata"]["name"] == "through-proxy"
    shell = run("exec", "-i", "through-proxy", "--", "sh", stdin="echo through\nexit 4\n")  # an upgrade
    assert shell.returncode == 4 and shell.stdout.strip() == "through", shell.stderr
    # the client's own Authorization is replaced, never passed on
    request = urllib.request.Request(f"{proxy}/api", headers={"Authorization": "Bearer ci:1:nonsense"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    assert run("delete", "pod/through-proxy", "--wait=false").returncode == 0


def test_a_page_under_another_host_or_origin_is_refused(stack: Stack, proxy: str) -> None:
    # DNS rebinding: the browser talks to 127.0.0.1:PORT under the attacker's name
    port = int(proxy.rsplit(":", 1)[1])

    def get(host: str, origin: str | None = None, body: bytes | None = None) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            headers = {"Host": host, **({"Origin": origin} if origin else {})}
            connection.request("POST" if body else "GET", "/api/v1/namespaces/default/secrets", body=body,
                               headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    status, body = get(f"attacker.example:{port}", f"http://attacker.example:{port}")
    assert status == 403 and b"Host 'attacker.example' is not accepted" in body
    status, body = get(f"attacker.example:{port}", body=b'{"kind": "Secret"}' + b" " * 200_000)
    assert status == 403  # a POST with a body the proxy never wanted: answered all the same
    status, body = get(f"localhost:{port}", "http://attacker.example")
    assert status == 403 and b"Origin 'http://attacker.example' is not this proxy" in body
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
        status, body = get(host, f"http://{host}")
        assert status == 200 and json.loads(body)["kind"] == "SecretList"


def test_it_listens_on_loopback_unless_told(stack: Stack, tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "KASCTL_TOKEN": stack.ci_token}
    args = [sys.executable, "-m", "kasctl", "proxy", "--server", stack.proxy_url, "--listen", "0.0.0.0:0"]
    refused = subprocess.run(args, capture_output=True, text=True, timeout=30, env=env)
    assert refused.returncode == 2 and "not a loopback address" in refused.stderr and "--allow-remote" in refused.stderr
    no_token = subprocess.run(args[:-2], capture_output=True, text=True, timeout=30, env={"PATH": os.environ["PATH"]})
    assert no_token.returncode == 2 and "no token" in no_token.stderr
    bad = subprocess.run([*args[:-2], "--token", "glpat-abc"], capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ["PATH"]})
    assert bad.returncode == 2 and "whole bearer token" in bad.stderr and "glpat-abc" not in bad.stderr
    regexp = subprocess.run([*args[:-2], "--accept-hosts", "^(", "--listen", "127.0.0.1:0"], capture_output=True,
                            text=True, timeout=30, env=env)
    assert regexp.returncode == 2 and "--accept-hosts: '^(' is not a regular expression" in regexp.stderr


@pytest.mark.parametrize("port", ["\u00b2", "8_001", " 8001", "8" * 5000, "65536"])
def test_a_listen_port_int_would_misread_is_refused(port: str) -> None:
    with pytest.raises(CommandError, match="--listen must be HOST:PORT"):
        _listen_address(f"127.0.0.1:{port}", allow_remote=False)
