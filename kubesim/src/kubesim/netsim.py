"""What listens in a simulated pod: in-process connections, each pod's ports, and who answers.

A pod has one network namespace, so its ports are shared by its containers (`PodPorts`). A
connection is a pair of in-process byte streams (`socket_pair`), bounded like a socket's buffers,
that half-closes like TCP. `Network.connect` is what the kubelet's port-forward does in the pod's
namespace (containerd dials `localhost:PORT`): it finds the listener and starts its handler, or
refuses with `ConnectionRefusedError` when nothing listens.

Who listens (docs/kubesim.md, "What listens where"):

- commands that serve (`httpd -f -p PORT`, see `httpservers`) listen while they run, through the
  `PodPorts` of the pod they run in (`current_ports`, a context variable the kubelet sets for a
  container's main process);
- a running container whose image is named like `nginx` and that runs the image's own server
  (kubesim's idle main process: no command of the emulator) answers HTTP on port 80 and on every TCP
  `containerPort` it declares (`httpservers.serve_nginx`);
- every pod with a running container answers a TCP echo on port 7 (`ECHO_PORT`, the echo service of
  RFC 862), so a stream's bytes can be checked end to end.

Nothing else listens: a connection to any other port is refused.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Protocol

import attrs
import trio

from kubesim import httpservers

#: The TCP echo every running pod answers (RFC 862's port).
ECHO_PORT = 7
#: Bytes a connection holds per direction before the writer waits (a socket buffer's order).
BUFFER_LIMIT = 256 * 1024
#: Bytes an echo or relay reads at once.
CHUNK = 64 * 1024

Handler = Callable[[trio.abc.HalfCloseableStream], Awaitable[None]]


class Containers(Protocol):
    """What the network reads of the kubelet (`cluster.Cluster` is one): which containers run a
    process of their own, and each running container's filesystem, where its servers read files."""

    @property
    def processes(self) -> Mapping[tuple[str, str, str], object]:
        """The containers, by (namespace, pod, container), whose main process runs a command."""
        ...

    def filesystem(self, namespace: str, pod: str, container: str) -> httpservers.Files | None: ...


# -- in-process connections ----------------------------------------------------------------------


class _Direction:
    """One direction of a connection: a bounded buffer, the writer's EOF, the reader's close."""

    def __init__(self, limit: int) -> None:
        self.buffer = bytearray()
        self.limit = limit
        self.eof = False  # the writer sent EOF (or closed)
        self.reader_closed = False  # the reader closed: writing is a broken pipe
        self.changed = trio.Event()

    def wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


class SocketEnd(trio.abc.HalfCloseableStream):
    """One end of an in-process connection (`socket_pair`).

    `send_all` waits while the peer's buffer is full (backpressure, as a socket's send buffer);
    `send_eof` is TCP's FIN; after `aclose`, the peer's reads see EOF and its writes raise
    `trio.BrokenResourceError` (a reset).
    """

    def __init__(self, outgoing: _Direction, incoming: _Direction) -> None:
        self._out = outgoing
        self._in = incoming
        self._closed = False
        self._sending = False
        self._receiving = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this connection")
        self._sending = True
        try:
            view = memoryview(data).cast("B")
            while True:
                if self._closed:
                    raise trio.ClosedResourceError("this end is closed")
                if self._out.eof:
                    raise trio.ClosedResourceError("EOF was sent on this end")
                if self._out.reader_closed:
                    raise trio.BrokenResourceError("the peer closed the connection")
                room = self._out.limit - len(self._out.buffer)
                if room > 0 and view:
                    self._out.buffer += view[:room]
                    view = view[room:]
                    self._out.wake()
                if not view:
                    await trio.lowlevel.checkpoint()
                    return
                await self._out.changed.wait()
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        while len(self._out.buffer) >= self._out.limit and not self._out.reader_closed and not self._closed:
            await self._out.changed.wait()
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")
        self._out.eof = True
        self._out.wake()
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this connection")
        self._receiving = True
        try:
            limit = CHUNK if max_bytes is None else max_bytes
            if limit < 1:
                raise ValueError("max_bytes must be >= 1")
            while True:
                if self._closed:
                    raise trio.ClosedResourceError("this end is closed")
                if self._in.buffer:
                    data = bytes(self._in.buffer[:limit])
                    del self._in.buffer[:limit]
                    self._in.wake()  # room for the writer
                    await trio.lowlevel.checkpoint()
                    return data
                if self._in.eof:
                    await trio.lowlevel.checkpoint()
                    return b""
                await self._in.changed.wait()
        finally:
            self._receiving = False

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """Close at once (no await): the peer reads EOF, and its writes fail."""
        if self._closed:
            return
        self._closed = True
        self._out.eof = True
        self._in.reader_closed = True
        self._in.buffer.clear()
        self._out.wake()
        self._in.wake()


def socket_pair(limit: int = BUFFER_LIMIT) -> tuple[SocketEnd, SocketEnd]:
    """A connected pair of in-process stream ends, each direction buffering at most `limit` bytes."""
    a_to_b, b_to_a = _Direction(limit), _Direction(limit)
    return SocketEnd(a_to_b, b_to_a), SocketEnd(b_to_a, a_to_b)


# -- a pod's ports -------------------------------------------------------------------------------


@attrs.define(eq=False)
class PodPorts:
    """The ports that commands in one pod listen on (the pod's network namespace)."""

    listeners: dict[int, Handler] = attrs.Factory(dict)
    #: Called when the last listener goes, so the `Network` forgets the pod.
    on_empty: Callable[[], None] | None = None

    @contextlib.contextmanager
    def listen(self, port: int, handler: Handler) -> Iterator[None]:
        """Listen on `port` for the `with` block (a command's run). Raises EADDRINUSE as bind does."""
        if not 0 < port < 65536:
            raise OSError(errno.EINVAL, "Invalid argument")
        if port in self.listeners:
            raise OSError(errno.EADDRINUSE, "Address already in use")
        self.listeners[port] = handler
        try:
            yield
        finally:
            del self.listeners[port]
            if not self.listeners and self.on_empty is not None:
                self.on_empty()


#: The ports of the pod a command runs in; set by the kubelet for a container's main process.
#: Unset (a command run outside any pod, as in unit tests): a private namespace nobody can reach.
current_ports: contextvars.ContextVar[PodPorts | None] = contextvars.ContextVar("current_ports", default=None)


class Network:
    """Every pod's ports, and the listeners each pod has by what it runs (see the module docstring)."""

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str, str], PodPorts] = {}

    def ports(self, namespace: str, name: str, uid: str) -> PodPorts:
        """The pod's ports (one namespace per pod uid: a new pod of the same name starts empty)."""
        key = (namespace, name, uid)
        ports = self._pods.get(key)
        if ports is None:
            ports = self._pods[key] = PodPorts(on_empty=functools.partial(self._forget, key))
        return ports

    def _forget(self, key: tuple[str, str, str]) -> None:
        self._pods.pop(key, None)

    @contextlib.contextmanager
    def commands_in(self, pod: dict[str, Any]) -> Iterator[None]:
        """Commands run in this block, and the tasks they start, listen on `pod`'s ports."""
        meta = pod["metadata"]
        token = current_ports.set(self.ports(meta["namespace"], meta["name"], meta.get("uid", "")))
        try:
            yield
        finally:
            current_ports.reset(token)

    def statistics(self) -> dict[tuple[str, str, str], list[int]]:
        """The ports commands listen on, by pod (for tests and debugging)."""
        return {key: sorted(ports.listeners) for key, ports in self._pods.items()}

    def listener(self, ctl: Containers, pod: dict[str, Any], port: int) -> Handler | None:
        """Who answers a connection to `port` in `pod` now; None: nothing listens (refused)."""
        meta = pod["metadata"]
        ports = self._pods.get((meta["namespace"], meta["name"], meta.get("uid", "")))
        if ports is not None and port in ports.listeners:
            return ports.listeners[port]
        running = _running_containers(pod)
        if not running:
            return None
        for container in running:
            key = (meta["namespace"], meta["name"], container.get("name", ""))
            if (httpservers.is_nginx_image(str(container.get("image") or "")) and key not in ctl.processes
                    and port in nginx_ports(container)):
                files = container_files(ctl, meta["namespace"], meta["name"], container.get("name", ""))
                return functools.partial(httpservers.serve_nginx, files=files or httpservers.NGINX_IMAGE_FILES)
        if port == ECHO_PORT:
            return serve_echo
        return None

    async def connect(self, ctl: Containers, pod: dict[str, Any], port: int,
                      nursery: trio.Nursery) -> SocketEnd:
        """Connect to `port` in `pod`: the listener's handler runs in `nursery` on the other end.

        Raises `ConnectionRefusedError` (errno ECONNREFUSED) when nothing listens.
        """
        handler = self.listener(ctl, pod, port)
        if handler is None:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "connection refused")
        client, server = socket_pair()
        nursery.start_soon(_run_handler, handler, server)
        return client


async def _run_handler(handler: Handler, stream: SocketEnd) -> None:
    try:
        await handler(stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client went away: a server sees a reset
    finally:
        stream.close()


def container_files(ctl: Containers, namespace: str, pod: str, container: str) -> httpservers.Files | None:
    """The container's filesystem, where its servers read files (None once the container stopped:
    servers then fall back to their image's fixed files, nginx's default pages)."""
    return ctl.filesystem(namespace, pod, container)


def _running_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers of the pod whose status says they run now."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return []
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return []
    running = {entry.get("name") for entry in status.get("containerStatuses") or []
               if "running" in (entry.get("state") or {})}
    return [c for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") in running]



def nginx_ports(container: dict[str, Any]) -> set[int]:
    """Where the image's nginx answers: port 80 (its default server) and the declared TCP ports."""
    ports = {80}
    for entry in container.get("ports") or []:
        if str(entry.get("protocol") or "TCP") == "TCP" and isinstance(entry.get("containerPort"), int):
            ports.add(entry["containerPort"])
    return ports


async def serve_echo(stream: trio.abc.HalfCloseableStream) -> None:
    """RFC 862 echo: every byte back, in order; the client's EOF is answered with ours."""
    while data := await stream.receive_some(CHUNK):
        await stream.send_all(data)
    await stream.send_eof()
