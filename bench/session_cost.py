"""What an h2c tunnel costs, both ends in this process, on 127.0.0.1: CPU per keepalive exchange,
CPU per small request exchange, and memory per idle tunnel end.

    python bench/session_cost.py                    # 3,000 pings, 2,000 requests, 500 idle tunnels
    python bench/session_cost.py --pings 5000 --requests 0 --idle 0

CPU is ``time.process_time()`` over the loop (both ends' work: a PING exchange is the PING written
by one end, read and answered by the other, the PONG read back), so one end's share is about half.
"ping" is ``Session.ping()`` in a loop; "keepalive" the session's own timer (an interval of 2 ms,
so the exchanges follow each other; the timer's wake-ups are counted in).
A request is a stream opened by the dialling end (an OPEN with a small head), accepted with a small
answer head, a 200-byte body and END both ways. Memory is tracemalloc's growth over ``--idle``
tunnels once every task is idle, divided by the number of tunnel ends (two per tunnel).

Runs on older code too (to compare in one sitting: ``PYTHONPATH=<other tree> python
bench/session_cost.py``): where the carrier still needs its reader task, it is started.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from typing import Any

import trio
import trio.testing

from wire.h2carrier import dial_h2_tunnel, serve_h2_tunnels
from wire.session import MuxStream, Session, connect_session

TOKEN = "bench-token"
BODY = b"x" * 200


def _needs_reader_task(transport: Any) -> bool:
    return not hasattr(transport.driver, "reads_on_demand")


async def _pair(nursery: trio.Nursery, count: int = 1, **session_kwargs: Any) -> tuple[list[Session], list[Session]]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    servers: list[Session] = []
    arrived = trio.Semaphore(0)

    async def auth(token: str, headers: dict[str, str]) -> Any:
        return "bench"

    async def on_session(session: Session, principal: Any) -> None:
        servers.append(session)
        session.hand_streams_to(lambda stream: nursery.start_soon(_answer, stream))
        arrived.release()
        await session.wait_closed()

    await nursery.start(lambda task_status: serve_h2_tunnels(on_session, listeners, authenticate=auth,
                                                             session_kwargs=session_kwargs, task_status=task_status))
    clients: list[Session] = []
    for _ in range(count):
        transport = await dial_h2_tunnel(f"http://127.0.0.1:{port}/tunnel", token=TOKEN)
        if _needs_reader_task(transport):
            from wire.h2carrier import run_h2_reader

            nursery.start_soon(run_h2_reader, transport)
        clients.append(await connect_session(nursery, transport, client=True, **session_kwargs))
        await arrived.acquire()
    return clients, servers


async def _answer(stream: MuxStream) -> None:
    while await stream.receive_some():
        pass
    await stream.accept({"status": 200})
    await stream.send_all(BODY)
    await stream.send_eof()
    await stream.aclose()


async def _request(session: Session) -> None:
    stream = await session.open_stream({"method": "GET", "path": "/api/v1/namespaces/default/pods/x"})
    await stream.send_eof()
    await stream.wait_accepted()
    while await stream.receive_some():
        pass
    await stream.aclose()


async def cpu_per_ping(pings: int) -> float:
    async with trio.open_nursery() as nursery:
        (client,), _ = await _pair(nursery)
        for _ in range(100):
            await client.ping()
        gc.collect()
        start = time.process_time()
        for _ in range(pings):
            await client.ping()
        spent = time.process_time() - start
        nursery.cancel_scope.cancel()
    return spent / pings


async def cpu_per_keepalive(exchanges: int, interval: float = 0.002) -> float:
    """The keepalive itself: the dialler's timer fires ``interval`` after the last bytes it read and
    writes a PING, the other end answers; CPU over ``exchanges`` of them (the timer's wake-ups
    included: they are part of what an idle session costs)."""
    async with trio.open_nursery() as nursery:
        (client,), _ = await _pair(nursery, keepalive_interval=interval, keepalive_timeout=30.0)
        conn = client.connection
        counted = [0]
        reached = trio.Event()
        target = [100]
        ping = conn.ping

        def counting_ping(*args: Any) -> Any:
            counted[0] += 1
            if counted[0] >= target[0]:
                reached.set()
            return ping(*args)

        conn.ping = counting_ping  # type: ignore[method-assign,assignment]
        await reached.wait()
        gc.collect()
        first = counted[0]
        target[0] = first + exchanges
        reached = trio.Event()
        start = time.process_time()
        await reached.wait()
        spent = time.process_time() - start
        done = counted[0] - first
        nursery.cancel_scope.cancel()
    return spent / done


async def cpu_per_request(requests: int) -> float:
    async with trio.open_nursery() as nursery:
        (client,), _ = await _pair(nursery)
        for _ in range(100):
            await _request(client)
        gc.collect()
        start = time.process_time()
        for _ in range(requests):
            await _request(client)
        spent = time.process_time() - start
        nursery.cancel_scope.cancel()
    return spent / requests


async def idle_bytes_per_end(count: int) -> float:
    async with trio.open_nursery() as nursery:
        await _pair(nursery, 1)  # the listener and what the first tunnel makes once
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        await _pair(nursery, count)
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        nursery.cancel_scope.cancel()
    return grown / (2 * count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pings", type=int, default=3000)
    parser.add_argument("--keepalives", type=int, default=3000, help="keepalive exchanges (timer-driven)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--idle", type=int, default=500, help="idle tunnels for the memory figure")
    args = parser.parse_args()
    if args.pings:
        print(f"ping exchange: {trio.run(cpu_per_ping, args.pings) * 1e6:.0f} us CPU (both ends)")
    if args.keepalives:
        print(f"keepalive exchange: {trio.run(cpu_per_keepalive, args.keepalives) * 1e6:.0f} us CPU (both ends)")
    if args.requests:
        print(f"request exchange: {trio.run(cpu_per_request, args.requests) * 1e6:.0f} us CPU (both ends)")
    if args.idle:
        print(f"idle tunnel end: {trio.run(idle_bytes_per_end, args.idle) / 1000:.1f} kB (tracemalloc)")


if __name__ == "__main__":
    main()
