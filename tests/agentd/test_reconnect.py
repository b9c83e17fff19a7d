"""A real agentd against a real kasd (both in-process, on 127.0.0.1) that goes away for a short while
and comes back on the same port: agentd's tunnel is back within two seconds of kasd listening."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio

from agentd.kubeapi import KubeTarget
from kasd.config import Config
from kasd.server import Runtime, serve_kasd
from tests.agentd.harness import agent_config, running_agent
from tests.kasd.helpers import AGENT1_TOKEN, make_config, wait_sessions

pytestmark = pytest.mark.timeout(20)


class TopRandom(random.Random):
    """Every backoff wait at the top of its range: the slowest reconnect the jitter allows."""

    def uniform(self, a: float, b: float) -> float:
        return b


class RecordingSleep:
    """A real sleep that also tells the test each time the slot starts one (its backoff waits)."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self._changed = trio.Event()

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        self._changed.set()
        self._changed = trio.Event()
        await trio.sleep(seconds)

    async def wait_calls(self, count: int) -> None:
        while len(self.calls) < count:
            await self._changed.wait()


async def test_agentd_is_back_within_two_seconds_of_kasd_after_a_short_outage(
        nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = make_config()
    first_kasd = trio.CancelScope()
    runtime: Runtime = await nursery.start(_kasd_until_cancelled, config, first_kasd)
    agent_port = runtime.port("agent")
    agent = agent_config(tmp_path, runtime.agent_url, agent_id="1")
    agent.token_file.write_text(AGENT1_TOKEN + "\n")
    sleep = RecordingSleep()
    manager_kwargs = {"rand": TopRandom(), "sleep": sleep}
    async with running_agent(nursery, agent, KubeTarget(scheme="http", host="127.0.0.1", port=1),
                             manager_kwargs=manager_kwargs) as running:
        with trio.fail_after(5):
            await wait_sessions(runtime, 1, 1)
        first_kasd.cancel()  # kasd goes away at once, as a crashed process does

        # The tunnel drops; agentd's redials meet a closed port. After the wait that follows the
        # drop and the one after each of two failed dials (1 s, then 2 s: a young outage's cap;
        # the old backoff went on 4, 8 s), kasd comes back on the same port.
        with trio.fail_after(10):
            await sleep.wait_calls(3)
        assert running.manager.tunnels_up == 0
        assert running.manager.statistics().failures == 3  # the drop, then two refused dials
        assert running.manager.statistics().reconnects == 1  # the drop (agentd_reconnects), not each dial
        dial_failures = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dial failed")]
        assert dial_failures and "error='Connection refused'" in dial_failures[0]  # the cause, not trio's summary
        restarted = make_config({"listeners": {
            "agent": {"address": f"127.0.0.1:{agent_port}"},
            "observability": {"address": "127.0.0.1:0"},
            "kubernetes_api": {"address": "127.0.0.1:0"},
        }})
        second_kasd = trio.CancelScope()
        runtime = await nursery.start(_kasd_until_cancelled, restarted, second_kasd)
        assert runtime.port("agent") == agent_port
        # the slowest redial of a young outage is 2 s away
        with trio.fail_after(3):
            await wait_sessions(runtime, 1, 1)
        assert sleep.calls == [1.0, 2.0, 2.0]
    second_kasd.cancel()


async def _kasd_until_cancelled(config: Config, scope: trio.CancelScope, *,
                                task_status: trio.TaskStatus[Runtime] = trio.TASK_STATUS_IGNORED) -> None:
    with scope:
        await serve_kasd(config, task_status=task_status)
