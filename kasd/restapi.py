"""kasd's REST API port (8153, ``listeners.api``): GitLab's ``GET /api/v4/job/allowed_agents``, which
a CI job (``Job-Token`` header) asks to learn which agents it may use — what ``kasctl kubeconfig
--job-token`` turns into a kubeconfig. An ASGI app served by hypercorn on kasd's own listeners.

The fence around hypercorn's internals (checked against hypercorn 0.18; the test
``tests/kasd/test_restapi.py::test_the_hypercorn_internals_kasd_relies_on`` names each):

1. ``hypercorn.trio.tcp_server.TCPServer(app, config, context, state, stream)`` serves one accepted
   stream when awaited: a TLS stream (it has ``do_handshake``) or a plain one with a ``socket``.
2. ``hypercorn.trio.worker_context.WorkerContext(max_requests)`` and
   ``hypercorn.typing.ConnectionState`` are what ``hypercorn.trio.run.worker_serve`` gives it.
3. ``hypercorn.utils.wrap_app(app, wsgi_max_body_size, mode)`` makes the ``AppWrapper`` it takes.

Why not ``hypercorn.trio.serve``: it binds and accepts by itself, and every public port of kasd
counts its connections at accept, before TLS or any parsing (``netio.admission``), as the others do.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app

from kasd.authz.jobinfo import ALLOWED_AGENTS_PATH, allowed_agents_response
from kasd.authz.snapshot import Denied, Snapshot

log = logging.getLogger("kasd.api")

#: largest request head hypercorn accepts on this port
MAX_HEAD_BYTES = 16 * 1024
#: seconds a connection may go without sending a byte (mid-request or idle) before it is closed
READ_TIMEOUT = 30
#: seconds an idle keep-alive connection is kept (hypercorn closes a timed-out reader only then too)
KEEP_ALIVE_TIMEOUT = 30

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class RestApi:
    """The ASGI app. ``snapshot()`` is the authorization in force now (reloads included)."""

    def __init__(self, snapshot: Callable[[], Snapshot], clock: Callable[[], float] = time.time) -> None:
        self._snapshot = snapshot
        self._clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # (no lifespan: served without hypercorn's worker)
            return
        status, body = self.answer(scope["method"], scope["path"], _header(scope, b"job-token"))
        payload = json.dumps(body, separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": payload})

    def answer(self, method: str, path: str, job_token: str | None) -> tuple[int, dict[str, Any]]:
        """(status, JSON body) for one request, in GitLab's words (``{"message": "401 Unauthorized"}``)."""
        if path != ALLOWED_AGENTS_PATH:
            return 404, {"message": "404 Not Found"}
        if method not in ("GET", "HEAD"):
            return 405, {"message": "405 Method Not Allowed"}
        if not job_token:
            return 401, {"message": "401 Unauthorized: send the CI job token in a Job-Token header"}
        snapshot = self._snapshot()
        try:
            claims, allowed = snapshot.allowed_agents(job_token, now=self._clock())
        except Denied as exc:
            return 401, {"message": f"401 Unauthorized: {exc.message}"}
        return 200, allowed_agents_response(snapshot, claims, allowed)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value).decode("latin-1").strip()
    return None


def hypercorn_config() -> HypercornConfig:
    config = HypercornConfig()
    config.h11_max_incomplete_size = MAX_HEAD_BYTES
    config.keep_alive_timeout = KEEP_ALIVE_TIMEOUT
    config.ssl_handshake_timeout = 10
    # A client that stops sending (a slowloris) is cut off: nothing this API answers takes long.
    config.read_timeout = READ_TIMEOUT
    config.include_server_header = False
    config.accesslog = None
    config.errorlog = logging.getLogger("kasd.api.server")
    return config


async def serve_api(app: RestApi, listeners: Sequence[trio.abc.Listener[trio.abc.Stream]], *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on ``listeners`` (already capped, TLS already wrapped) until cancelled."""
    config = hypercorn_config()
    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]
    context = WorkerContext(None)
    handler = partial(TCPServer, wrapped, config, context, ConnectionState({}))
    await trio.serve_listeners(handler, list(listeners), task_status=task_status)  # type: ignore[arg-type]


__all__ = ["ALLOWED_AGENTS_PATH", "RestApi", "serve_api"]
