"""A pod's I/O: `pods/log` as a streamed text response and `pods/exec`/`pods/attach` routed to
the WebSocket handlers (exec_ws), after the checks the kubelet makes (container exists, started).
"""

from __future__ import annotations

import time
from typing import Any

from kubesim import errors, exec_ws, portforward_session, streaming
from kubesim.asgi import Query, Receive, Scope, Send, flag, one, pump, start_stream
from kubesim.console import ContainerConsole
from kubesim.controllers import Controllers
from kubesim.paths import Target
from kubesim.processes import container_env
from kubesim.store import Store


def pick_container(store: Store, target: Target, wanted: str | None) -> tuple[dict[str, Any], str]:
    """The pod and the container a request means (the only one, or the default-container)."""
    pod = store.get(target.kind, target.namespace, target.name or "")
    containers = [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []]
    if wanted:
        init = [c.get("name", "") for c in (pod.get("spec") or {}).get("initContainers") or []]
        if wanted not in containers and wanted not in init:
            raise errors.bad_request(f"container {wanted} is not valid for pod {target.name}")
        return pod, wanted
    if len(containers) == 1:
        return pod, containers[0]
    default = ((pod.get("metadata") or {}).get("annotations") or {}).get("kubectl.kubernetes.io/default-container")
    if isinstance(default, str) and default in containers:
        return pod, default
    raise errors.bad_request(
        f"a container name must be specified for pod {target.name}, choose one of: [{' '.join(containers)}]")


def _waiting_reason(pod: dict[str, Any], container: str) -> str:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason"):
                return str(waiting["reason"])
    return "ContainerCreating"


def _container_status(pod: dict[str, Any], container: str) -> dict[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return dict(status)
    return {}


def running_console(store: Store, controllers: Controllers, target: Target,
                    wanted: str | None) -> tuple[dict[str, Any], str, ContainerConsole]:
    pod, container = pick_container(store, target, wanted)
    console = controllers.console(target.namespace or "", target.name or "", container)
    if console is None:
        raise errors.bad_request(
            f'container "{container}" in pod "{target.name}" is waiting to start: '
            f"{_waiting_reason(pod, container)}")
    return pod, container, console


def check_streamable(store: Store, controllers: Controllers, target: Target, query: Query) -> None:
    """The kubelet's checks before exec/attach: the container exists and is running now."""
    pod, container, _ = running_console(store, controllers, target, one(query, "container"))
    state = _container_status(pod, container).get("state") or {}
    if "running" not in state:
        raise errors.bad_request(f'container not found ("{container}")')


def _int(text: str | None, *, signed: bool = False) -> int | None:
    if not text:
        return None
    digits = text.lstrip("-") if signed else text
    return int(text) if digits.isdigit() else None


async def serve_logs(store: Store, controllers: Controllers, target: Target, query: Query,
                     receive: Receive, send: Send) -> None:
    pod, container, console = running_console(store, controllers, target, one(query, "container"))
    if flag(query, "previous"):
        if not _container_status(pod, container).get("restartCount"):
            raise errors.bad_request(
                f'previous terminated container "{container}" in pod "{target.name}" not found')
        # The run before this one, when the container runs a command (the crash-loop knob's
        # container has one console for all its runs).
        console = controllers.previous_console(target.namespace or "", target.name or "", container) or console
    since = _int(one(query, "sinceSeconds"))
    stream = console.stream_logs(
        follow=flag(query, "follow"),
        tail_lines=_int(one(query, "tailLines"), signed=True),
        timestamps=flag(query, "timestamps"),
        since_time_ns=None if since is None else time.time_ns() - since * 1_000_000_000,
        limit_bytes=_int(one(query, "limitBytes")))
    await start_stream(send, "text/plain")
    await pump(stream, receive, send)


async def serve_pod_websocket(store: Store, controllers: Controllers, target: Target, query: Query,
                              scope: Scope, receive: Receive, send: Send) -> None:
    streams = {name: flag(query, name) for name in ("stdin", "stdout", "stderr", "tty")}
    if target.subresource in ("exec", "attach"):
        check_streamable(store, controllers, target, query)
    if target.subresource == "exec":
        command = query.get("command") or []
        if not command:
            raise errors.bad_request("you must specify at least 1 command")
        pod, container, _ = running_console(store, controllers, target, one(query, "container"))
        with controllers.network.commands_in(pod):  # what it runs listens in the pod (`httpd`)
            await exec_ws.serve_exec(scope, receive, send, command=command,
                                     env=container_env(pod, container),
                                     fs=controllers.filesystem(target.namespace or "", target.name or "",
                                                               container),
                                     **streams)
        return
    if target.subresource == "attach":
        _, _, console = running_console(store, controllers, target, one(query, "container"))
        await exec_ws.serve_attach(scope, receive, send, console=console, **streams)
        return
    if target.subresource == "portforward":
        await _serve_port_forward_websocket(store, controllers, target, query, scope, receive, send)
        return
    raise errors.bad_request(f"{target.subresource} over WebSocket is not supported by kubesim")


#: kubectl's WebSocket port-forward: SPDY inside the WebSocket (client-go's tunneling dialer).
PORT_FORWARD_TUNNEL = "SPDY/3.1+portforward.k8s.io"


async def _serve_port_forward_websocket(store: Store, controllers: Controllers, target: Target, query: Query,
                                        scope: Scope, receive: Receive, send: Send) -> None:
    """The API server's stream tunnel (k8s.io/apiserver pkg/util/proxy/streamtunnel.go): a
    WebSocket offering `SPDY/3.1+portforward.k8s.io` is accepted with it and carries the SPDY
    session the kubelet speaks. Other WebSocket port-forward protocols (the kubelet's own
    `portforward.k8s.io`/`v4.channel.k8s.io` channels) are refused: kubectl never uses them."""
    if PORT_FORWARD_TUNNEL not in list(scope.get("subprotocols") or []):
        raise errors.bad_request(f"port-forward over WebSocket needs the subprotocol {PORT_FORWARD_TUNNEL} "
                                 "(kubesim serves kubectl's tunnelled SPDY only)")
    message = await receive()
    if message.get("type") != "websocket.connect":
        return
    request = streaming.PodStreamRequest(store=store, controllers=controllers, target=target, query=query,
                                         protocol=portforward_session.PORT_FORWARD.protocols[0])
    await streaming.serve_websocket_spdy(portforward_session.PORT_FORWARD, request, PORT_FORWARD_TUNNEL,
                                         receive, send)


def spdy_refused(subresource: str) -> errors.ApiError:
    """The answer to an ``Upgrade: SPDY/3.1`` request for exec, attach or portforward when kubesim
    serves no raw SPDY (``KUBESIM_SPDY=0``, hyperraw's switch).

    kubectl tries SPDY when told to (``KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false``,
    ``KUBECTL_PORT_FORWARD_WEBSOCKETS=false``) or when its WebSocket attempt was refused, and
    then shows only the SPDY answer: a Status whose message it prints (``error upgrading
    connection: <message>``), so it says plainly what kubesim supports. Port-forward's WebSocket
    (SPDY tunnelled in WebSocket messages) needs no raw upgrade and works either way.
    """
    if subresource == "portforward":
        return errors.bad_request(
            "kubesim does not support SPDY: port-forward works over WebSocket only, kubectl's "
            "default since 1.31 (do not set KUBECTL_PORT_FORWARD_WEBSOCKETS=false)")
    return errors.bad_request(
        f"kubesim does not support SPDY: {subresource} works over WebSocket only, kubectl's "
        "default since 1.30 (do not set KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false)")
