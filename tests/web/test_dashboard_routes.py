"""The dashboard's routes (kasd/web/dashboard.py) and its files, without a browser: what is served
where, with which headers, and the rules the files keep (no markup built from strings, no inline
script or style, every vendored library with its licence)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio
from starlette.applications import Starlette
from starlette.types import Message

from kasd.web.dashboard import STATIC, dashboard_routes

pytestmark = pytest.mark.timeout(10)

APP = Starlette(routes=dashboard_routes())


async def get(path: str) -> tuple[int, dict[str, str], bytes]:
    """One GET through the ASGI app: (status, headers, body)."""
    sent: list[Message] = []
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"host", b"kasd.test")], "server": ("kasd.test", 80),
             "client": ("127.0.0.1", 5000)}

    requested = False

    async def receive() -> Message:
        nonlocal requested
        if requested:  # the client stays connected until the answer is done
            await trio.sleep_forever()
        requested = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    with trio.fail_after(5):
        await APP(scope, receive, send)
    start = sent[0]
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], headers, body


async def test_index_and_static_files_carry_the_csp() -> None:
    status, headers, body = await get("/-/dashboard/")
    assert status == 200
    assert headers["content-type"].startswith("text/html")
    assert headers["content-security-policy"].startswith("default-src 'self'")
    assert headers["x-content-type-options"] == "nosniff"
    assert b'<script type="module" src="static/js/app.js">' in body

    for path in ("/-/dashboard/static/js/app.js", "/-/dashboard/static/vendor/cytoscape.esm.min.js"):
        status, headers, _ = await get(path)
        assert status == 200, path
        assert headers["content-type"] == "text/javascript; charset=utf-8", path  # modules need it
        assert headers["content-security-policy"].startswith("default-src 'self'"), path
    status, headers, _ = await get("/-/dashboard/static/dashboard.css")
    assert (status, headers["content-type"].split(";")[0]) == (200, "text/css")
    assert b'<link rel="icon" href="static/favicon.svg"' in body  # (else the browser asks for /favicon.ico)
    status, headers, _ = await get("/-/dashboard/static/favicon.svg")
    assert (status, headers["content-type"].split(";")[0]) == (200, "image/svg+xml")


async def test_the_bare_path_redirects_and_nothing_outside_static_is_served() -> None:
    status, headers, _ = await get("/-/dashboard")
    assert (status, headers["location"]) == (308, "/-/dashboard/")
    for path in ("/-/dashboard/static/../dashboard.py", "/-/dashboard/static/%2e%2e/dashboard.py",
                 "/-/dashboard/static/nothing.js", "/-/dashboard/dashboard.py"):
        status, _, body = await get(path)
        assert status == 404, path
        assert b"STATIC" not in body


def test_no_markup_from_strings_and_no_inline_code() -> None:
    """Every text the dashboard shows is a Text node: none of its scripts may parse a string as HTML
    (the CSP allows only the dashboard's own scripts, and this keeps server data from becoming one)."""
    sinks = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|"
                       r"setAttribute\(\s*[\"']style|\.srcdoc")
    for script in sorted((STATIC / "js").glob("*.js")):
        found = [line for line in script.read_text().splitlines()
                 if sinks.search(line) and not line.lstrip().startswith("//")]
        assert found == [], f"{script.name}: {found}"
    html = (STATIC / "index.html").read_text()
    assert re.findall(r"<script(?![^>]*\bsrc=)", html) == []  # no inline script
    assert "<style" not in html and " style=" not in html and re.search(r"\bon[a-z]+=", html) is None


def test_every_vendored_library_has_its_licence_and_version() -> None:
    vendor = STATIC / "vendor"
    versions = (vendor / "VERSIONS").read_text()
    for name in ("cytoscape", "cytoscape-dagre", "dagre"):
        assert (vendor / f"LICENSE.{name}").read_text().strip(), name
    assert "cytoscape 3.35.0" in versions and "cytoscape-dagre 4.0.1" in versions
    script = (Path(__file__).parents[2] / "scripts" / "vendor-dashboard.sh").read_text()
    assert "CYTOSCAPE=3.35.0" in script and "CYTOSCAPE_DAGRE=4.0.1" in script
