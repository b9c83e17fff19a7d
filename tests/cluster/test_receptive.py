"""A receptive agent among three kasd replicas (real processes, real Redis, real kubectl): the
agent's home on the ring dials agentd, and when that replica is killed with SIGKILL the next one
on the ring dials it within 5 s, with kasd's default heartbeat (1 s; members expire after 2 s)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from kasctl.stack import AGENT_ID, Stack
from routing.ring import Ring
from tests.cluster.conftest import (
    KUBECTLS,
    WEIGHT,
    kubectl_at,
    member_names,
    metric,
    replicated_stack,
    wait_for_home,
)

KUBECTL = KUBECTLS[-1][1]
#: the issue's bound on the takeover
TAKEOVER = 5.0

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def receptive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Three replicas with kasd's default heartbeat; agentd listens (JWT) and never dials."""
    stack = replicated_stack(tmp_path_factory.mktemp("receptive"), receptive="jwt", agentd_connections=2,
                             heartbeat_interval=1.0)
    try:
        yield stack
    finally:
        codes = stack.stop()
        # the survivors drain their receptive session and exit cleanly (the killed one: -9)
        assert {name: code for name, code in codes.items() if code != -9} == \
            {name: 0 for name, code in codes.items() if code != -9}, codes
        assert list(codes.values()).count(-9) <= 1, codes


def _get(stack: Stack, replica: int) -> None:
    result = kubectl_at(KUBECTL, stack, replica, "get", "namespaces", "-o", "name")
    assert result.returncode == 0, result.stderr
    assert "namespace/default" in result.stdout


def test_the_home_dials_and_a_kill_9_is_taken_over_within_5_s(receptive: Stack) -> None:
    # exactly one replica holds the agent's session: its home on the ring
    home = wait_for_home(receptive)
    for replica in range(3):
        _get(receptive, replica)  # (the two others cross one hop to the home)
    process = receptive.kasds[home]
    assert process is not None
    process.kill()  # SIGKILL: no drain, no goodbye to Redis
    killed_at = time.monotonic()
    survivors = [i for i in range(3) if i != home]
    names = member_names(receptive)
    heir = names.index(Ring({names[i]: WEIGHT for i in survivors}).home(str(AGENT_ID)))  # type: ignore[arg-type]
    held: list[float] = []
    while time.monotonic() - killed_at < TAKEOVER:
        held = [metric(receptive, i, "kasd_agent_sessions") for i in survivors]
        if sum(held) >= 1:
            break
        time.sleep(0.05)  # kasd tells no one when it dialled: its metrics are read again
    took = time.monotonic() - killed_at
    assert sum(held) >= 1, f"no survivor dialled the receptive agent within {TAKEOVER:g} s: sessions {held}"
    assert held[survivors.index(heir)] == 1, f"the ring's next home kasd-{heir + 1} should dial, sessions {held}"
    print(f"receptive agent taken over in {took:.2f} s")
    for replica in survivors:
        _get(receptive, replica)
