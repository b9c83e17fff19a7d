"""A real nginx in front of three replicas, configured from examples/nginx/kasd-front.conf.

1. nginx's `hash $kasd_agent consistent` and kasd's ring name the same home for the agent, so with
   agentd's tunnel on that home every request lands there: zero kasd-to-kasd hops.
2. A rolling restart of all three replicas (SIGTERM, start again, next) while 8 clients loop
   `kubectl get` and one `kubectl get -w` stays open: not one request fails, the watch goes on.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kasctl.stack import Stack
from tests.cluster.conftest import (
    KUBECTLS,
    WEIGHT,
    LineReader,
    member_names,
    metric,
    replicated_stack,
    wait_for_home,
)
from tests.cluster.nginx import Nginx, needs_nginx

pytestmark = needs_nginx

KUBECTL = KUBECTLS[-1][1]


def _front(stack: Stack, workdir: Path) -> Nginx:
    nginx = Nginx(workdir)
    nginx.start([(name, WEIGHT) for name in member_names(stack)], cert=stack.dir / "kasd-cert.pem",
                key=stack.dir / "kasd-key.pem", ca=_ca_file(stack))
    return nginx


def _ca_file(stack: Stack) -> Path:
    path = stack.dir / "ca.pem"
    stack.ca.cert_pem.write_to_path(str(path))
    return path


def _front_kubeconfig(stack: Stack, nginx: Nginx) -> Path:
    """The stack's kubeconfig with its default cluster pointed at nginx."""
    config = yaml.safe_load(stack.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{nginx.port}"
    path = stack.dir / "front.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@pytest.fixture
def homed(tmp_path: Path) -> Iterator[tuple[Stack, Nginx]]:
    """agentd knows every replica but keeps one tunnel: kasd's placement puts it on the agent's
    home replica. nginx in front."""
    stack = replicated_stack(tmp_path / "stack", agentd_connections=1)
    try:
        nginx = _front(stack, tmp_path / "nginx")
        try:
            yield stack, nginx
        finally:
            nginx.stop()
    finally:
        stack.stop()


def test_nginx_and_kasd_agree_on_the_home_so_requests_take_no_hop(homed: tuple[Stack, Nginx]) -> None:
    stack, nginx = homed
    home = wait_for_home(stack)  # the placement NOTICE moved agentd's one tunnel there
    kubeconfig = _front_kubeconfig(stack, nginx)
    for _ in range(20):
        result = subprocess.run([KUBECTL, "--kubeconfig", str(kubeconfig), "get", "configmaps", "-A"],
                                capture_output=True, text=True, timeout=20)
        assert result.returncode == 0, result.stderr
    # nginx sent every request to the home replica ...
    upstreams = {line.split("upstream=")[1].split()[0] for line in nginx.access_lines() if "agent=1 " in line}
    assert upstreams == {member_names(stack)[home]}, upstreams
    # ... and no replica forwarded one: zero extra hops.
    for replica in range(3):
        assert metric(stack, replica, 'kasd_forwarded_requests_total{direction="out"}') == 0


@pytest.fixture
def fronted(tmp_path: Path) -> Iterator[tuple[Stack, Nginx]]:
    """Three replicas, two agentd each with a tunnel to every replica, nginx in front."""
    stack = replicated_stack(tmp_path / "stack", agentd_replicas=2, agent_wait_timeout=10.0)
    try:
        nginx = _front(stack, tmp_path / "nginx")
        try:
            yield stack, nginx
        finally:
            nginx.stop()
    finally:
        stack.stop()


def test_a_rolling_restart_fails_no_request_and_the_watch_goes_on(fronted: tuple[Stack, Nginx]) -> None:
    stack, nginx = fronted
    kubeconfig = _front_kubeconfig(stack, nginx)
    base = [KUBECTL, "--kubeconfig", str(kubeconfig)]
    assert subprocess.run([*base, "create", "configmap", "before-the-restart"], capture_output=True).returncode == 0
    stop = threading.Event()
    failures: list[str] = []
    counts = [0] * 8

    def client(index: int) -> None:
        while not stop.is_set():
            result = subprocess.run([*base, "get", "configmaps", "-o", "name"], capture_output=True, text=True,
                                    timeout=30)
            if result.returncode != 0:
                failures.append(result.stderr)
            counts[index] += 1

    watch = LineReader([*base, "get", "configmaps", "-w", "--output-watch-events"])
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(8)]
    try:
        watch.wait_for("before-the-restart")
        for thread in threads:
            thread.start()
        for replica in range(3):
            process = stack.kasds[replica]
            assert process is not None
            assert process.stop() == 0  # drained by itself, well inside its grace
            stack.start_kasd(replica=replica)  # the same ports
            # each replica serves again before the next one goes (as a rollout's readiness gate would)
            before = sum(counts)
            deadline = time.monotonic() + 20
            while sum(counts) < before + 8 and time.monotonic() < deadline:
                time.sleep(0.05)
        created = subprocess.run([*base, "create", "configmap", "after-the-restart"], capture_output=True, text=True)
        assert created.returncode == 0, created.stderr
        # The watch ended quietly at an event boundary when its replica drained, or went on:
        # either way it saw no error, and a watch opened again sees the new object.
        try:
            watch.wait_for("after-the-restart")
        except AssertionError:
            assert watch.proc.poll() is not None and watch.proc.returncode == 0, watch.seen
            assert watch.proc.stderr is not None and watch.proc.stderr.read() == ""
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=40)
        watch.stop()
    assert sum(counts) >= 24
    assert failures == [], (failures[:3], _what_went_wrong(stack, nginx))


def _what_went_wrong(stack: Stack, nginx: Nginx) -> list[str]:
    """The lines that say why a request failed: nginx's errors other than the refused connections
    of a stopped replica (which it retries), the daemons' warnings, and answers that did not end well."""
    lines = [line for line in (nginx.dir / "error.log").read_text().splitlines()
             if ("[error]" in line or "[crit]" in line) and "Connection refused" not in line]
    for log in sorted(stack.dir.glob("*.log")):
        lines += [f"{log.name}: {line}" for line in log.read_text(errors="replace").splitlines()
                  if "level=WARNING" in line or "level=ERROR" in line
                  or ("kasd.access" in line and "outcome=ok" not in line and "outcome=drained" not in line)]
    return lines[-60:]
