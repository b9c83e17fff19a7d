"""kasd's REST API port (8153, ``listeners.api``): GitLab's ``GET /api/v4/job/allowed_agents``, which
a CI job (``JOB-TOKEN`` header or ``?job_token=``) asks to learn which agents it may use — what
``kasctl kubeconfig --job-token`` turns into a kubeconfig —, ``POST
/api/v4/projects/:project/environments/:name/stop``, which deletes what kasd created for an
environment (``kasctl env stop``), and ``PUT /api/v4/jobs/:id``, with which a job ends itself
(``kasctl token revoke``: kasd's store records it as finished, ``kasd.store``). An ASGI app, served
on kasd's own HTTP/1.1 front end (``kasd.asgiport``: the proxy port's framing, so the same
smuggling and head-size rules) on kasd's own capped listener (docs/dependencies.md says why not
hypercorn).
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote

import trio

from daemonkit.logs import UnexpectedErrors, logfmt
from kasd.asgiport import AsgiApp, AsgiPort, Bypass, PortLimits
from kasd.authz.jobinfo import allowed_agents_response
from kasd.authz.snapshot import Snapshot
from kasd.authz.verdict import AccessDenied
from kasd.restpaths import ALLOWED_AGENTS_PATH
from kasd.seams import Provisioner, ProvisionError
from kasd.store.environments import EnvironmentRefused, EnvironmentSlugs
from kasd.store.protocol import StoreError
from kasd.store.revocation import Revocations
from wire.ids import InvalidNumber, parse_id

log = logging.getLogger("kasd.api")

#: seconds one agent's part of an environment stop may take (``Provisioner.stop``): beyond, 504
#: (``kasd.server`` gives it to ``RestApi``; the stop's own requests are bounded by the provisioner's
#: request timeout, its retry rounds few)
STOP_TIME_LIMIT = 120.0

#: largest request head (request line and headers) this port accepts: beyond, 431 and a close
MAX_HEAD_BYTES = 16 * 1024
#: seconds from accept (TLS included) or a kept-alive request's first byte to its whole head: beyond, 408
HEAD_TIMEOUT = 30.0
#: seconds an idle keep-alive connection is kept
KEEP_ALIVE_TIMEOUT = 30.0
#: bytes of request body read (no call here takes one): beyond, 413 and a close
MAX_BODY_BYTES = 64 * 1024

#: where GitLab's API takes a job token, first found wins (``Gitlab::Auth::AuthFinders``:
#: ``params[:job_token]``, then ``params[:token]``, then the ``JOB-TOKEN`` header)
JOB_TOKEN_PARAMS = ("job_token", "token")

class StoppedEnvironments(Protocol):
    async def mark_stopped(self, project_id: int, name: str, at: float, *, job_id: int | None = None) -> object:
        """``kasd.store.protocol.Store.mark_stopped``."""
        ...


Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class RestApi:
    """The ASGI app. ``snapshot()`` is the authorization in force now (reloads included)."""

    def __init__(self, snapshot: Callable[[], Snapshot], provisioner: Provisioner | None = None,
                 clock: Callable[[], float] = time.time, revocations: Revocations | None = None,
                 environments: EnvironmentSlugs | None = None, *, stop_time_limit: float = STOP_TIME_LIMIT,
                 history: StoppedEnvironments | None = None) -> None:
        self._snapshot = snapshot
        #: seconds one agent's part of an environment stop may take: beyond, 504
        self._stop_time_limit = stop_time_limit
        #: which environment owns each slug (the proxy's, ``CiAuthority.environments``): a stop acts on
        #: what hangs on the slug, so only the environment that owns it may stop
        self._environments = environments if environments is not None else EnvironmentSlugs()
        self._provisioner = provisioner
        #: the store's environments: a stop marks the environment stopped (``kasd.store.deployments``)
        self._history = history
        self._clock = clock
        self._revocations = revocations

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # nothing to start or stop; served by any ASGI server
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        job_token = job_token_of(scope)
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

    @staticmethod
    def serves(scope: Scope) -> bool:
        """Whether this app answers the request's path (the API port gives every other path to the
        web app, ``kasd.web.mount``): ``/api/v4/job/allowed_agents``, ``/api/v4/jobs/…`` and an
        environment's ``…/stop``."""
        path = scope["path"]
        return path == ALLOWED_AGENTS_PATH or path.startswith("/api/v4/jobs/") or \
            _stop_path(bytes(scope.get("raw_path") or path.encode())) is not None

    def answer(self, method: str, path: str, job_token: str | None) -> tuple[int, dict[str, Any]]:
        """(status, JSON body) for one request, in GitLab's words (``{"message": "401 Unauthorized"}``)."""
        if path != ALLOWED_AGENTS_PATH:
            return 404, {"message": "404 Not Found"}
        if method not in ("GET", "HEAD"):
            return 405, {"message": "405 Method Not Allowed"}
        if not job_token:
            return 401, {"message": "401 Unauthorized: send the CI job token in a JOB-TOKEN header or a job_token "
                                    "parameter"}
        snapshot = self._snapshot()
        try:
            claims, allowed = snapshot.allowed_agents(job_token, now=self._clock())
        except AccessDenied as exc:
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
            return 401, {"message": "401 Unauthorized: send the stop job's CI job token in a JOB-TOKEN header or a "
                                    "job_token parameter"}
        snapshot = self._snapshot()
        try:
            claims, allowed = snapshot.allowed_agents(job_token, now=self._clock())
        except AccessDenied as exc:
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
        try:
            await self._environments.claim(known.id, environment)
        except EnvironmentRefused as exc:
            return 403, {"message": f"403 Forbidden: {exc}"}
        except StoreError as exc:
            return 503, {"message": f"503 Service Unavailable: cannot check that environment {environment!r} owns "
                                    f"its slug: {exc}"}
        agents = []
        for grant in allowed:
            plan = grant.managed
            if plan is None or self._provisioner is None:
                continue
            limit = self._stop_time_limit
            try:
                # the caller's bound: one agent that hangs costs the stop job a clear 504, not an
                # open-ended wait
                with trio.fail_after(limit):
                    report = await self._provisioner.stop(plan)
            except ProvisionError as exc:
                return 502, {"message": f"502 Bad Gateway: {exc.message}"}
            except trio.TooSlowError:
                return 504, {"message": f"504 Gateway Timeout: stopping the environment on agent {plan.agent_id} took "
                                        f"longer than {limit:g} s; run the stop again"}
            agents.append({"id": plan.agent_id, "namespace": plan.namespace, "delete_resources": plan.delete_resources,
                           "deleted": list(report.deleted), "kept": list(report.kept), "absent": list(report.absent)})
        if self._history is not None:
            try:
                await self._history.mark_stopped(known.id, environment, self._clock(), job_id=claims.job_id)
            except StoreError as exc:  # what the stop deleted is gone: the job is told so, the record is late
                log.warning("environment not marked stopped: the store failed project=%s environment=%s error=%s",
                            logfmt(claims.project), logfmt(environment), logfmt(str(exc)))
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
        except AccessDenied as exc:
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
    """The job id of ``/api/v4/jobs/<id>`` (``wire.ids``: ASCII digits, 1..2^63-1); None for any other path."""
    prefix = "/api/v4/jobs/"
    if not path.startswith(prefix):
        return None
    try:
        return parse_id(path[len(prefix):], "job id")
    except InvalidNumber:
        return None


def _stop_path(raw_path: bytes) -> tuple[str, str] | None:
    """(project, environment) of ``/api/v4/projects/<project>/environments/<environment>/stop``,
    each percent-decoded (``group%2Fapp``, ``review%2Ffeat``); None for any other path."""
    parts = raw_path.decode("latin-1").split("?", 1)[0].split("/")
    if len(parts) != 8 or parts[:4] != ["", "api", "v4", "projects"] or parts[5] != "environments" \
            or parts[7] != "stop" or not parts[4] or not parts[6]:
        return None
    return unquote(parts[4]), unquote(parts[6])


def job_token_of(scope: Scope) -> str | None:
    """The job token as GitLab's API reads it: the ``job_token`` query parameter, else ``token``,
    else the ``JOB-TOKEN`` header (an empty one counts as absent). A repeated parameter: its last
    value, as Rack reads a query."""
    query = bytes(scope.get("query_string") or b"").decode("latin-1")
    params = dict(parse_qsl(query, keep_blank_values=True)) if query else {}
    for name in JOB_TOKEN_PARAMS:
        if value := params.get(name, "").strip():
            return value
    return _header(scope, b"job-token") or None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value).decode("latin-1").strip()
    return None


def port_limits() -> PortLimits:
    return PortLimits(max_header_bytes=MAX_HEAD_BYTES, header_timeout=HEAD_TIMEOUT, idle_timeout=KEEP_ALIVE_TIMEOUT,
                      max_body_bytes=MAX_BODY_BYTES)


async def serve_api(app: AsgiApp, listeners: Sequence[trio.abc.Listener[trio.abc.Stream]], *,
                    ssl_context: ssl.SSLContext | None = None,
                    unexpected: UnexpectedErrors | None = None, bypass: Bypass | None = None,
                    task_status: trio.TaskStatus[list[trio.abc.Listener[trio.abc.Stream]]] = trio.TASK_STATUS_IGNORED,
                    ) -> None:
    """Serve ``app`` on ``listeners`` (already capped; TLS, if any, is done here, within the head
    timeout) until cancelled; an exception nobody expected is a ``500`` and one rate-limited line
    (``unexpected``, the port's). ``bypass``: requests served before ``app`` (in-cluster services)."""
    port = AsgiPort(app, limits=port_limits(), ssl_context=ssl_context, log=log, unexpected=unexpected,
                    bypass=bypass)
    await trio.serve_listeners(port.handle_connection, list(listeners), task_status=task_status)


__all__ = ["RestApi", "serve_api"]
