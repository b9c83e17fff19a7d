"""``AgentClient``: one JSON request to an agent's Kubernetes API through the ``Router``, as the
agent itself (no impersonation: the agent's own service account acts, as GitLab's agentk applies
environment templates). The stream's lifecycle is the pipeline's (``kasd.agentstream``): the
router is told how the agent answered, and fails the same way. No deadline of its own: the caller
holds one around each request (``AgentProvisioner``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from kasd.agentstream import AgentStreamError, open_stream, response_head
from kasd.seams import ProvisionError, Router
from tunnelhttp.head import RequestHead
from wire.errors import RemoteProtocolError, UnsendableFrameError
from wire.session import SessionClosedError, StreamRefusedError, StreamResetError

#: the most of an answer kasd reads (a Status or one object)
MAX_ANSWER = 1 << 20


@attrs.frozen
class Answer:
    status: int
    body: Mapping[str, Any]

    @property
    def message(self) -> str:
        return str(self.body.get("message") or f"HTTP {self.status}")


class AgentClient:
    """JSON requests to an agent's Kubernetes API through the tunnel, as the agent itself."""

    def __init__(self, router: Router) -> None:
        self.router = router

    async def request(self, agent_id: int, method: str, target: str, body: Mapping[str, Any] | None = None) -> Answer:
        """The agent's answer (any status); ``ProvisionError`` if there was none to read."""
        payload = json.dumps(body).encode() if body is not None else b""
        headers: list[tuple[str, str]] = [("accept", "application/json"), ("user-agent", "kasd/managed-namespaces")]
        if body is not None:
            headers += [("content-type", "application/json"), ("content-length", str(len(payload)))]
        head = RequestHead(method=method, target=target, headers=tuple(headers), impersonate=None,
                           request_id=os.urandom(16).hex())
        try:
            stream = await open_stream(self.router, agent_id, head.to_metadata())
            try:
                if payload:
                    await stream.send_all(payload)
                await stream.send_eof()
                answer = await response_head(self.router, stream, agent_id)
                data = bytearray()
                while chunk := await stream.receive_some(65536):
                    data += chunk
                    if len(data) > MAX_ANSWER:
                        raise ProvisionError(502, f"agent {agent_id} answered {method} {target} with "
                                                  f"more than {MAX_ANSWER} bytes")
            finally:
                with trio.CancelScope(shield=True):
                    await stream.aclose()
        except AgentStreamError as exc:
            raise ProvisionError(exc.status, exc.message) from None
        except (StreamRefusedError, StreamResetError, SessionClosedError, trio.BrokenResourceError,
                RemoteProtocolError, UnsendableFrameError) as exc:
            raise ProvisionError(502, f"tunnel to agent {agent_id} failed: {exc}") from None
        try:
            parsed = json.loads(bytes(data)) if data else {}
        except ValueError:
            parsed = {}
        return Answer(status=answer.status, body=parsed if isinstance(parsed, dict) else {})


__all__ = ["MAX_ANSWER", "AgentClient", "Answer"]
