"""How one HTTP exchange rides one logical stream (kasd opens it, agentd answers). Sans-I/O.

OPEN metadata carries the request head (already stripped of the client's credentials and hop-by-hop
headers) plus who to impersonate and a request id; the request body follows as DATA, then
HALF_CLOSE. agentd answers ACCEPT with the response head; the body follows as DATA. A ``101``
answer turns the stream into a raw byte pipe both ways (exec, attach, port-forward over WebSocket or
SPDY). agentd REFUSEs with one of the application codes below when it cannot reach the cluster.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote

import attrs

from tunnelhttp.kinds import KIND_K8S_API
from tunnelhttp.requestid import received_request_id
from wire import codec
from wire.errors import ErrorCode, RemoteProtocolError, UnsendableFrameError
from wire.frames import Metadata, Open
from wire.settings import Limits

#: version of this convention, inside the stream metadata
HTTP_TUNNEL_VERSION = 1

#: the limits an OPEN must fit: the decoder's defaults, which both daemons enforce (limits are not
#: exchanged, so a sender holds itself to the ones it enforces)
TUNNEL_LIMITS = Limits()

Headers = tuple[tuple[str, str], ...]

# RFC 9110 §7.6.1 connection-specific headers, plus the proxy ones; never forwarded.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


class TunnelCode(enum.IntEnum):
    """Application error codes (0x100 and up) in REFUSE/RESET frames of HTTP streams."""

    #: agentd could not connect to (or lost) the Kubernetes API server → kasd answers 502
    UPSTREAM_UNREACHABLE = 0x101
    #: the OPEN metadata was not a valid request head → 400
    BAD_REQUEST = 0x102
    #: agentd has no handler for the requested kind → 404
    UNKNOWN_TARGET = 0x103
    #: the client went away; the other side should stop work on this stream
    CLIENT_GONE = 0x104


class HeadOverLimitError(UnsendableFrameError):
    """A request head the tunnel cannot carry: one string, or the number of headers, or the whole
    OPEN frame over ``TUNNEL_LIMITS``. Nothing was sent, and no session could carry it, so it is
    answered, not retried: ``status`` is 414 for the target, 431 for the headers or the head as a
    whole; ``limit`` names the limit (``target``, ``header``, ``headers``, ``head``)."""

    status: int

    def __init__(self, message: str, *, status: int, limit: str) -> None:
        super().__init__(message, ErrorCode.FRAME_SIZE_ERROR, status=status)
        self.limit = limit


@attrs.frozen(kw_only=True)
class Impersonation:
    user: str
    groups: tuple[str, ...] = ()
    uid: str | None = None
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def headers(self) -> Headers:
        """The ``Impersonate-*`` headers agentd adds to the upstream request."""
        # Loops, not comprehensions: each comprehension is a Python call, and this runs per request.
        out: list[tuple[str, str]] = [("impersonate-user", self.user)]
        for g in self.groups:
            out.append(("impersonate-group", g))
        if self.uid:
            out.append(("impersonate-uid", self.uid))
        for key, values in self.extra:
            name = f"impersonate-extra-{_percent_encode(key)}"
            for v in values:
                out.append((name, v))
        return tuple(out)

    def bounds(self) -> tuple[int, int, int, int]:
        """Characters in all its strings; strings and containers in all; the longest string; the
        largest container: enough to tell whether an OPEN carrying it could come near a limit."""
        strings = [self.user, self.uid or "", *self.groups]
        largest = max(len(self.groups), len(self.extra))
        for key, values in self.extra:  # a loop, not comprehensions: this runs on every request
            strings.append(key)
            strings += values
            if len(values) > largest:
                largest = len(values)
        return sum(map(len, strings)), len(strings) + 3 + len(self.extra), max(map(len, strings)), largest

    def to_metadata(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "groups": list(self.groups),
            "uid": self.uid,
            "extra": {k: list(v) for k, v in self.extra},
        }

    @classmethod
    def from_metadata(cls, raw: object) -> Impersonation:
        if not isinstance(raw, dict) or not isinstance(raw.get("user"), str):
            raise RemoteProtocolError("impersonate must be a map with a string 'user'")
        groups = raw.get("groups") or []
        extra = raw.get("extra") or {}
        uid = raw.get("uid")
        if not _strings(groups) or not isinstance(extra, dict) or (uid is not None and not isinstance(uid, str)):
            raise RemoteProtocolError("impersonate groups/extra/uid have the wrong types")
        pairs = []
        for key, values in sorted(extra.items()):
            if not isinstance(key, str) or not _strings(values):
                raise RemoteProtocolError("impersonate extra must map strings to lists of strings")
            pairs.append((key, tuple(values)))
        return cls(user=raw["user"], groups=tuple(groups), uid=uid, extra=tuple(pairs))


#: the answer (400) to a client's own ``Impersonate-*`` headers where the agent does not act as
#: itself: the grant's identity is fixed, a client cannot choose another
CLIENT_IMPERSONATION_REFUSED = (
    "Impersonate-* headers are not allowed here: this agent's access_as is not agent, so it already acts "
    "as a fixed identity for this request and a client cannot choose another"
)


class ImpersonationHeaderError(ValueError):
    """Client ``Impersonate-*`` headers kube-apiserver would refuse; the message says why."""


def impersonation_from_headers(headers: Sequence[tuple[str, str]]) -> Impersonation | None:
    """The identity a client's own ``Impersonate-*`` headers (names lower-case) ask for, as
    kube-apiserver reads them (``Impersonate-Extra-<key>`` keys percent-decoded); None without any.
    Groups, a uid or extras without ``Impersonate-User`` raise ``ImpersonationHeaderError``."""
    user: list[str] = []
    groups: list[str] = []
    uid: list[str] = []
    extra: dict[str, list[str]] = {}
    for name, value in headers:
        if not name.startswith("impersonate-"):
            continue
        if name == "impersonate-user":
            user.append(value)
        elif name == "impersonate-group":
            groups.append(value)
        elif name == "impersonate-uid":
            uid.append(value)
        elif name.startswith("impersonate-extra-") and len(name) > len("impersonate-extra-"):
            extra.setdefault(unquote(name[len("impersonate-extra-"):]), []).append(value)
        # any other Impersonate-* name means nothing to kube-apiserver: ignored (and dropped)
    if not (user or groups or uid or extra):
        return None
    if len(user) != 1 or not user[0]:
        asked = ", ".join(f"{len(v)} {k}" for k, v in (("groups", groups), ("uids", uid), ("extras", extra)) if v)
        raise ImpersonationHeaderError(
            "requested " + (asked or "impersonation") + " without impersonating exactly one user"
            if len(user) != 1 else "Impersonate-User is empty")
    if len(uid) > 1:
        raise ImpersonationHeaderError("more than one Impersonate-Uid")
    return Impersonation(user=user[0], groups=tuple(groups), uid=uid[0] if uid else None,
                         extra=tuple((k, tuple(v)) for k, v in sorted(extra.items())))


_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-!#$&'*+.^_`|~")


@functools.lru_cache(maxsize=256)
def _percent_encode(key: str) -> str:
    # Kubernetes requires extra keys to be percent-encoded in the header name (legal token chars).
    # Cached: a grant's extra keys are the same few on every request (agent.gitlab.com/…), and this
    # ran ~35 Python calls per key per request in agentd; the cache is bounded.
    if _TOKEN_CHARS.issuperset(key):
        return key
    return "".join(c if c in _TOKEN_CHARS else "".join(f"%{b:02X}" for b in c.encode()) for c in key)


def _strings(values: object) -> bool:
    if not isinstance(values, list):
        return False
    for v in values:  # noqa: SIM110 (a loop, not all(generator): a generator is a Python call per item)
        if not isinstance(v, str):
            return False
    return True


@attrs.frozen(kw_only=True)
class RequestHead:
    method: str
    #: path and query exactly as the client sent them, e.g. ``/api/v1/pods?watch=1``
    target: str
    headers: Headers
    #: what the request is for on the agent side: ``k8s-api`` or ``service`` (``tunnelhttp.kinds``)
    kind: str = KIND_K8S_API
    impersonate: Impersonation | None = None
    request_id: str = ""
    #: for kind ``service``: the name of the in-cluster service in agentd's allow-list
    service: str | None = None

    @property
    def wants_upgrade(self) -> bool:
        for name, _ in self.headers:  # noqa: SIM110 (not any(generator): a Python call per header)
            if name == "upgrade":
                return True
        return False

    def to_metadata(self, limits: Limits = TUNNEL_LIMITS) -> Metadata:
        """The OPEN metadata; ``HeadOverLimitError`` if an OPEN carrying it would break ``limits``."""
        target, headers = self.target, self.headers
        short = limits.max_string // 4  # a character is at most 4 bytes of UTF-8
        if len(target) > short and (size := _utf8_size(target)) > limits.max_string:
            raise HeadOverLimitError(
                f"request target is {size} bytes, over the tunnel's limit of {limits.max_string} bytes"
                " for a path and query", status=414, limit="target")
        if len(headers) > limits.max_array_items:
            raise HeadOverLimitError(
                f"request has {len(headers)} headers to forward, over the tunnel's limit of"
                f" {limits.max_array_items} headers", status=431, limit="headers")
        pairs = []
        chars = len(target) + len(self.method) + len(self.kind) + len(self.request_id) + len(self.service or "")
        for name, value in headers:
            if len(value) > short or len(name) > short:
                _check_header(name, value, limits)
            chars += len(name) + len(value)
            pairs.append([name, value])
        metadata: Metadata = {
            "v": HTTP_TUNNEL_VERSION,
            "kind": self.kind,
            "method": self.method,
            "target": target,
            "headers": pairs,
            "impersonate": self.impersonate.to_metadata() if self.impersonate else None,
            "request_id": self.request_id,
        }
        if self.service is not None:
            metadata["service"] = self.service
        # Most heads are far from every limit even at 4 bytes a character and generous framing
        # (at most 12 bytes a string or container, 256 for the keys). One that may come near one —
        # long, or with a long method or request id, or a large impersonation (kasd's own
        # configuration) — is measured as the session will measure it.
        items, longest, largest = len(headers), max(len(self.method), len(self.kind), len(self.request_id),
                                                    len(self.service or "")), 0
        if self.impersonate is not None:
            more_chars, more_items, longest_there, largest = self.impersonate.bounds()
            chars, items, longest = chars + more_chars, items + more_items, max(longest, longest_there)
        if (4 * chars + 12 * items + 256 > limits.max_control_frame or longest > short
                or largest > min(limits.max_array_items, limits.max_map_entries)):
            _check_frame(metadata, limits)
        return metadata

    @classmethod
    def from_metadata(cls, raw: Metadata) -> RequestHead:
        if raw.get("v") != HTTP_TUNNEL_VERSION:
            raise RemoteProtocolError(f"unsupported HTTP tunnel version {raw.get('v')!r}")
        method, target, kind = raw.get("method"), raw.get("target"), raw.get("kind", KIND_K8S_API)
        if not (isinstance(method, str) and method.isalpha() and method.isupper()):
            raise RemoteProtocolError("method must be an upper-case token")
        if not (isinstance(target, str) and target.startswith("/")):
            raise RemoteProtocolError("target must be an origin-form path")
        if not isinstance(kind, str):
            raise RemoteProtocolError("kind must be a string")
        service = raw.get("service")
        if service is not None and not (isinstance(service, str) and service):
            raise RemoteProtocolError("service must be a non-empty string")
        imp = raw.get("impersonate")
        return cls(
            method=method,
            target=target,
            headers=parse_headers(raw.get("headers")),
            kind=kind,
            impersonate=None if imp is None else Impersonation.from_metadata(imp),
            request_id=received_request_id(raw.get("request_id")),  # an unsafe one: none
            service=service,
        )


def _check_header(name: str, value: str, limits: Limits) -> None:
    for text in (name, value):
        if (size := _utf8_size(text)) > limits.max_string:
            raise HeadOverLimitError(
                f"request header {name[:100]!r} is {size} bytes, over the tunnel's limit of {limits.max_string}"
                " bytes for a header", status=431, limit="header")


def _utf8_size(text: str) -> int:
    # A lone surrogate cannot be sent either; the frame check says so. Here it only counts.
    return len(text.encode("utf-8", "surrogatepass"))


def _check_frame(metadata: Metadata, limits: Limits) -> None:
    try:
        codec.encode_checked(Open(stream_id=codec.MAX_STREAM_ID, metadata=metadata), limits)
    except UnsendableFrameError as exc:
        raise HeadOverLimitError(f"request head does not fit the tunnel: {exc.message}", status=431,
                                 limit="head") from None


@attrs.frozen(kw_only=True)
class ResponseHead:
    status: int
    headers: Headers

    def to_metadata(self) -> Metadata:
        return {"status": self.status, "headers": [list(h) for h in self.headers]}

    @classmethod
    def from_metadata(cls, raw: Metadata) -> ResponseHead:
        status = raw.get("status")
        if not isinstance(status, int) or not 100 <= status <= 599:
            raise RemoteProtocolError(f"bad response status {status!r}")
        return cls(status=status, headers=parse_headers(raw.get("headers")))


def parse_headers(raw: object) -> Headers:
    if not isinstance(raw, list):
        raise RemoteProtocolError("headers must be a list of [name, value] pairs")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2):
            raise RemoteProtocolError("each header must be a [name, value] pair of strings")
        name, value = item
        if not (isinstance(name, str) and isinstance(value, str)):
            raise RemoteProtocolError("each header must be a [name, value] pair of strings")
        if not name or "\n" in value or "\r" in value or "\n" in name or ":" in name.lstrip(":"):
            raise RemoteProtocolError(f"invalid header {name!r}")
        out.append((name.lower(), value))
    return tuple(out)


def strip_hop_by_hop(headers: Iterable[tuple[str, str]], *, keep_upgrade: bool = False) -> Headers:
    """Drop hop-by-hop headers, and any header the ``Connection`` header names.

    With ``keep_upgrade``, ``Connection: Upgrade`` and ``Upgrade`` survive so an upgrade request
    (exec/attach/port-forward) can be re-issued upstream.
    """
    items = [(k.lower(), v) for k, v in headers]
    if HOP_BY_HOP.isdisjoint(dict(items)):
        return tuple(items)  # the common case: nothing hop-by-hop, and no Connection to name any
    named = {t.strip().lower() for k, v in items if k == "connection" for t in v.split(",") if t.strip()}
    upgrade = keep_upgrade and "upgrade" in named and any(k == "upgrade" for k, _ in items)
    out = [(k, v) for k, v in items if k not in HOP_BY_HOP and k not in named]
    if upgrade:
        out += [("connection", "Upgrade")] + [(k, v) for k, v in items if k == "upgrade"]
    return tuple(out)

