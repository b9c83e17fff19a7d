"""The webhook action: POST the event, signed with HMAC-SHA256 (GitHub's ``X-Hub-Signature-256``
scheme, as ``X-Kasd-Signature-256: sha256=<hex>``), to the URL in agentd's own configuration.

The body is ``{"id","type","agent_id","posted_at","payload"}``; 2xx is done. A redirect is never
followed (the URL is agentd's choice alone; a 3xx is a failure saying so); any other 4xx is final (the
receiver refused this body, and would refuse it again); 408, 425, 429, 5xx, a refused or broken
connection and no answer in time are tried again (``EventHandler`` decides when and how often).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any
from urllib.parse import urlsplit

from agentd import __version__
from agentd.events.exchange import ActionAttempt
from agentd.events.model import IncomingEvent
from agentd.events.settings import WebhookSettings
from agentd.services import ServiceTarget
from agentd.upstream import (
    InvalidRequest,
    ResponseTooLarge,
    UpstreamLost,
    UpstreamPool,
    UpstreamTimeout,
    UpstreamUnreachable,
    exchange,
)

SIGNATURE_HEADER = "x-kasd-signature-256"
#: what agentd reads of a receiver's answer (then the connection is dropped): it only needs the status
_MAX_ANSWER = 64 * 1024
_RETRIED_4XX = frozenset({408, 425, 429})


def webhook_body(event: IncomingEvent, agent_id: str) -> bytes:
    document: dict[str, Any] = {"id": event.head.id, "type": event.head.type, "agent_id": agent_id,
                                "posted_at": event.head.posted_at, "payload": event.payload}
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def signature(secret: bytes, body: bytes) -> str:
    """The ``X-Kasd-Signature-256`` value: ``sha256=`` and the hex HMAC-SHA256 of ``body``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class WebhookSender:
    """POSTs events to one configured URL over a small keep-alive pool of its own."""

    def __init__(self, settings: WebhookSettings, *, agent_id: str) -> None:
        self.settings = settings
        self.agent_id = agent_id
        parts = urlsplit(settings.url)
        scheme = parts.scheme
        port = parts.port or (443 if scheme == "https" else 80)
        assert parts.hostname is not None  # settings checked it
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.pool = UpstreamPool(
            ServiceTarget(name="webhook", label="the webhook receiver", scheme=scheme, host=parts.hostname,
                          port=port, ssl_context=settings.ssl_context()),
            max_idle=2,
            # the caller bounds each attempt as a whole (connect, request, answer)
            response_header_timeout=None,
        )

    async def aclose(self) -> None:
        await self.pool.aclose()

    async def attempt(self, event: IncomingEvent) -> ActionAttempt:
        url = self.settings.url
        try:
            secret = self.settings.read_secret()
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return ActionAttempt(ok=False,
                                 detail=f"webhook: cannot read the secret file {self.settings.secret_file}: {reason}")
        body = webhook_body(event, self.agent_id)
        headers = (
            ("content-type", "application/json"),
            ("user-agent", f"agentd/{__version__}"),
            ("x-kasd-event", event.head.type),
            ("x-kasd-event-id", event.head.id),
            (SIGNATURE_HEADER, signature(secret, body)),
        )
        try:
            status, _ = await exchange(self.pool, "POST", self.target, headers, body, max_response=_MAX_ANSWER,
                                       request_id=event.head.request_id)
        except (UpstreamUnreachable, UpstreamLost, UpstreamTimeout) as exc:
            return ActionAttempt(ok=False, detail=f"webhook POST {url}: {exc}")
        except ResponseTooLarge as exc:
            status = exc.status  # only the status matters; the rest of a long answer is not read
        except InvalidRequest as exc:
            return ActionAttempt(ok=False, detail=f"webhook POST {url}: {exc}", final=True)
        if 200 <= status < 300:
            return ActionAttempt(ok=True, status=status, detail=f"webhook POST {url}: {status}")
        if 300 <= status < 400:
            return ActionAttempt(ok=False, status=status, final=True,
                                 detail=f"webhook POST {url}: answered {status}, a redirect (agentd follows none)")
        retry = status >= 500 or status in _RETRIED_4XX
        return ActionAttempt(ok=False, status=status, final=not retry, detail=f"webhook POST {url}: answered {status}")


__all__ = ["SIGNATURE_HEADER", "WebhookSender", "signature", "webhook_body"]
