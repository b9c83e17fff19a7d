"""kasd's REST API port (8153, ``listeners.api``): GitLab's ``GET /api/v4/job/allowed_agents``, which
a CI job (``Job-Token`` header) asks to learn which agents it may use — what ``kasctl kubeconfig
--job-token`` turns into a kubeconfig — and ``POST /api/v4/projects/:project/environments/:name/stop``,
which deletes what kasd created for an environment (``kasctl env stop``), and ``PUT
/api/v4/jobs/:id``, with which a job ends itself (``kasctl token revoke``: kasd's store records it
as finished, ``kasd.store``). An ASGI app served by hypercorn on kasd's own listeners.

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
from datetime import UTC, datetime
from functools import partial
from typing import Any
from urllib.parse import quote, unquote

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app

from kasd.authz.jobinfo import ALLOWED_AGENTS_PATH, allowed_agents_response
from kasd.authz.snapshot import Denied, Snapshot
from kasd.k8sproxy.accesslog import logfmt
from kasd.managed import Provisioner, ProvisionError
from kasd.store.protocol import StoreError
from kasd.store.revocation import Revocations

log = logging.getLogger("kasd.api")

#: GitLab's stop call, kasd's form (the environment by name): ``kasctl env stop`` calls it
STOP_PATH = "/api/v4/projects/{project}/environments/{environment}/stop"


def stop_path(project: str, environment: str) -> str:
    """``STOP_PATH`` for a project path (or id) and environment name, each percent-encoded."""
    return STOP_PATH.format(project=quote(project, safe=""), environment=quote(environment, safe=""))

#: GitLab's "update a job" call, which its runner makes when a job ends (``PUT /api/v4/jobs/:id``,
#: authorized by the job's own token): kasd records the job as finished (``kasctl token revoke``)
FINISH_PATH = "/api/v4/jobs/{job_id}"
#: the longest job id in a path (a 64-bit id has 19 digits)
_MAX_ID_DIGITS = 19


def finish_path(job_id: int) -> str:
    return FINISH_PATH.format(job_id=job_id)

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

    def __init__(self, snapshot: Callable[[], Snapshot], provisioner: Provisioner | None = None,
                 clock: Callable[[], float] = time.time, revocations: Revocations | None = None) -> None:
        self._snapshot = snapshot
        self._provisioner = provisioner
        self._clock = clock
        self._revocations = revocations

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # (no lifespan: served without hypercorn's worker)
            return
        job_token = _header(scope, b"job-token")
        stop = _stop_path(bytes(scope.get("raw_path") or scope["path"].encode()))
        finish = _finish_path(scope["path"]) if self._revocations is not None else None
        if stop is not None:
            status, body = await self.stop_environment(scope["method"], *stop, job_token)
        elif finish is not None:
            status, body = await self.finish_job(scope["method"], finish, job_token)
        else:
            status, body = self.answer(scope["method"], scope["path"], job_token)
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

    async def stop_environment(self, method: str, project: str, environment: str,
                               job_token: str | None) -> tuple[int, dict[str, Any]]:
        """``POST /api/v4/projects/:project/environments/:environment/stop`` (GitLab's stop call, with
        the environment's name where GitLab has its id): what kasd created for the environment on
        every agent the job may use is deleted per ``delete_resources``. The job token must be one
        of that project's jobs for that environment: the stop job's own ``CI_JOB_TOKEN``."""
        if method != "POST":
            return 405, {"message": "405 Method Not Allowed"}
        if not job_token:
            return 401, {"message": "401 Unauthorized: send the stop job's CI job token in a Job-Token header"}
        snapshot = self._snapshot()
        try:
            claims, allowed = snapshot.allowed_agents(job_token, now=self._clock())
        except Denied as exc:
            return 401, {"message": f"401 Unauthorized: {exc.message}"}
        known = snapshot.directory.project(claims.project)
        if known is None or project.lower() not in (known.path.lower(), str(known.id)):
            return 403, {"message": f"403 Forbidden: the job token is for project {claims.project}, not {project}"}
        if claims.environment is None:
            return 403, {"message": f"403 Forbidden: the job token has no environment; {environment!r} cannot be "
                                    "stopped with it"}
        if claims.environment != environment:
            return 403, {"message": f"403 Forbidden: the job token is for environment {claims.environment!r}, "
                                    f"not {environment!r}"}
        agents = []
        for verdict in allowed:
            plan = verdict.managed
            if plan is None or self._provisioner is None:
                continue
            try:
                report = await self._provisioner.stop(plan)
            except ProvisionError as exc:
                return 502, {"message": f"502 Bad Gateway: {exc.message}"}
            agents.append({"id": plan.agent_id, "namespace": plan.namespace, "delete_resources": plan.delete_resources,
                           "deleted": list(report.deleted), "kept": list(report.kept), "absent": list(report.absent)})
        log.info("environment stopped project=%s environment=%s job_id=%d agents=%s", logfmt(claims.project),
                 logfmt(environment), claims.job_id, ",".join(str(a["id"]) for a in agents) or "-")
        return 200, {"project": claims.project, "environment": environment, "agents": agents}


    async def finish_job(self, method: str, job_id: int, job_token: str | None) -> tuple[int, dict[str, Any]]:
        """``PUT /api/v4/jobs/:job_id`` with that job's own token: the job is finished, and every
        replica refuses its tokens from now until the last of them has expired (docs/kasd.md,
        "Finished jobs"). What the request's body says (GitLab's runner sends the job's state) is
        not read."""
        if method != "PUT":
            return 405, {"message": "405 Method Not Allowed"}
        if not job_token:
            return 401, {"message": "401 Unauthorized: send the job's own CI job token in a Job-Token header"}
        assert self._revocations is not None  # (the path is not served without)
        snapshot = self._snapshot()
        try:
            claims = snapshot.verify_job(job_token, now=self._clock())
        except Denied as exc:
            return 401, {"message": f"401 Unauthorized: {exc.message}"}
        if claims.job_id != job_id:
            return 403, {"message": f"403 Forbidden: the job token is for job {claims.job_id}, not {job_id}"}
        tokens = snapshot.tokens
        try:
            until = await self._revocations.finish(job_id, max_lifetime=tokens.max_job_lifetime.total_seconds(),
                                                   leeway=tokens.leeway.total_seconds())
        except StoreError as exc:
            log.warning("job not finished: the store failed project=%s job_id=%d error=%s", logfmt(claims.project),
                        job_id, logfmt(str(exc)))
            return 503, {"message": f"503 Service Unavailable: the job could not be recorded as finished: {exc}"}
        refused_until = datetime.fromtimestamp(until, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        log.info("job finished project=%s job_id=%d tokens_refused_until=%s", logfmt(claims.project), job_id,
                 refused_until)
        return 200, {"id": job_id, "project": claims.project, "status": "finished", "tokens_refused_until": refused_until}


def _finish_path(path: str) -> int | None:
    """The job id of ``/api/v4/jobs/<id>`` (ASCII digits, at most 19); None for any other path."""
    prefix = "/api/v4/jobs/"
    if not path.startswith(prefix):
        return None
    digits = path[len(prefix):]
    if not 0 < len(digits) <= _MAX_ID_DIGITS or not digits.isascii() or not digits.isdigit() or int(digits) == 0:
        return None
    return int(digits)


def _stop_path(raw_path: bytes) -> tuple[str, str] | None:
    """(project, environment) of ``/api/v4/projects/<project>/environments/<environment>/stop``,
    each percent-decoded (``group%2Fapp``, ``review%2Ffeat``); None for any other path."""
    parts = raw_path.decode("latin-1").split("?", 1)[0].split("/")
    if len(parts) != 8 or parts[:4] != ["", "api", "v4", "projects"] or parts[5] != "environments" \
            or parts[7] != "stop" or not parts[4] or not parts[6]:
        return None
    return unquote(parts[4]), unquote(parts[6])


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


__all__ = ["ALLOWED_AGENTS_PATH", "FINISH_PATH", "STOP_PATH", "RestApi", "finish_path", "serve_api", "stop_path"]
