"""The seams of kasd's request pipeline: who may use an agent (``Authority``), how a request
reaches it (``Router``) and what must exist before it goes on (``Provisioner``: managed
namespaces), with the values and typed failures they answer with.

The pipeline (``kasd.k8sproxy.pipeline``) is given one of each and asks nothing else: the
implementations are CI job and personal tokens checked against the agents' configuration
(``kasd.authority.CiAuthority``), the tunnel registry (``routing.local.LocalRouter``; among
replicas ``routing.router.ReplicatedRouter`` over it), and managed namespaces made through that
router (``kasd.managed.provisioner.AgentProvisioner``); none touches a protocol front end. Tests
inject fakes.

May import: ``wire`` (a router answers with a logical stream), ``routing.errors`` (its failures),
``kasd.authz`` (pure values: the verdict), the standard library, attrs. Never the proxy, a front end
or a listener.

An authority answers with a ``Grant`` or an ``AccessDenied``: both are ``kasd.authz.verdict``'s,
re-exported here, so the pure authorization code raises the very value the pipeline catches (no
copy on the way); a router fails with ``routing.errors``' failures, re-exported too.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from kasd.authz.templates import ManagedResources
from kasd.authz.verdict import AccessDenied, Grant
from routing.errors import (
    AgentNotConnected,
    NoFreeStream,
    NoOtherSession,
    PeerUnreachable,
    RouteError,
)
from wire.frames import Metadata
from wire.ids import InvalidNumber, parse_id
from wire.session import MuxStream, Session, StreamRefusedError

#: the bearer token formats on the Kubernetes API proxy port, as in GitLab
TOKEN_FORMATS = "ci:<agent id>:<job token> or pat:<agent id>:<token>"


# ------------------------------------------------------------------ Authority


@attrs.frozen(kw_only=True)
class Credentials:
    """What a client proved itself with: ``ci:<agent id>:<job token>`` or ``pat:<agent id>:<token>``."""

    kind: str
    agent_id: int
    #: never logged
    secret: str = attrs.field(repr=False)


class Authority(Protocol):
    async def authorize(self, credentials: Credentials, agent_id: int) -> Grant:
        """The grant of ``credentials`` for ``agent_id``; ``AccessDenied`` saying why not."""
        ...


def parse_bearer(authorization: str | None) -> Credentials:
    """An ``Authorization`` header → credentials, or AccessDenied(401) saying what is wrong."""
    if not authorization:
        raise AccessDenied(401, f"missing bearer token: send Authorization: Bearer {TOKEN_FORMATS}")
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise AccessDenied(401, f"bad token: expected Authorization: Bearer {TOKEN_FORMATS}")
    kind, sep1, rest = credentials.strip().partition(":")
    agent_text, sep2, secret = rest.partition(":")
    if kind not in ("ci", "pat") or not (sep1 and sep2) or not secret:
        raise AccessDenied(401, f"bad token: malformed, expected {TOKEN_FORMATS}")
    try:
        agent_id = parse_id(agent_text, "agent id")
    except InvalidNumber as exc:
        raise AccessDenied(401, f"bad token: {exc.message} (expected {TOKEN_FORMATS})") from None
    return Credentials(kind=kind, agent_id=agent_id, secret=secret)


# ------------------------------------------------------------------ Router

#: re-exported: the verdict lives in ``kasd.authz.verdict`` (the pure package raises it) and a grant's
#: managed resources in ``kasd.authz.templates``, the failures a router raises in ``routing.errors``
#: (routing never imports kasd)
__all__ = [
    "TOKEN_FORMATS",
    "AccessDenied",
    "AgentNotConnected",
    "Authority",
    "Credentials",
    "Grant",
    "ManagedResources",
    "NoFreeStream",
    "NoOtherSession",
    "PeerUnreachable",
    "ProvisionError",
    "Provisioner",
    "Recorder",
    "RouteError",
    "Router",
    "StopReport",
    "parse_bearer",
]


class Router(Protocol):
    async def open_stream(self, agent_id: int, metadata: Metadata, *,
                          avoid: frozenset[Session] = frozenset()) -> MuxStream:
        """A logical stream to ``agent_id`` opened with ``metadata`` (waiting, bounded, for one);
        a ``RouteError`` saying why not.

        ``avoid``: the sessions (``stream.session``) this request already tried; the stream is
        opened on none of them, and if one of them is the only usable session, ``NoOtherSession``
        is raised at once. Metadata no session could carry raises ``wire.errors.UnsendableFrameError``
        at once (a verdict on the request, never a reason to try another session).
        """
        ...

    def report(self, stream: MuxStream, refusal: StreamRefusedError | None) -> None:
        """How the agent answered a stream from ``open_stream``: it took it (``refusal`` None) or
        refused it. A router steers later requests by it: a session whose agent cannot reach its
        API server (``UPSTREAM_UNREACHABLE``) is passed over for a while."""
        ...


# ------------------------------------------------------------------ Recorder


class Recorder(Protocol):
    """Told of each request the pipeline let through (``kasd.store.deployments.DeploymentRecorder``:
    a CI job's use of an agent for its environment). Both calls return at once and never raise:
    recording happens off the request's path."""

    def used(self, grant: Grant) -> None:
        """``grant`` was authorized for a request."""
        ...

    def wrote(self, grant: Grant, namespace: str) -> None:
        """A write (POST/PUT/PATCH/DELETE) of ``grant`` into ``namespace`` succeeded."""
        ...


# ------------------------------------------------------------------ Provisioner


class ProvisionError(Exception):
    """A grant's managed resources could not be applied (or deleted): ``status`` for the job's
    answer, ``message`` safe to show it (names the object and the agent, never a token)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@attrs.frozen(kw_only=True)
class StopReport:
    """What an environment's stop did on one agent, each object described (``Namespace app-42``)."""

    deleted: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()


class Provisioner(Protocol):
    """Makes a grant's managed resources exist before its request goes on (the pipeline), and
    deletes them when the environment stops (the REST API's stop call)."""

    async def ensure(self, plan: ManagedResources, *, request_id: str = "") -> None:
        """``plan``'s objects exist once this returns; ``ProvisionError`` naming the one that failed.
        Concurrent calls for one plan apply it once; the others wait for it."""
        ...

    async def stop(self, plan: ManagedResources) -> StopReport:
        """Delete what was made for ``plan`` (``delete_resources: on_stop``), nothing else;
        ``ProvisionError`` naming the object that could not be."""
        ...
