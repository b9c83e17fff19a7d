"""Which requests ``kasctl proxy`` passes on with the user's token: ``kubectl proxy``'s filter, plus Origin.

Anyone whose request reaches the proxy acts with the token, and a web page in the user's browser
can send requests to 127.0.0.1 — directly (cross-site) or, after DNS rebinding, under a name of its
own whose address turns into 127.0.0.1 (the page is then "same-origin" with the proxy as far as the
browser knows, so it can read the answers). Neither can forge what the browser writes in ``Host``
(the name in the page's URL) and ``Origin`` (the page's origin), so each request is checked on them
before anything is forwarded:

- ``Host`` (without its port; an IPv6 address keeps its brackets, ``[::1]``) must match one of
  ``--accept-hosts``: comma-separated regular expressions, each searched (not anchored: anchor with
  ``^…$``) as ``kubectl proxy``'s ``--accept-hosts`` are, default ``^localhost$,^127\\.0\\.0\\.1$,^\\[::1\\]$``.
  A request without exactly one Host, or with a Host that is not ``name[:port]``, is refused.
- ``Origin``, when present (a browser sends it on cross-site requests, on every WebSocket handshake
  and on same-site POSTs), must be this proxy's own origin: ``http://`` + an accepted host + the
  port of ``Host``. ``Origin: null`` (sandboxed frames, ``file:``) is refused. ``kubectl proxy`` does
  not look at Origin; kasctl does, because its port also serves exec and port-forward over WebSocket,
  which browsers let any page open.
- the method must not match any of ``--reject-methods`` (default ``^$``: none), as in ``kubectl proxy``.
- the request target must be a path (``/…``): an absolute URI (``GET http://other/``) or
  ``CONNECT host:port`` would name a host of its own.

Departures from ``kubectl proxy``, on purpose: hosts are compared lower-cased; ``[::1]:8001`` is
checked as ``[::1]`` (kubectl's Go ``net.SplitHostPort`` strips the brackets, so its own default
refuses ``[::1]`` with a port); there is no ``--accept-paths``/``--reject-paths`` (kubectl's default
refuses exec and attach, which kasctl proxy exists to carry); and the expressions are Python's ``re``
(they are the user's own; the Host they are run against is at most 255 characters).

Sans-I/O: ``RequestFilter.refusal(request)`` says why a request is refused, or None.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import attrs

import http11

DEFAULT_ACCEPT_HOSTS = r"^localhost$,^127\.0\.0\.1$,^\[::1\]$"
DEFAULT_REJECT_METHODS = "^$"
#: a DNS name is at most 253 characters; with a port and brackets this is plenty
MAX_HOST = 255

_HOST = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%!$&'()*+;=-]*)(?::(?P<port>[0-9]{1,5}))?")


class FilterError(ValueError):
    """A bad ``--accept-hosts`` or ``--reject-methods``: the message names the flag and the expression."""


def compile_list(text: str, flag: str) -> tuple[re.Pattern[str], ...]:
    """``kubectl proxy``'s list form: comma-separated regular expressions ("" is none)."""
    if text == "":
        return ()
    patterns = []
    for part in text.split(","):
        try:
            patterns.append(re.compile(part))
        except re.error as exc:
            raise FilterError(f"{flag}: {part!r} is not a regular expression: {exc}") from None
    return tuple(patterns)


def split_host(value: str) -> tuple[str, int | None] | None:
    """``Host``'s host (lower-cased; IPv6 in brackets) and port, or None when it is not ``host[:port]``."""
    if len(value) > MAX_HOST:
        return None
    found = _HOST.fullmatch(value.strip(" \t"))
    if found is None or not found["host"]:
        return None
    port = found["port"]
    if port is not None and int(port) > 65535:
        return None
    return found["host"].lower(), int(port) if port is not None else None


@attrs.frozen(kw_only=True)
class RequestFilter:
    accept_hosts: tuple[re.Pattern[str], ...]
    reject_methods: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def from_flags(cls, accept_hosts: str = DEFAULT_ACCEPT_HOSTS,
                   reject_methods: str = DEFAULT_REJECT_METHODS) -> RequestFilter:
        return cls(accept_hosts=compile_list(accept_hosts, "--accept-hosts"),
                   reject_methods=compile_list(reject_methods, "--reject-methods"))

    def accepts_host(self, host: str) -> bool:
        return any(p.search(host) for p in self.accept_hosts)

    def refusal(self, request: http11.Request) -> str | None:
        """Why ``request`` may not go on with the token (one line, for the 403), or None."""
        hosts = [v for k, v in request.headers if k == "host"]
        origins = [v for k, v in request.headers if k == "origin"]
        if len(hosts) != 1:
            return "a request needs exactly one Host header"
        parsed = split_host(hosts[0])
        if parsed is None:
            return f"Host {_quote(hosts[0])} is not host[:port]"
        host, port = parsed
        if not self.accepts_host(host):
            return (f"Host {_quote(host)} is not accepted (--accept-hosts); a web page reaching this port "
                    "under another name (DNS rebinding) would act with your token")
        if any(p.search(request.method) for p in self.reject_methods):
            return f"method {_quote(request.method)} is refused (--reject-methods)"
        if not request.target.startswith("/"):
            return "the request target must be a path (/...), not an absolute URI or CONNECT"
        if len(origins) > 1:
            return "more than one Origin header"
        if origins and not self._own_origin(origins[0], port):
            return (f"Origin {_quote(origins[0])} is not this proxy (http://{host}:{port or 80}): a web page "
                    "of another site would act with your token")
        return None

    def _own_origin(self, origin: str, port: int | None) -> bool:
        try:
            parts = urlsplit(origin.strip(" \t"))
            origin_port = parts.port
        except ValueError:
            return False
        if parts.scheme.lower() != "http" or parts.path or parts.query or parts.fragment or "@" in parts.netloc:
            return False
        parsed = split_host(parts.netloc)
        if parsed is None:
            return False
        return self.accepts_host(parsed[0]) and (origin_port or 80) == (port or 80)


def _quote(value: str) -> str:
    """A client's value in a message: short and printable."""
    return repr(value[:100] + ("…" if len(value) > 100 else ""))


__all__ = ["DEFAULT_ACCEPT_HOSTS", "DEFAULT_REJECT_METHODS", "FilterError", "RequestFilter", "compile_list",
           "split_host"]
