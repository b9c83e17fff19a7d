"""How agentd reaches the Kubernetes API server: in-cluster (service account) or a kubeconfig.

Both give a ``KubeTarget``: where the server is, the TLS context that trusts it (and carries a client
certificate when that is the credential), and a bearer token source. Service-account tokens are
projected and rotate, so a file-backed token is re-read every ``refresh`` seconds.
"""

from __future__ import annotations

import base64
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs

from agentd.upstream import host_header, target_url
from daemonkit import yamldoc
from wire.ids import InvalidNumber, parse_decimal

log = logging.getLogger("agentd.kubeapi")

TOKEN_REFRESH = 60.0


class KubeConfigError(Exception):
    """The API server cannot be reached as configured; the message says what to fix."""


class TokenSource:
    """A bearer token: fixed, or read from a file and re-read at most every ``refresh`` seconds."""

    def __init__(self, *, value: str | None = None, path: Path | None = None, refresh: float = TOKEN_REFRESH,
                 clock: Any = time.monotonic) -> None:
        if (value is None) == (path is None):
            raise ValueError("give exactly one of value= and path=")
        self.path = path
        self._value = value
        self._refresh = refresh
        self._clock = clock
        self._read_at: float | None = None
        if path is not None:
            self._value = self._read()
            self._read_at = clock()

    def __repr__(self) -> str:  # never show the token
        return f"<TokenSource {'file ' + str(self.path) if self.path else 'inline'}>"

    def _read(self) -> str:
        assert self.path is not None
        try:
            token = self.path.read_text().strip()
        except OSError as exc:
            raise KubeConfigError(f"cannot read token file {self.path}: {exc.strerror or exc}") from None
        if not token:
            raise KubeConfigError(f"token file {self.path} is empty")
        return token

    def get(self) -> str:
        if self.path is not None and self._read_at is not None and self._clock() - self._read_at >= self._refresh:
            try:
                self._value = self._read()
            except KubeConfigError as exc:
                log.warning("token re-read failed, keeping the previous one error=%r", str(exc))
            self._read_at = self._clock()
        assert self._value is not None
        return self._value


@attrs.frozen(kw_only=True)
class KubeTarget:
    scheme: str
    host: str
    port: int
    #: TLS context for https (None for plain http)
    ssl_context: ssl.SSLContext | None = attrs.field(default=None, eq=False, repr=False)
    #: name to verify the server certificate against (kubeconfig ``tls-server-name``)
    server_hostname: str | None = None
    token: TokenSource | None = attrs.field(default=None, eq=False)
    #: kubeconfig server URLs may carry a path prefix (e.g. Rancher); prepended to every target
    path_prefix: str = ""
    #: where the target came from, for log lines and error messages
    source: str = ""
    namespace: str | None = None
    client_certificate: bool = False

    @property
    def url(self) -> str:
        return target_url(self.scheme, self.host, self.port, self.path_prefix)

    @property
    def host_header(self) -> str:
        return host_header(self.scheme, self.host, self.port)

    @property
    def peer(self) -> str:
        return "the API server"

    @property
    def peer_title(self) -> str:
        return "cluster API"

    def authorization(self) -> str | None:
        return f"Bearer {self.token.get()}" if self.token is not None else None


# ----------------------------------------------------------------------------- in-cluster


def in_cluster_target(directory: Path, environ: Mapping[str, str], *, refresh: float = TOKEN_REFRESH) -> KubeTarget:
    """The pod's own service account: ``token``, ``ca.crt``, ``namespace`` under ``directory``."""
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port_text = environ.get("KUBERNETES_SERVICE_PORT", "443") or "443"
    if not host:
        raise KubeConfigError(
            "in-cluster: KUBERNETES_SERVICE_HOST is not set (not running in a pod?); use --kubeconfig instead"
        )
    try:
        port = parse_decimal(port_text, "port", minimum=1, maximum=65535)
    except InvalidNumber:
        raise KubeConfigError(f"in-cluster: KUBERNETES_SERVICE_PORT is not a port: {port_text[:20]!r}") from None
    ca = directory / "ca.crt"
    token_path = directory / "token"
    if not ca.is_file():
        raise KubeConfigError(f"in-cluster: no CA certificate at {ca} (is the service account token mounted?)")
    if not token_path.is_file():
        raise KubeConfigError(f"in-cluster: no service account token at {token_path}")
    try:
        context = ssl.create_default_context(cafile=str(ca))
    except (ssl.SSLError, OSError) as exc:
        raise KubeConfigError(f"in-cluster: cannot load CA certificate {ca}: {exc}") from None
    namespace_file = directory / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else None
    return KubeTarget(
        scheme="https",
        host=host.strip("[]"),
        port=port,
        ssl_context=_http11(context),
        token=TokenSource(path=token_path, refresh=refresh),
        source=f"in-cluster service account {directory}",
        namespace=namespace,
    )


# ----------------------------------------------------------------------------- kubeconfig


def shown_url(url: str) -> str:
    """``url`` for a message: without user information (``https://user:password@host`` holds a
    credential), cut to 200 characters."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "…@" + netloc.rsplit("@", 1)[1]
    shown = f"{scheme}{sep}{netloc}{slash}{path}" if sep else ("…@" + url.rsplit("@", 1)[1] if "@" in url else url)
    return repr(shown if len(shown) <= 200 else shown[:200] + "…")


def kubeconfig_target(path: Path, *, context: str | None = None, refresh: float = TOKEN_REFRESH) -> KubeTarget:
    """The cluster and user of ``context`` (default: current-context) in the kubeconfig at ``path``."""
    try:  # the one bounded reader; its errors never quote the file (a kubeconfig holds credentials)
        raw = yamldoc.load(yamldoc.read_text(path))
    except OSError as exc:
        raise KubeConfigError(f"cannot read kubeconfig {path}: {exc.strerror or exc}") from None
    except yamldoc.YamlError as exc:
        raise KubeConfigError(f"kubeconfig {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise KubeConfigError(f"kubeconfig {path} is not a mapping")
    base = path.parent
    name = context or raw.get("current-context")
    if not name:
        raise KubeConfigError(f"kubeconfig {path} has no current-context; pass --kube-context")
    ctx = _named(raw, "contexts", "context", name, path)
    cluster = _named(raw, "clusters", "cluster", ctx.get("cluster"), path)
    user_name = ctx.get("user")
    user = _named(raw, "users", "user", user_name, path) if user_name else {}

    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise KubeConfigError(f"kubeconfig {path}: cluster {ctx.get('cluster')!r} has no server URL")
    parts = urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise KubeConfigError(f"kubeconfig {path}: server must be an http(s) URL, got {shown_url(server)}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise KubeConfigError(f"kubeconfig {path}: bad port in server URL {shown_url(server)}") from None
    if parts.username is not None or parts.password is not None:
        raise KubeConfigError(f"kubeconfig {path}: the server URL {shown_url(server)} holds user information; "
                              "basic auth is not supported (use a token)")

    for unsupported in ("exec", "auth-provider"):
        if user.get(unsupported):
            raise KubeConfigError(
                f"kubeconfig {path}: user {user_name!r} uses an {unsupported} credential plugin, which agentd "
                "does not support; use a token, tokenFile or client certificate"
            )
    if user.get("username") or user.get("password"):
        raise KubeConfigError(f"kubeconfig {path}: basic auth (username/password) is not supported; use a token")

    token: TokenSource | None = None
    if user.get("token"):
        token = TokenSource(value=str(user["token"]))
    elif user.get("tokenFile"):
        token = TokenSource(path=_resolve(base, user["tokenFile"]), refresh=refresh)

    ssl_context: ssl.SSLContext | None = None
    has_cert = bool(user.get("client-certificate") or user.get("client-certificate-data"))
    if parts.scheme == "https":
        ssl_context = _cluster_context(cluster, base, path)
        if has_cert:
            _load_client_cert(ssl_context, user, base, path)
    elif has_cert:
        raise KubeConfigError(f"kubeconfig {path}: a client certificate needs an https server, got {shown_url(server)}")

    return KubeTarget(
        scheme=parts.scheme,
        host=parts.hostname,
        port=port,
        ssl_context=ssl_context,
        server_hostname=cluster.get("tls-server-name") or None,
        token=token,
        path_prefix=parts.path.rstrip("/"),
        source=f"kubeconfig {path} context {name}",
        namespace=ctx.get("namespace"),
        client_certificate=has_cert,
    )


def _named(raw: dict[str, Any], section: str, field: str, name: Any, path: Path) -> dict[str, Any]:
    for item in raw.get(section) or []:
        if isinstance(item, dict) and item.get("name") == name:
            value = item.get(field) or {}
            if not isinstance(value, dict):
                break
            return value
    raise KubeConfigError(f"kubeconfig {path}: no {section[:-1]} named {name!r}")


def _resolve(base: Path, value: Any) -> Path:
    p = Path(str(value)).expanduser()
    return p if p.is_absolute() else base / p


def _cluster_context(cluster: dict[str, Any], base: Path, path: Path) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return _http11(context)
    try:
        if cluster.get("certificate-authority-data"):
            pem = base64.b64decode(cluster["certificate-authority-data"]).decode()
            context.load_verify_locations(cadata=pem)
        elif cluster.get("certificate-authority"):
            context.load_verify_locations(cafile=str(_resolve(base, cluster["certificate-authority"])))
    except (ssl.SSLError, OSError, ValueError, UnicodeDecodeError) as exc:
        raise KubeConfigError(f"kubeconfig {path}: cannot load the cluster CA: {exc}") from None
    return _http11(context)


def _load_client_cert(context: ssl.SSLContext, user: dict[str, Any], base: Path, path: Path) -> None:
    def pem(field: str) -> bytes:
        if user.get(f"{field}-data"):
            return base64.b64decode(user[f"{field}-data"])
        if user.get(field):
            return _resolve(base, user[field]).read_bytes()
        raise KubeConfigError(f"kubeconfig {path}: {field} is missing (a client certificate needs both cert and key)")

    try:
        cert, key = pem("client-certificate"), pem("client-key")
    except (OSError, ValueError) as exc:
        raise KubeConfigError(f"kubeconfig {path}: cannot read the client certificate or key: {exc}") from None
    # ssl only loads a certificate chain from files: write a private temp file, load, remove.
    fd, name = tempfile.mkstemp(prefix="agentd-client-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(cert.rstrip(b"\n") + b"\n" + key)
        context.load_cert_chain(name)
    except ssl.SSLError as exc:
        raise KubeConfigError(f"kubeconfig {path}: client certificate and key do not load: {exc}") from None
    finally:
        os.unlink(name)


def _http11(context: ssl.SSLContext) -> ssl.SSLContext:
    # Upgrades (exec, attach, port-forward) need HTTP/1.1, and the pool speaks only that.
    context.set_alpn_protocols(["http/1.1"])
    return context
