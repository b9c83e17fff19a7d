"""Parts of the stack die and come back; the user-visible answers say what happened."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kasctl.stack import Stack
from tests.e2e.conftest import KUBECTLS, LineReader, kubectl, start_stack

KUBECTL = KUBECTLS[-1][1]


def _ok(stack: Stack, *args: str) -> str:
    # No retry loop: a request waits (event-driven, up to the stack's agent_wait_timeout) inside
    # kasd for its agent to connect, so a reconnect in progress is simply waited for.
    result = kubectl(KUBECTL, stack, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def quick_stack(tmp_path: Path) -> Iterator[Stack]:
    """A stack of its own whose kasd waits 2 s (not own_stack's 15 s) for an agent that is not
    connected: the request made while agentd is dead waits that long before it fails, and nothing
    here waits on a reconnect backoff (start_agentd returns once the new agentd's tunnel is up)."""
    running = start_stack(tmp_path / "stack", agent_wait_timeout=2.0)
    try:
        yield running
    finally:
        running.stop()


def test_agentd_killed_and_restarted(quick_stack: Stack) -> None:
    assert "default" in _ok(quick_stack, "get", "namespaces")
    assert quick_stack.agentd is not None
    quick_stack.agentd.kill()  # SIGKILL: no goodbye to kasd
    result = kubectl(KUBECTL, quick_stack, "get", "namespaces")
    assert result.returncode != 0
    assert "not connected" in result.stderr or "unreachable" in result.stderr or "ServiceUnavailable" in result.stderr
    quick_stack.start_agentd()
    assert "default" in _ok(quick_stack, "get", "namespaces")


def test_kasd_restarted_agentd_reconnects_by_itself(own_stack: Stack) -> None:
    _ok(own_stack, "get", "namespaces")
    assert own_stack.kasd is not None
    assert own_stack.kasd.stop() == 0
    own_stack.start_kasd()  # same ports
    assert "default" in _ok(own_stack, "get", "namespaces")
    assert own_stack.agentd is not None and own_stack.agentd.running


def test_cluster_unreachable_from_the_agent_is_502(own_stack: Stack) -> None:
    _ok(own_stack, "get", "namespaces")
    assert own_stack.kubesim is not None
    own_stack.kubesim.stop()
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(cadata=own_stack.ca.cert_pem.bytes().decode())
    host, port = own_stack.addresses["kubernetes_api"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as raw, ctx.wrap_socket(raw, server_hostname=host) as tls:
        tls.sendall(
            f"GET /api/v1/namespaces HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {own_stack.ci_token}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        reply = b""
        while chunk := tls.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 502 ")
    status = json.loads(body)
    assert status["reason"] == "BadGateway" or status["code"] == 502
    assert "unreachable" in status["message"] and "agent 1" in status["message"]


@contextmanager
def _configmap_watch(stack: Stack, first: str) -> Iterator[LineReader]:
    """`kubectl get configmaps -w`, once it has shown a ConfigMap named ``first`` made for it."""
    watch = LineReader([KUBECTL, "--kubeconfig", str(stack.kubeconfig), "get", "configmaps", "-w"])
    try:
        _ok(stack, "create", "configmap", first)
        watch.wait_for(first)
        yield watch
    finally:
        watch.stop()


def test_agentd_replaced_under_an_open_watch(own_stack: Stack) -> None:
    # A rolling update of agentd under `kubectl get -w`. The old agentd ends the watch between two
    # events at once, instead of holding its drain for the whole grace and then resetting it (a
    # stream error in kubectl). kubectl then either ends quietly or watches again; kasd holds such a
    # request until the new agentd is there. Either way the user sees no error.
    with _configmap_watch(own_stack, "before-the-update") as watch:
        assert own_stack.agentd is not None
        assert own_stack.agentd.stop(timeout=5.0) == 0  # by itself, well inside its 10 s grace
        own_stack.start_agentd()
        _ok(own_stack, "create", "configmap", "after-the-update")
        try:
            watch.wait_for("after-the-update")  # it watched again, through the new agentd
        except AssertionError:
            if watch.proc.poll() is None:
                raise
            assert watch.proc.stderr is not None  # it ended quietly
            assert (watch.proc.returncode, watch.proc.stderr.read()) == (0, "")


def test_stopping_kasd_ends_an_open_watch_without_a_stream_error(own_stack: Stack) -> None:
    with _configmap_watch(own_stack, "before-kasd-stops") as watch:
        assert own_stack.kasd is not None
        assert own_stack.kasd.stop(timeout=5.0) == 0  # by itself, well inside its 20 s drain
        watch.proc.wait(timeout=30)
        assert watch.proc.stderr is not None
        said = watch.proc.stderr.read() + "\n".join(watch.seen)
        assert "stream error" not in said and "InternalError" not in said, said
