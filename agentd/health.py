"""``/liveness`` and ``/readiness`` on agentd's own port, over plain h11 (one request per connection).

Liveness is 200 while the process serves at all; readiness is 200 while at least one tunnel is up and
503 with the reason otherwise, so a Deployment's rollout waits for a connected agent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import h11
import trio

log = logging.getLogger("agentd.health")

#: returns None when ready, or why not
ReadinessCheck = Callable[[], str | None]

_REQUEST_TIMEOUT = 10.0


async def serve_health(
    host: str,
    port: int,
    readiness: ReadinessCheck,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``host:port`` (0 picks a port); ``started((host, bound_port))`` once listening."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host or None)
    except OSError as exc:
        message = f"cannot listen on {host}:{port} (the health address): {exc.strerror or exc}"
        raise OSError(exc.errno, message) from None
    bound = listeners[0].socket.getsockname()

    async def handle(stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(_REQUEST_TIMEOUT):
                await _answer(stream, readiness)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError) as exc:
            log.debug("health connection failed error=%r", exc)
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        log.info("health listening address=%s:%d", bound[0], bound[1])
        task_status.started((bound[0], bound[1]))


async def _answer(stream: trio.SocketStream, readiness: ReadinessCheck) -> None:
    conn = h11.Connection(h11.SERVER)
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(4096)
            conn.receive_data(data)
            if not data and conn.their_state is not h11.DONE:
                return
            continue
        if isinstance(event, h11.Request):
            break
        if isinstance(event, h11.ConnectionClosed):
            return
    path = event.target.decode("latin-1").split("?", 1)[0]
    if event.method not in (b"GET", b"HEAD"):
        status, body = 405, "use GET\n"
    elif path == "/liveness":
        status, body = 200, "ok\n"
    elif path == "/readiness":
        reason = readiness()
        status, body = (200, "ok\n") if reason is None else (503, reason + "\n")
    else:
        status, body = 404, "try /liveness or /readiness\n"
    payload = body.encode()
    headers = [("content-type", "text/plain; charset=utf-8"), ("content-length", str(len(payload))),
               ("connection", "close")]
    data = conn.send(h11.Response(status_code=status, headers=headers))
    if event.method != b"HEAD":
        data += conn.send(h11.Data(data=payload))
    data += conn.send(h11.EndOfMessage())
    await stream.send_all(data)
