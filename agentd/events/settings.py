"""The ``events:`` section of agentd's configuration: what agentd does with each event kasd pushes.

    events:
      retry_for: 30
      handlers:
        - type: push                 # the event's exact type, or "*"
          webhook: {url: http://hooks.ci.svc:8080/gitlab, secret_file: /var/run/secrets/hook/secret}
        - type: push
          annotate: {apiVersion: source.toolkit.fluxcd.io/v1, kind: GitRepository,
                     namespace: flux-system, name: app}      # or match: url instead of name

Every problem is a ``Problem`` whose ``at`` names the key (``events.handlers[1].webhook.url``). A
secret file's content is read here only to check it is there; it is never kept in the settings (it is
re-read for each delivery, so a rotated secret takes effect without a restart) and never shown.
"""

from __future__ import annotations

import math
import re
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs

from daemonkit import yamldoc
from daemonkit.settings import Problem, ca_bundle

#: seconds agentd retries a failing action before answering ``failed`` (the contract's default)
DEFAULT_RETRY_FOR = 30.0
#: above an hour kasd's delivery loop would wait on one event longer than any queue should
MAX_RETRY_FOR = 3600.0
DEFAULT_ANNOTATION = "reconcile.fluxcd.io/requestedAt"
#: a handler list this long is a mistake, and each event runs every matching one
MAX_HANDLERS = 64
#: an HMAC key longer than a hash block is hashed first; a file larger than this is not a secret
MAX_SECRET_BYTES = 4096

#: kasd's rule for an event type (the REST API refuses any other), plus "*" for every type
TYPE_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_KIND = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")
_VERSION = re.compile(r"v[0-9]+((alpha|beta)[0-9]+)?")
_ANNOTATION_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


@attrs.frozen(kw_only=True)
class WebhookSettings:
    """POST the event, signed, to ``url`` (agentd's configuration alone names where it connects)."""

    url: str
    secret_file: Path
    #: a PEM bundle to trust for an https URL (default: the system's)
    ca_file: Path | None = None

    def read_secret(self) -> bytes:
        """The HMAC key: the file's content without surrounding white space (a trailing newline is
        an editor's, not the secret's). ``OSError`` or ``ValueError`` when it cannot be had."""
        with self.secret_file.open("rb") as handle:
            data = handle.read(MAX_SECRET_BYTES + 1)
        if len(data) > MAX_SECRET_BYTES:
            raise ValueError(f"secret file {self.secret_file} is over {MAX_SECRET_BYTES} bytes")
        secret = data.strip()
        if not secret:
            raise ValueError(f"secret file {self.secret_file} is empty")
        return secret

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https://"):
            return None
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        context.set_alpn_protocols(["http/1.1"])
        return context


@attrs.frozen(kw_only=True)
class AnnotateSettings:
    """Set ``annotation`` to the event's posted time on one object, or (``match: url``) on every
    object of the kind in the namespace whose ``spec.url`` is the payload's ``url``."""

    api_version: str
    kind: str
    namespace: str
    name: str | None = None
    match: str | None = None
    annotation: str = DEFAULT_ANNOTATION

    @property
    def api_prefix(self) -> str:
        """``/apis/<group>/<version>`` (``/api/v1`` for the core group)."""
        return f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"

    @property
    def shown(self) -> str:
        which = self.name if self.name is not None else "*[spec.url=payload.url]"
        return f"{self.kind} {self.namespace}/{which}"


@attrs.frozen(kw_only=True)
class EventHandlerSettings:
    type: str
    webhook: WebhookSettings | None = None
    annotate: AnnotateSettings | None = None

    def matches(self, event_type: str) -> bool:
        return self.type == "*" or self.type == event_type

    @property
    def action(self) -> str:
        return "webhook" if self.webhook is not None else "annotate"


@attrs.frozen(kw_only=True)
class EventActions:
    retry_for: float = DEFAULT_RETRY_FOR
    handlers: tuple[EventHandlerSettings, ...] = ()


# --------------------------------------------------------------------------- parsing


def parse_events(value: Any) -> EventActions:
    """``events:`` from agentd's file (a mapping); ``Problem`` naming the key on any mistake."""
    if value is None:
        return EventActions()
    if not isinstance(value, dict):
        raise Problem(f"must be a mapping with retry_for and handlers, got {yamldoc.describe(value)}")
    _only(value, ("retry_for", "handlers"), "")
    retry_for = _retry_for(value.get("retry_for", DEFAULT_RETRY_FOR))
    raw = value.get("handlers") or []
    if not isinstance(raw, list):
        raise Problem(f"must be a list of handlers, got {yamldoc.describe(raw)}", at=".handlers")
    if len(raw) > MAX_HANDLERS:
        raise Problem(f"at most {MAX_HANDLERS} handlers, got {len(raw)}", at=".handlers")
    return EventActions(retry_for=retry_for,
                        handlers=tuple(_handler(item, f".handlers[{i}]") for i, item in enumerate(raw)))


def _only(mapping: dict[Any, Any], known: tuple[str, ...], at: str) -> None:
    unknown = sorted(str(key) for key in mapping if key not in known)
    if unknown:
        raise Problem(f"unknown key(s) {', '.join(unknown)}; known keys: {', '.join(known)}", at=at)


def _retry_for(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Problem(f"expected a number of seconds, got {yamldoc.describe(value)}", at=".retry_for")
    if not 1 <= value <= MAX_RETRY_FOR:
        raise Problem(f"must be between 1 and {MAX_RETRY_FOR:g} seconds, got {value:g}", at=".retry_for")
    return float(value)


def _handler(raw: Any, at: str) -> EventHandlerSettings:
    if not isinstance(raw, dict):
        raise Problem(f"a handler is a mapping (type, and webhook or annotate), got {yamldoc.describe(raw)}", at=at)
    _only(raw, ("type", "webhook", "annotate"), at)
    event_type = raw.get("type")
    if not isinstance(event_type, str) or not (event_type == "*" or TYPE_RE.fullmatch(event_type)):
        raise Problem('must be an event type ([a-z0-9][a-z0-9._-]{0,127}) or "*"', at=f"{at}.type")
    actions = [key for key in ("webhook", "annotate") if raw.get(key) is not None]
    if len(actions) != 1:
        raise Problem("a handler needs exactly one of webhook and annotate, got "
                      + (" and ".join(actions) if actions else "neither"), at=at)
    if actions == ["webhook"]:
        return EventHandlerSettings(type=event_type, webhook=_webhook(raw["webhook"], f"{at}.webhook"))
    return EventHandlerSettings(type=event_type, annotate=_annotate(raw["annotate"], f"{at}.annotate"))


def _webhook(raw: Any, at: str) -> WebhookSettings:
    if not isinstance(raw, dict):
        raise Problem(f"must be a mapping with url and secret_file, got {yamldoc.describe(raw)}", at=at)
    _only(raw, ("url", "secret_file", "ca_file"), at)
    url = raw.get("url")
    if not isinstance(url, str) or not url:
        raise Problem("missing: the in-cluster URL to POST events to", at=f"{at}.url")
    _webhook_url(url, f"{at}.url")
    secret_file = raw.get("secret_file")
    if not isinstance(secret_file, str) or not secret_file:
        raise Problem("missing: the file holding the HMAC-SHA256 key that signs each request", at=f"{at}.secret_file")
    settings = WebhookSettings(url=url, secret_file=Path(secret_file).expanduser(),
                               ca_file=_ca_file(raw.get("ca_file"), f"{at}.ca_file"))
    try:
        settings.read_secret()
    except FileNotFoundError:
        raise Problem(f"secret file {secret_file} does not exist", at=f"{at}.secret_file") from None
    except OSError as exc:
        raise Problem(f"cannot read secret file {secret_file}: {exc.strerror or exc}", at=f"{at}.secret_file") from None
    except ValueError as exc:
        raise Problem(str(exc), at=f"{at}.secret_file") from None
    if settings.ca_file is not None and not url.startswith("https://"):
        raise Problem("a CA file is only for an https URL", at=f"{at}.ca_file")
    return settings


def _webhook_url(url: str, at: str) -> None:
    shown = repr(url[:200])
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Problem(f"must be an http:// or https:// URL with a host, got {shown}", at=at)
    if parts.username is not None or parts.password is not None:
        raise Problem("must not hold user information (it would be in log lines); the signature authenticates "
                      "agentd to the receiver", at=at)
    if parts.fragment:
        raise Problem(f"must not have a #fragment, got {shown}", at=at)
    try:
        parts.port  # noqa: B018 — raises ValueError for a bad port
    except ValueError:
        raise Problem(f"bad port in {shown}", at=at) from None
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise Problem("must not contain white space or control characters", at=at)


def _ca_file(value: Any, at: str) -> Path | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise Problem(f"expected a path, got {yamldoc.describe(value)}", at=at)
    return ca_bundle(Path(value).expanduser(), at=at)


def _annotate(raw: Any, at: str) -> AnnotateSettings:
    if not isinstance(raw, dict):
        raise Problem(f"must be a mapping with apiVersion, kind, namespace and name (or match), got "
                      f"{yamldoc.describe(raw)}", at=at)
    _only(raw, ("apiVersion", "kind", "namespace", "name", "match", "annotation"), at)
    api_version = raw.get("apiVersion")
    if not isinstance(api_version, str) or not _api_version_ok(api_version):
        raise Problem("must be <group>/<version> (e.g. source.toolkit.fluxcd.io/v1) or v1", at=f"{at}.apiVersion")
    kind = raw.get("kind")
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        raise Problem("must be a kind (e.g. GitRepository)", at=f"{at}.kind")
    namespace = raw.get("namespace")
    if not isinstance(namespace, str) or not _DNS_LABEL.fullmatch(namespace):
        raise Problem("must be a namespace name (the annotated objects' namespace)", at=f"{at}.namespace")
    name, match = raw.get("name"), raw.get("match")
    if (name is None) == (match is None):
        raise Problem("needs exactly one of name (one object) and match: url (every object whose spec.url is the "
                      "payload's url)", at=at)
    if name is not None and (not isinstance(name, str) or not _DNS_SUBDOMAIN.fullmatch(name)):
        raise Problem("must be an object name", at=f"{at}.name")
    if match is not None and match != "url":
        raise Problem(f"the only match is url, got {yamldoc.describe(match)}", at=f"{at}.match")
    annotation = raw.get("annotation", DEFAULT_ANNOTATION)
    if not isinstance(annotation, str) or not _annotation_ok(annotation):
        raise Problem("must be an annotation key ([prefix/]name, e.g. reconcile.fluxcd.io/requestedAt)",
                      at=f"{at}.annotation")
    return AnnotateSettings(api_version=api_version, kind=kind, namespace=namespace, name=name, match=match,
                            annotation=annotation)


def _api_version_ok(text: str) -> bool:
    group, slash, version = text.rpartition("/")
    if not slash:
        return text == "v1"  # the core group: only v1 exists
    return bool(_DNS_SUBDOMAIN.fullmatch(group) and _VERSION.fullmatch(version))


def _annotation_ok(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and not _DNS_SUBDOMAIN.fullmatch(prefix):
        return False
    return bool(_ANNOTATION_NAME.fullmatch(name))


__all__ = [
    "DEFAULT_ANNOTATION",
    "DEFAULT_RETRY_FOR",
    "AnnotateSettings",
    "EventActions",
    "EventHandlerSettings",
    "WebhookSettings",
    "parse_events",
]
