"""The dashboard's routes: ``/-/dashboard/`` (its one HTML page) and ``/-/dashboard/static/…`` (its
scripts, styles and the vendored cytoscape.js). Nothing here reads a request's credentials: the page
is the same for everyone and talks to the JSON API, which decides what each person may see.

Every answer carries ``Content-Security-Policy: default-src 'self'`` (no inline script or style, no
other origin, no framing by another site) and ``X-Content-Type-Options: nosniff``, so the web app
need not remember to for these paths."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

STATIC = Path(__file__).resolve().parent / "static"
PREFIX = "/-/dashboard"

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


class _GuardedStatic:
    """StaticFiles with the security headers on every answer and JavaScript modules always sent as
    ``text/javascript`` (a browser refuses a module with any other type under ``nosniff``)."""

    def __init__(self, directory: Path) -> None:
        self._files = StaticFiles(directory=directory, html=False, follow_symlink=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v) for k, v in message.get("headers", [])
                    if k.lower() != b"content-type" or not path.endswith(".js")
                ]
                if path.endswith(".js"):
                    headers.append((b"content-type", b"text/javascript; charset=utf-8"))
                headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self._files(scope, receive, send_guarded)


async def _index(request: Request) -> Response:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8",
                        headers={**SECURITY_HEADERS, "Cache-Control": "no-cache"})


async def _to_index(request: Request) -> Response:
    return RedirectResponse(f"{PREFIX}/", status_code=308)


def dashboard_routes() -> list[BaseRoute]:
    """The routes the web app includes, as they are: ``Starlette(routes=[..., *dashboard_routes()])``."""
    return [
        Route(PREFIX, _to_index, methods=["GET", "HEAD"]),
        Route(f"{PREFIX}/", _index, methods=["GET", "HEAD"]),
        Mount(f"{PREFIX}/static", app=_GuardedStatic(STATIC), name="dashboard-static"),
    ]
