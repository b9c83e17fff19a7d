"""ContainerConsole: bounded history, kubectl-logs options, following, the main process's stdin."""

from __future__ import annotations

import itertools
import re

import pytest
import trio
import trio.testing

from kubesim.console import ContainerConsole, format_timestamp

pytestmark = pytest.mark.timeout(10)

T0 = 1_795_322_400_123_456_789  # 2026-11-22T04:40:00.123456789Z


def ticking_console(**kwargs: int) -> ContainerConsole:
    clock = itertools.count(T0, 1_000_000_000)
    return ContainerConsole(clock=lambda: next(clock), **kwargs)


async def collect(console: ContainerConsole, **options: object) -> bytes:
    defaults: dict[str, object] = {"follow": False, "tail_lines": None, "timestamps": False}
    defaults.update(options)
    return b"".join([chunk async for chunk in console.stream_logs(**defaults)])  # type: ignore[arg-type]


def test_format_timestamp_is_fixed_width_rfc3339nano() -> None:
    assert format_timestamp(T0) == "2026-11-22T04:40:00.123456789Z"
    assert format_timestamp(T0 - 123_456_789) == "2026-11-22T04:40:00.000000000Z"


async def test_logs_plain_and_with_timestamps() -> None:
    console = ticking_console()
    console.log("one")
    console.log("two\nthree\n")
    assert await collect(console) == b"one\ntwo\nthree\n"
    stamped = (await collect(console, timestamps=True)).decode()
    assert stamped.splitlines() == [
        "2026-11-22T04:40:00.123456789Z one",
        "2026-11-22T04:40:01.123456789Z two",
        "2026-11-22T04:40:01.123456789Z three",
    ]


async def test_tail_since_and_limit() -> None:
    console = ticking_console()
    for n in range(5):
        console.log(f"line {n}")
    assert await collect(console, tail_lines=2) == b"line 3\nline 4\n"
    assert await collect(console, tail_lines=0) == b""
    assert await collect(console, tail_lines=50) == await collect(console)
    assert await collect(console, since_time_ns=T0 + 3_000_000_000) == b"line 3\nline 4\n"
    assert await collect(console, limit_bytes=9) == b"line 0\nli"
    assert await collect(console, limit_bytes=0) == b""


async def test_history_is_bounded() -> None:
    console = ticking_console(max_lines=3)
    for n in range(10):
        console.log(str(n))
    assert await collect(console) == b"7\n8\n9\n"
    stats = console.statistics()
    assert (stats.lines_held, stats.lines_logged) == (3, 10)


async def test_follow_wakes_on_new_lines_and_ends_on_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    console = ticking_console()
    console.log("old")
    got: list[bytes] = []
    done = trio.Event()

    async def follower() -> None:
        async for chunk in console.stream_logs(follow=True, tail_lines=None, timestamps=False):
            got.append(chunk)
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follower)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [b"old\n"]
        assert console.statistics().followers == 1
        await trio.sleep(30)
        console.log("new")
        await trio.testing.wait_all_tasks_blocked()
        assert got == [b"old\n", b"new\n"]
        console.close()
        with trio.fail_after(1):
            await done.wait()
    assert console.statistics().followers == 0
    assert console.closed


async def test_follow_with_tail_zero_shows_only_new_lines() -> None:
    console = ticking_console()
    console.log("old")
    got: list[bytes] = []

    async def follower() -> None:
        async for chunk in console.stream_logs(follow=True, tail_lines=0, timestamps=True):
            got.append(chunk)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follower)
        await trio.testing.wait_all_tasks_blocked()
        console.log("fresh")
        console.close()
    assert len(got) == 1
    assert re.fullmatch(rb"2026-11-22T04:40:01\.123456789Z fresh\n", got[0])


async def test_follow_after_close_returns_what_was_logged() -> None:
    console = ticking_console()
    console.log("a")
    console.close()
    with trio.fail_after(1):
        assert await collect(console, follow=True) == b"a\n"
    with pytest.raises(trio.ClosedResourceError):
        console.log("too late")


async def test_main_process_echoes_stdin_lines() -> None:
    console = ticking_console()
    console.write_stdin(b"hel")
    console.write_stdin(b"lo\nwor")
    assert await collect(console) == b"hello\n"
    console.flush_stdin()
    assert await collect(console) == b"hello\nwor\n"
    console.flush_stdin()  # nothing pending: nothing logged
    console.write_stdin(b"tail")
    console.close()  # the process's unterminated output still reaches the log
    assert await collect(console) == b"hello\nwor\ntail\n"
    console.write_stdin(b"ignored\n")
    assert console.statistics().lines_logged == 3


async def test_wait_for_line() -> None:
    console = ticking_console()
    async with trio.open_nursery() as nursery:
        results: list[bool] = []

        async def waiter(seq: int) -> None:
            results.append(await console.wait_for_line(seq))

        nursery.start_soon(waiter, 0)
        nursery.start_soon(waiter, 5)
        await trio.testing.wait_all_tasks_blocked()
        console.log("x")
        await trio.testing.wait_all_tasks_blocked()
        assert results == [True]
        console.close()
    assert results == [True, False]


def test_max_lines_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        ContainerConsole(max_lines=0)
