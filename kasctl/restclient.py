"""kasctl's one HTTP client for kasd's REST API: ``rest_call(api, path, token, ca_pem, method=…)``.

Every kasctl command that sends a job token goes through it (``kubeconfig``, ``env stop``; add new
ones here too), because it never sends a credential anywhere but the URL it was given: it follows
no redirect. urllib's default opener follows a 30x to any host, port or scheme and copies the
request's headers — ``Job-Token`` included — onto the new request; here a redirect is an error
naming where it pointed (without its query, which could carry anything), and the user decides
whether that is the right ``--api-url``. kasd's REST API never redirects; a front end that does
(``http://`` to ``https://``, a moved host) is fixed by giving kasctl the final URL.

An ``api`` that is kasd's Kubernetes API proxy port instead (``listeners.kubernetes_api``, a
mistake easy to make: both are kasd's HTTPS ports) answers every REST call 401 with a Kubernetes
``Status`` and ``WWW-Authenticate: Bearer realm="kasd"`` — kasd's REST API answers neither — and
the error says which port it wants rather than relaying the proxy's "no Authorization header".

Errors are ``RestError`` (one line for stderr, ``code`` the exit status: 1 kasd unreachable or
refusing, 2 a wrong command line); no message quotes the token.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from typing import IO, Any, NoReturn
from urllib.parse import urljoin, urlsplit

#: seconds for the whole call (connect, TLS, answer) — a command line, not a daemon
TIMEOUT = 30.0
#: bytes of an answer read at most (kasd's answers are a few KiB)
MAX_ANSWER = 4 * 1024 * 1024


def shown(value: object) -> str:
    """``value`` as text safe to print to a terminal: every character ``str.isprintable`` refuses
    (ESC and the rest of C0 and C1, newline, carriage return, backspace, bidi overrides) written as
    its escape (``\\x1b``). What kasd answers carries text written by others — a pod's name from an
    agent's HELLO, an event's detail from agentd, a Prometheus label from any pod it scrapes, a
    Kubernetes object's condition message — and a terminal acts on an escape sequence in it (clearing
    the screen, retitling the window, rewriting earlier lines, on some terminals answering with
    keystrokes). Every such text kasctl prints as text goes through here; ``--output json`` is
    escaped by ``json.dumps`` already."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class RestError(Exception):
    """One line for stderr; ``code`` the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """Replaces urllib's redirect handler (which would resend ``Job-Token`` to wherever a 30x points)."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: Message, newurl: str) -> NoReturn:
        raise RestError(f"{req.full_url.split('?', 1)[0]} answered {code} redirecting to "
                        f"{describe_location(req.full_url, newurl)}: kasctl follows no redirect, so that your "
                        "token goes nowhere else; if that is kasd's REST API, pass it as --api-url")


def describe_location(base: str, location: str) -> str:
    """Where a redirect points, for a message: absolute, without userinfo, query or fragment, short."""
    try:
        parts = urlsplit(urljoin(base, location))
        netloc = parts.netloc.rsplit("@", 1)[-1]
        text = f"{parts.scheme}://{netloc}{parts.path}"
    except ValueError:
        text = location.split("?", 1)[0]
    if len(text) > 200:
        text = text[:200] + "…"
    return repr(text)


def opener(ca_pem: bytes | None) -> urllib.request.OpenerDirector:
    """urllib with kasd's CA (None: the system's) and no redirects."""
    try:
        context = ssl.create_default_context(cadata=ca_pem.decode()) if ca_pem else ssl.create_default_context()
    except (ssl.SSLError, ValueError) as exc:
        raise RestError(f"cannot use the CA file: {exc}", 2) from None
    return urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), _RefuseRedirects())


def rest_call(api: str, path: str, token: str, ca_pem: bytes | None, *, method: str = "GET",
              body: dict[str, Any] | None = None, token_header: str = "Job-Token") -> dict[str, Any]:
    """``rest_json`` of a call whose answer is a JSON object."""
    answer: dict[str, Any] = rest_json(api, path, token, ca_pem, method=method, body=body, token_header=token_header)
    return answer


def rest_json(api: str, path: str, token: str, ca_pem: bytes | None, *, method: str = "GET",
              body: dict[str, Any] | None = None, token_header: str = "Job-Token") -> Any:
    """kasd's JSON answer to ``method api+path`` with ``Job-Token: token`` (``token_header``:
    ``PRIVATE-TOKEN`` for a personal token) (and ``body`` as JSON); ``RestError`` with kasd's own
    message when it refuses, or saying why it could not be reached."""
    headers = {token_header: token, "Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(f"{api}{path}", data=data, method=method, headers=headers)
    try:
        with opener(ca_pem).open(request, timeout=TIMEOUT) as response:
            return json.loads(response.read(MAX_ANSWER))
    except urllib.error.HTTPError as exc:
        _refused(api, exc)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RestError(f"cannot reach kasd's REST API at {api}: {reason}") from None


def rest_events(api: str, path: str, token: str, ca_pem: bytes | None, *, read_timeout: float,
                token_header: str = "PRIVATE-TOKEN") -> Iterator[tuple[str, str]]:
    """The server-sent events of ``GET api+path``: (event, data) as each comes; ends when kasd ends
    the stream. A read waits at most ``read_timeout`` seconds (kasd sends a comment every 15 s):
    ``RestError`` then. No redirect is followed."""
    request = urllib.request.Request(f"{api}{path}", method="GET",
                                     headers={token_header: token, "Accept": "text/event-stream"})
    try:
        with opener(ca_pem).open(request, timeout=read_timeout) as response:
            event, data = "message", list[str]()
            while True:
                line = response.readline(MAX_ANSWER)
                if not line:
                    return
                text = line.decode("utf-8", "replace").rstrip("\r\n")
                if not text:
                    if data:
                        yield event, "\n".join(data)
                    event, data = "message", list[str]()
                elif text.startswith("event:"):
                    event = text[6:].strip()
                elif text.startswith("data:"):
                    data.append(text[5:].removeprefix(" "))
    except urllib.error.HTTPError as exc:
        _refused(api, exc)
    except TimeoutError:
        raise RestError(f"kasd's event stream at {api} was silent for {read_timeout:g} s") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RestError(f"cannot reach kasd's REST API at {api}: {reason}") from None


def rest_answer(api: str, path: str, token: str, ca_pem: bytes | None, *, token_header: str = "PRIVATE-TOKEN",
                max_bytes: int = MAX_ANSWER) -> tuple[int, bytes]:
    """The status and body (at most ``max_bytes``: beyond, ``RestError``) of ``GET api+path``,
    whatever the status: for an answer whose errors are not kasd's (a service's through the
    tunnel: Prometheus's ``{"error": …}``, agentd's ``Status``), which the caller reads itself."""
    request = urllib.request.Request(f"{api}{path}", method="GET", headers={token_header: token,
                                                                            "Accept": "application/json"})
    try:
        try:
            with opener(ca_pem).open(request, timeout=TIMEOUT) as response:
                status, body = response.status, response.read(max_bytes + 1)
        except urllib.error.HTTPError as exc:
            if _is_proxy_port(exc.code, exc.headers, None):
                raise RestError(_PROXY_PORT.format(api=api)) from None
            status, body = exc.code, exc.read(max_bytes + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RestError(f"cannot reach kasd's REST API at {api}: {reason}") from None
    if len(body) > max_bytes:
        raise RestError(f"the answer is larger than {max_bytes} bytes; ask for fewer points")
    return status, body


_PROXY_PORT = ("{api} looks like kasd's Kubernetes API proxy port (it answered 401 with a Kubernetes Status); "
               "--api-url wants the REST API port (listeners.api)")


def _is_proxy_port(status: int, headers: Message | None, body: object) -> bool:
    """Whether a refusal is kasd's Kubernetes API proxy port's (``kasd/k8sproxy``): a 401 with its
    challenge (``Bearer realm="kasd"``) or a Kubernetes ``Status`` body, neither of which kasd's
    REST API sends (its errors are GitLab's ``{"message": …}``)."""
    if status != 401:
        return False
    challenge = " ".join(headers.get_all("www-authenticate") or []) if headers is not None else ""
    if 'realm="kasd"' in challenge:
        return True
    return isinstance(body, dict) and body.get("kind") == "Status" and body.get("apiVersion") == "v1"


def _refused(api: str, exc: urllib.error.HTTPError) -> NoReturn:
    try:
        answer = json.loads(exc.read(64 * 1024))
    except (ValueError, OSError):
        answer = None
    if _is_proxy_port(exc.code, exc.headers, answer):
        raise RestError(_PROXY_PORT.format(api=api)) from None
    message = answer.get("message", "") if isinstance(answer, dict) else ""
    raise RestError(f"kasd refused ({exc.code}): {shown(str(message)[:500] or exc.reason)}") from None


__all__ = ["RestError", "describe_location", "opener", "rest_answer", "rest_call", "rest_events", "rest_json"]
