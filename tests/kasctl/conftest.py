"""A kasctl demo stack (kubesim, kasd with its REST API, agentd) per test module that asks for one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kasctl.stack import Stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack(tmp_path_factory.mktemp("stack"), agent_wait_timeout=1.0)
    running.start()
    try:
        yield running
    finally:
        running.stop()
