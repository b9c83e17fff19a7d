"""Why a request found no stream to its agent: the typed failures of a router (``kasd.seams.Router``),
each with the HTTP status and the message the client is told.

May import: the standard library only (kasd's pipeline and every router raise these).
"""

from __future__ import annotations


class RouteError(Exception):
    """No stream to the agent; ``status`` and ``message`` are what the client is told."""

    status = 503

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class AgentNotConnected(RouteError):
    """No tunnel to the agent appeared within the bounded wait."""

    def __init__(self, agent_id: int, waited: float) -> None:
        super().__init__(f"agent {agent_id} is not connected (waited {waited:g}s)")
        self.agent_id = agent_id


class NoFreeStream(RouteError):
    """The agent is connected, but none of its sessions took a stream within the bounded wait."""

    def __init__(self, agent_id: int, waited: float) -> None:
        super().__init__(f"agent {agent_id} is connected but has no free tunnel stream (waited {waited:g}s)")
        self.agent_id = agent_id


class PeerUnreachable(RouteError):
    """Another kasd holds the agent's tunnel but could not be reached."""

    status = 502

    def __init__(self, agent_id: int, peer: str, detail: str) -> None:
        super().__init__(f"agent {agent_id} is connected to kasd {peer}, which is unreachable: {detail}")
        self.agent_id = agent_id
        self.peer = peer


class NoOtherSession(RouteError):
    """Asked to avoid the sessions a request already tried, and the agent has no other usable one
    now (at once, without waiting): the caller decides whether the one it tried is worth asking again."""

    def __init__(self, agent_id: int) -> None:
        super().__init__(f"agent {agent_id} has no other tunnel session to retry on")
        self.agent_id = agent_id
