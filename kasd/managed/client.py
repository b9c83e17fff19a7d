"""``AgentClient``: one JSON request to an agent's Kubernetes API through the ``Router``, as the
agent itself (no impersonation: the agent's own service account acts, as GitLab's agentk applies
environment templates). The request itself is ``kasd.agentclient.AgentApi``'s (shared with
``kasd.environments``); here a failure to get an answer becomes the ``ProvisionError`` the
provisioner reports. No deadline of its own: the caller holds one around each request
(``AgentProvisioner``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kasd.agentclient import MAX_ANSWER, AgentApi, AgentRequestError, Answer
from kasd.seams import ProvisionError, Router


class AgentClient:
    """JSON requests to an agent's Kubernetes API through the tunnel, as the agent itself."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.api = AgentApi(router, user_agent="kasd/managed-namespaces")

    async def request(self, agent_id: int, method: str, target: str, body: Mapping[str, Any] | None = None) -> Answer:
        """The agent's answer (any status); ``ProvisionError`` if there was none to read."""
        try:
            return await self.api.request(agent_id, method, target, body)
        except AgentRequestError as exc:
            raise ProvisionError(exc.status, exc.message) from None


__all__ = ["MAX_ANSWER", "AgentClient", "Answer"]
