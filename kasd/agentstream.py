"""One request's logical stream to an agent, from open to close: the steps the proxy's pipeline
(``kasd.k8sproxy.pipeline``) and kasd's own requests to an agent (``kasd.agentclient``) share, so
both tell the router the same things and fail the same way.

1. ``open_stream``: the router's stream for the request head (``AgentStreamError`` with the status
   the asker is told when there is none; ``NoOtherSession`` as itself, for a retry to decide);
2. the caller sends the body (or its end) on the stream;
3. ``response_head``: the agent took the stream, and the router is told so (or of its refusal,
   which is raised for the caller to answer or retry); the agent's response head, parsed;
4. the caller reads the answer, then closes the stream.

What each caller answers (a Kubernetes Status to kubectl, a managed-namespace error to a job) and
whether it retries are its own. No deadline here: the caller holds one around the call.

May import: ``kasd.seams``, ``tunnelhttp``, ``wire``, the standard library. Never the proxy.
"""

from __future__ import annotations

from kasd.seams import AgentNotConnected, NoFreeStream, NoOtherSession, RouteError, Router
from tunnelhttp.head import ResponseHead
from wire.errors import ErrorCode, RemoteProtocolError, UnsendableFrameError
from wire.frames import Metadata
from wire.session import MuxStream, Session, StreamRefusedError


class AgentStreamError(Exception):
    """The request found no stream to its agent, or the agent's answer head was unreadable:
    ``status`` and ``message`` are what the asker is told."""

    def __init__(self, status: int, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        #: no tunnel to the agent was found within the router's bounded wait (a routing timeout)
        self.timed_out = timed_out


async def open_stream(router: Router, agent_id: int, metadata: Metadata, *,
                      avoid: frozenset[Session] = frozenset()) -> MuxStream:
    """A stream to ``agent_id`` from ``router``, opened with ``metadata``; ``AgentStreamError``
    otherwise (``NoOtherSession`` as itself: only a retry passes ``avoid``, and decides what it means)."""
    try:
        return await router.open_stream(agent_id, metadata, avoid=avoid)
    except NoOtherSession:
        raise
    except RouteError as exc:
        raise AgentStreamError(exc.status, exc.message,
                               timed_out=isinstance(exc, AgentNotConnected | NoFreeStream)) from None
    except UnsendableFrameError as exc:  # over a limit in what kasd adds (the impersonation)
        status = exc.status or (431 if exc.code == ErrorCode.FRAME_SIZE_ERROR else 400)
        raise AgentStreamError(status, f"request head does not fit the tunnel: {exc.message}") from None


async def response_head(router: Router, stream: MuxStream, agent_id: int) -> ResponseHead:
    """The agent's response head on ``stream``, once it took the stream; the router is told how the
    agent answered either way (it steers later requests by it). A refusal is raised as the
    ``StreamRefusedError`` it is, a broken stream or session as its ``trio.BrokenResourceError``;
    an unreadable head is ``AgentStreamError`` 502."""
    try:
        metadata = await stream.wait_accepted()
    except StreamRefusedError as exc:
        router.report(stream, exc)
        raise
    router.report(stream, None)
    try:
        return ResponseHead.from_metadata(metadata)
    except RemoteProtocolError as exc:
        raise AgentStreamError(502, f"agent {agent_id} sent an invalid response head: {exc}") from None


__all__ = ["AgentStreamError", "open_stream", "response_head"]
