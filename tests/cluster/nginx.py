"""A real nginx (Debian's nginx-light; scripts/test.sh installs it when absent, on CI or when asked with
KASD_TEST_INSTALL=1) in front of kasd replicas, configured from examples/nginx/kasd-front.conf: only the upstream's servers, the
paths and the listen port change, every other line is the example's."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from kasctl.redisproc import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nginx" / "kasd-front.conf"


def find_nginx() -> str | None:
    for candidate in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


NO_NGINX = ("no nginx on this machine: apt-get install nginx-light, or run scripts/test.sh with "
            "KASD_TEST_INSTALL=1 as root (CI installs it and always runs these tests)")

needs_nginx = pytest.mark.skipif(find_nginx() is None and not os.environ.get("CI"), reason=NO_NGINX)
"""For a test that runs nginx: skipped, saying why, where there is none; never skipped on CI (it fails)."""


def nginx_binary() -> str:
    found = find_nginx()
    if found is None:
        raise AssertionError(NO_NGINX)
    return found


def render(servers: list[tuple[str, int]], *, workdir: Path, cert: Path, key: Path, ca: Path, port: int) -> str:
    """The example with these upstream servers (name, weight), files and port."""
    text = EXAMPLE.read_text()
    lines = [f"        server {name} weight={weight} max_fails=1 fail_timeout=2s;" for name, weight in servers]
    text, n = re.subn(r"(?m)^ *server 10\.0\.0\.\d+:8154 [^\n]*\n(?: *server 10\.0\.0\.\d+:8154 [^\n]*\n)*",
                      "\n".join(lines) + "\n", text)
    assert n == 1, "the example's upstream block changed shape"
    for old, new in (("/etc/kasd-front/tls.crt", str(cert)), ("/etc/kasd-front/tls.key", str(key)),
                     ("/etc/kasd-front/kasd-ca.pem", str(ca)), ("/var/log/nginx/kasd.log", str(workdir / "access.log")),
                     ("listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;")):
        assert old in text, old
        text = text.replace(old, new)
    temp = workdir / "tmp"
    temp.mkdir(exist_ok=True)
    head = [
        "daemon off;",
        f"pid {workdir / 'nginx.pid'};",
        f"error_log {workdir / 'error.log'} info;",
        *(["user root root;"] if os.geteuid() == 0 else []),
    ]
    text = text.replace("http {\n", "http {\n" + "".join(
        f"    {d}_temp_path {temp / d};\n" for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")), 1)
    return "\n".join(head) + "\n" + text


class Nginx:
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, servers: list[tuple[str, int]], *, cert: Path, key: Path, ca: Path, timeout: float = 10.0) -> None:
        conf = self.dir / "nginx.conf"
        conf.write_text(render(servers, workdir=self.dir, cert=cert, key=key, ca=ca, port=self.port))
        binary = nginx_binary()
        check = subprocess.run([binary, "-t", "-c", str(conf), "-p", str(self.dir)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        with open(self.dir / "stderr.log", "wb") as stderr:
            self.proc = subprocess.Popen([binary, "-c", str(conf), "-p", str(self.dir)],
                                         stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                assert self.proc.poll() is None, (self.dir / "error.log").read_text()
                time.sleep(0.05)
        raise AssertionError(f"nginx did not listen within {timeout}s")

    def access_lines(self) -> list[str]:
        path = self.dir / "access.log"
        return path.read_text().splitlines() if path.exists() else []

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
