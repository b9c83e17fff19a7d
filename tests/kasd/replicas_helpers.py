"""Several in-process kasd runtimes sharing one in-memory membership and directory
(``tests.routing.standins.MemoryWorld``), each with its real private listener on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from kasd.config import Config
from kasd.server import Runtime, serve_kasd
from tests.kasd.helpers import make_config
from tests.routing.standins import MemoryWorld

PEER_SECRET = "s3cret-shared-by-every-replica-0123456789"


def replica_config(tmp: Path, *, private: dict[str, Any] | None = None, routing: dict[str, Any] | None = None,
                   **raw: Any) -> Config:
    secret = tmp / "peer-secret"
    if not secret.exists():
        secret.write_text(PEER_SECRET + "\n")
    doc: dict[str, Any] = {
        "listeners": {
            "agent": {"address": "127.0.0.1:0"},
            "observability": {"address": "127.0.0.1:0"},
            "kubernetes_api": {"address": "127.0.0.1:0"},
            "private": {"address": "127.0.0.1:0", **(private or {})},
        },
        "routing": {"peer_secret_file": str(secret), **(routing or {})},
        **raw,
    }
    return make_config(doc)


@asynccontextmanager
async def running_replicas(world: MemoryWorld, configs: list[Config]) -> AsyncIterator[list[Runtime]]:
    async with trio.open_nursery() as nursery:
        runtimes: list[Runtime] = []
        for config in configs:
            runtimes.append(await nursery.start(lambda task_status, c=config: serve_kasd(
                c, replication=world.join, task_status=task_status)))
        try:
            yield runtimes
        finally:
            for runtime in runtimes:
                runtime.request_shutdown()


def name_of(runtime: Runtime) -> str:
    assert runtime.replication is not None
    return runtime.replication.membership.self_name
