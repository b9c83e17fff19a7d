"""The annotate action: a JSON merge patch through the Kubernetes API, with agentd's own credentials
(no impersonation), setting one annotation to the event's posted time as RFC 3339 — Flux reconciles a
source or Kustomization at once when its ``reconcile.fluxcd.io/requestedAt`` changes, which is how
GitLab's Flux integration makes Flux pull right after a push.

The value is the event's posted time, not the time agentd acts: a redelivered event writes the same
value, which Flux takes as the request it already handled (an annotate is idempotent), while each new
event (another posted time, to the microsecond) asks for a new reconciliation.

The object is named in agentd's configuration, or (``match: url``) every object of the kind in the
configured namespace whose ``spec.url`` equals the payload's ``url`` (compared exactly): the payload
picks among objects the configuration already allows, never a namespace or a kind.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from agentd.events.exchange import ActionAttempt
from agentd.events.model import IncomingEvent
from agentd.events.settings import AnnotateSettings
from agentd.upstream import (
    InvalidRequest,
    ResponseTooLarge,
    UpstreamLost,
    UpstreamPool,
    UpstreamTimeout,
    UpstreamUnreachable,
    exchange,
)

_ACCEPT = (("accept", "application/json"),)
_MAX_DOC = 4 * 1024 * 1024
#: a list page; the pages are bounded too (10 000 objects of a kind in one namespace is plenty)
_PAGE = 200
_MAX_PAGES = 50
_RETRIED = frozenset({408, 409, 425, 429})


class _Failed(Exception):
    def __init__(self, attempt: ActionAttempt) -> None:
        super().__init__(attempt.detail)
        self.attempt = attempt


class Annotator:
    """Annotates objects through ``pool`` (agentd's pool to the API server)."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        #: (apiVersion, kind) → the resource's plural, from discovery (kinds do not move)
        self._plurals: dict[tuple[str, str], str] = {}

    async def attempt(self, settings: AnnotateSettings, event: IncomingEvent) -> ActionAttempt:
        try:
            plural = await self._plural(settings, event.head.request_id)
            base = f"{settings.api_prefix}/namespaces/{settings.namespace}/{plural}"
            value = event.head.posted_rfc3339
            if settings.name is not None:
                status = await self._patch(base, settings, settings.name, value, event.head.request_id, missing_ok=False)
                return ActionAttempt(ok=True, status=status,
                                     detail=f"annotated {settings.kind} {settings.namespace}/{settings.name} "
                                            f"{settings.annotation}={value}")
            url = event.payload.get("url") if isinstance(event.payload, dict) else None
            if not isinstance(url, str) or not url:
                return ActionAttempt(ok=False, final=True,
                                     detail=f"annotate {settings.kind} in {settings.namespace} by url: the payload has no "
                                            "string 'url' to compare with spec.url")
            names = await self._matching(base, settings, url, event.head.request_id)
            if not names:
                return ActionAttempt(ok=False, final=True,
                                     detail=f"annotate: no {settings.kind} in {settings.namespace} has spec.url "
                                            f"{url[:200]!r}")
            done = []
            status = None
            for name in names:
                answered = await self._patch(base, settings, name, value, event.head.request_id, missing_ok=True)
                if answered is not None:  # None: deleted since the list
                    status = answered
                    done.append(name)
            shown = ", ".join(done[:20]) + (f" and {len(done) - 20} more" if len(done) > 20 else "")
            return ActionAttempt(ok=True, status=status,
                                 detail=f"annotated {len(done)} {settings.kind} in {settings.namespace} "
                                        f"({shown}) {settings.annotation}={value}")
        except _Failed as failed:
            return failed.attempt

    async def _plural(self, settings: AnnotateSettings, request_id: str) -> str:
        key = (settings.api_version, settings.kind)
        if key in self._plurals:
            return self._plurals[key]
        status, body = await self._call("GET", settings.api_prefix, None, request_id, f"discover {settings.api_version}")
        if status == 404:
            hint = " (is Flux installed?)" if settings.api_version.split("/")[0].endswith("fluxcd.io") else ""
            raise _Failed(ActionAttempt(ok=False, status=status, final=True,
                                        detail=f"annotate: the API server does not serve {settings.api_version}{hint}"))
        self._check(status, body, f"discover {settings.api_version}")
        resources = _json(body).get("resources")
        for resource in resources if isinstance(resources, list) else []:
            if (isinstance(resource, dict) and resource.get("kind") == settings.kind
                    and isinstance(resource.get("name"), str) and "/" not in resource["name"]):
                self._plurals[key] = resource["name"]
                return str(resource["name"])
        raise _Failed(ActionAttempt(ok=False, final=True,
                                    detail=f"annotate: {settings.api_version} has no kind {settings.kind}"))

    async def _matching(self, base: str, settings: AnnotateSettings, url: str, request_id: str) -> list[str]:
        names: list[str] = []
        token = ""
        for _ in range(_MAX_PAGES):
            target = f"{base}?limit={_PAGE}" + (f"&continue={quote(token, safe='')}" if token else "")
            status, body = await self._call("GET", target, None, request_id, f"list {settings.kind}")
            self._check(status, body, f"list {settings.kind} in {settings.namespace}")
            document = _json(body)
            for item in document.get("items") or []:
                spec = item.get("spec") if isinstance(item, dict) else None
                name = (item.get("metadata") or {}).get("name") if isinstance(item, dict) else None
                if isinstance(spec, dict) and spec.get("url") == url and isinstance(name, str):
                    names.append(name)
            token = (document.get("metadata") or {}).get("continue") or ""
            if not isinstance(token, str) or not token:
                return names
        raise _Failed(ActionAttempt(ok=False, final=True,
                                    detail=f"annotate: over {_PAGE * _MAX_PAGES} {settings.kind} in {settings.namespace}"))

    async def _patch(self, base: str, settings: AnnotateSettings, name: str, value: str, request_id: str, *,
                     missing_ok: bool) -> int | None:
        patch = json.dumps({"metadata": {"annotations": {settings.annotation: value}}}).encode()
        what = f"{settings.kind} {settings.namespace}/{name}"
        status, body = await self._call("PATCH", f"{base}/{name}", patch, request_id, f"patch {what}",
                                         content_type="application/merge-patch+json")
        if status == 404:
            if missing_ok:
                return None
            raise _Failed(ActionAttempt(ok=False, status=404, final=True, detail=f"annotate: {what} not found (404)"))
        self._check(status, body, f"patch {what}")
        return status

    async def _call(self, method: str, target: str, body: bytes | None, request_id: str, what: str, *,
                    content_type: str | None = None) -> tuple[int, bytes]:
        headers = _ACCEPT + ((("content-type", content_type),) if content_type else ())
        try:
            return await exchange(self.pool, method, target, headers, body, max_response=_MAX_DOC,
                                  request_id=request_id)
        except (UpstreamUnreachable, UpstreamLost, UpstreamTimeout) as exc:
            raise _Failed(ActionAttempt(ok=False, detail=f"annotate: {what}: {exc}")) from None
        except (ResponseTooLarge, InvalidRequest) as exc:
            raise _Failed(ActionAttempt(ok=False, final=True, detail=f"annotate: {what}: {exc}")) from None

    @staticmethod
    def _check(status: int, body: bytes, what: str) -> None:
        if 200 <= status < 300:
            return
        message = _json(body).get("message")
        said = f": {message[:300]}" if isinstance(message, str) and message else ""
        retry = status >= 500 or status in _RETRIED
        raise _Failed(ActionAttempt(ok=False, status=status, final=not retry, detail=f"annotate: {what}: {status}{said}"))


def _json(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    return document if isinstance(document, dict) else {}


__all__ = ["Annotator"]
