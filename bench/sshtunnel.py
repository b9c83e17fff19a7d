"""An OpenSSH ``ssh -R`` reverse tunnel on loopback, with a throwaway sshd and keys (for baselines).

``ReverseTunnel.start(target_port)`` returns None, with a reason, when sshd or ssh is not installed.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listened on 127.0.0.1:{port} within {timeout}s")


class ReverseTunnel:
    """sshd on 127.0.0.1 plus ``ssh -N -R listen_port:127.0.0.1:target_port`` into it."""

    def __init__(self, workdir: Path, sshd: subprocess.Popen[bytes], ssh: subprocess.Popen[bytes], port: int) -> None:
        self.workdir = workdir
        self._sshd = sshd
        self._ssh = ssh
        #: connect here to reach the target through the reverse tunnel
        self.port = port

    @staticmethod
    def unavailable_reason() -> str | None:
        sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
        if not sshd:
            return "sshd is not installed (Debian: apt-get install openssh-server)"
        if not shutil.which("ssh") or not shutil.which("ssh-keygen"):
            return "ssh/ssh-keygen are not installed (Debian: apt-get install openssh-client)"
        return None

    @classmethod
    def start(cls, target_port: int) -> ReverseTunnel:
        reason = cls.unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        sshd_bin = shutil.which("sshd") or "/usr/sbin/sshd"
        work = Path(tempfile.mkdtemp(prefix="bench-ssh-"))
        for name in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / name)], check=True
            )
        (work / "authorized_keys").write_text((work / "client_key.pub").read_text())
        os.chmod(work / "authorized_keys", 0o600)
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege-separation directory sshd insists on
        sshd_port = _free_port()
        config = work / "sshd_config"
        config.write_text(
            f"Port {sshd_port}\nListenAddress 127.0.0.1\nHostKey {work / 'host_key'}\n"
            f"AuthorizedKeysFile {work / 'authorized_keys'}\nPidFile {work / 'sshd.pid'}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "PermitRootLogin prohibit-password\nAllowTcpForwarding yes\nGatewayPorts no\n"
        )
        sshd = subprocess.Popen([sshd_bin, "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL)
        _wait_listening(sshd_port, 10, sshd)
        port = _free_port()
        ssh = subprocess.Popen(
            [
                "ssh", "-N", "-i", str(work / "client_key"), "-p", str(sshd_port),
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "ExitOnForwardFailure=yes", "-o", "LogLevel=ERROR",
                "-R", f"127.0.0.1:{port}:127.0.0.1:{target_port}",
                f"{getpass.getuser()}@127.0.0.1",
            ],
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _wait_listening(port, 10, ssh)
        except BaseException:
            ssh.terminate()
            sshd.terminate()
            raise
        return cls(work, sshd, ssh, port)

    def close(self) -> None:
        for proc in (self._ssh, self._sshd):
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)
