"""Running kubesim: hypercorn on Trio, the controllers beside it, and a handle for tests.

    async with open_kubesim(token="t") as sim:
        sim.write_kubeconfig(path)
        ...

or, owning the nursery: `sim = await nursery.start(functools.partial(serve_kubesim, token="t"))`.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from kubesim import hyperraw
from kubesim.app import KubeApp, ServerVersion
from kubesim.console import ContainerConsole
from kubesim.controllers import Controllers
from kubesim.requests import RecordedRequest
from kubesim.store import Store
from kubesim.timefmt import Clock, install


class _Config(Config):
    """A hypercorn config that serves TLS from a ready-made SSLContext."""

    def __init__(self, tls: ssl.SSLContext | None) -> None:
        super().__init__()
        self._tls = tls

    @property
    def ssl_enabled(self) -> bool:
        return self._tls is not None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        if self._tls is not None:
            self._tls.set_alpn_protocols(self.alpn_protocols)
        return self._tls


@attrs.define(kw_only=True, eq=False)
class KubeSim:
    """A running kubesim: where it listens and what it holds."""

    url: str
    port: int
    host: str
    token: str | None
    tls: bool
    store: Store
    controllers: Controllers
    requests: list[RecordedRequest]
    ca_pem: bytes | None = None
    clock: Clock = attrs.field(factory=Clock)
    _shutdown: trio.Event = attrs.field(factory=trio.Event)

    def advance_clock(self, seconds: float) -> None:
        """Let `seconds` pass on the server's clock (timestamps, ages, CronJob schedules) and
        reconcile at once, so what was due by then (a CronJob's next run) has happened. Call it
        in the server's Trio thread."""
        self.clock.advance(seconds)
        self.controllers.reconcile()
        self.controllers.poke()  # the loop's next wake-up (a schedule's next time) moved closer

    def console(self, namespace: str, pod: str, container: str) -> ContainerConsole | None:
        return self.controllers.console(namespace, pod, container)

    def stop(self) -> None:
        """Ask the server to shut down gracefully."""
        self._shutdown.set()

    def kubeconfig(self, *, token: str | None = None, namespace: str = "default") -> dict[str, Any]:
        cluster: dict[str, Any] = {"server": self.url}
        if self.tls:
            if self.ca_pem is not None:
                import base64

                cluster["certificate-authority-data"] = base64.b64encode(self.ca_pem).decode()
            else:
                cluster["insecure-skip-tls-verify"] = True
        user: dict[str, Any] = {}
        chosen = token if token is not None else self.token
        if chosen is not None:
            user["token"] = chosen
        return {
            "apiVersion": "v1", "kind": "Config", "current-context": "kubesim",
            "clusters": [{"name": "kubesim", "cluster": cluster}],
            "users": [{"name": "kubesim", "user": user}],
            "contexts": [{"name": "kubesim", "context": {"cluster": "kubesim", "user": "kubesim",
                                                         "namespace": namespace}}],
            "preferences": {},
        }

    def write_kubeconfig(self, path: str | Path, *, token: str | None = None,
                         namespace: str = "default") -> Path:
        """Write a kubeconfig (JSON, which kubectl reads as YAML) pointing at this server."""
        target = Path(path)
        target.write_text(json.dumps(self.kubeconfig(token=token, namespace=namespace), indent=2))
        target.chmod(0o600)
        return target


async def serve_kubesim(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None,
    tls: ssl.SSLContext | None = None,
    ca_pem: bytes | None = None,
    store: Store | None = None,
    version: ServerVersion | None = None,
    bookmark_interval: float = 10.0,
    controller_tick: float = 0.5,
    restart_backoff: tuple[float, float] = (10.0, 300.0),
    on_request: Callable[[RecordedRequest], None] | None = None,
    clock: Clock | None = None,
    spdy: bool | None = None,
    port_forward_websocket: bool = True,
    objects: Sequence[dict[str, Any]] = (),
    task_status: trio.TaskStatus[KubeSim] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled (or `KubeSim.stop()`); `task_status.started(sim)` once listening.

    `clock` (default: a fresh `Clock`) is the time the server's timestamps and controllers read.
    `spdy`: serve kubectl's `Upgrade: SPDY/3.1` (exec, attach) through `hyperraw`; None reads
    the switch `KUBESIM_SPDY` (on unless `0`). Off, SPDY upgrades get a 400 saying so.
    `port_forward_websocket=False` answers kubectl's WebSocket port-forward as an API server
    without the tunnel (before PortForwardWebsockets, 1.30) does, so kubectl falls back to SPDY.
    `objects`: manifests created before the server listens (RBAC bindings, namespaces, ...), as a
    cluster's add-on manifests are.
    """
    clock = clock or Clock()
    install(clock)  # this task's context: the HTTP side and the controllers started below
    if spdy is None:
        spdy = hyperraw.enabled_by_environment()
    store = store or Store()
    store.create_objects(objects)
    controllers = Controllers(store, tick=controller_tick, root_ca=ca_pem,
                              restart_backoff=restart_backoff, clock=clock)
    requests: list[RecordedRequest] = []
    config = _Config(tls)
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 2.0
    config.keep_alive_timeout = 75.0
    config.h2_max_concurrent_streams = 250
    app = KubeApp(store, controllers, token=token, requests=requests,
                  version=version, bookmark_interval=bookmark_interval, on_request=on_request,
                  port_forward_websocket=port_forward_websocket)
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(controllers.run)
        binds = await nursery.start(_serve, app, config, shutdown, spdy)
        bound = binds[0]
        scheme, _, address = bound.partition("://")
        bound_port = int(address.rsplit(":", 1)[1])
        url_host = host if host not in ("0.0.0.0", "::") else "127.0.0.1"
        if ":" in url_host:
            url_host = f"[{url_host}]"
        app.server_address = f"{url_host}:{bound_port}"
        sim = KubeSim(url=f"{scheme}://{url_host}:{bound_port}", port=bound_port, host=url_host,
                      token=token, tls=tls is not None, store=store, controllers=controllers,
                      requests=requests, ca_pem=ca_pem, clock=clock, shutdown=shutdown)
        task_status.started(sim)
        await shutdown.wait()
        nursery.cancel_scope.cancel()


async def _serve(app: KubeApp, config: Config, shutdown: trio.Event, spdy: bool, *,
                 task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    if spdy:
        await hyperraw.serve(app, config, shutdown_trigger=shutdown.wait, task_status=task_status)
    else:
        await serve(app, config, shutdown_trigger=shutdown.wait, task_status=task_status)  # type: ignore[arg-type]


@asynccontextmanager
async def open_kubesim(**kwargs: Any) -> AsyncIterator[KubeSim]:
    """`async with open_kubesim(token=...) as sim:` — the server lives for the block."""
    async with trio.open_nursery() as nursery:
        sim: KubeSim = await nursery.start(_serve_kwargs, kwargs)
        try:
            yield sim
        finally:
            nursery.cancel_scope.cancel()


async def _serve_kwargs(kwargs: dict[str, Any], *,
                        task_status: trio.TaskStatus[KubeSim] = trio.TASK_STATUS_IGNORED) -> None:
    await serve_kubesim(**kwargs, task_status=task_status)
