"""The registry's choice of session, alone: fake sessions, time as an argument."""

from __future__ import annotations

from typing import cast

import attrs
import pytest

from routing.local import AgentTunnel, BreakerPolicy, TunnelRegistry
from wire.session import Session


@attrs.define(eq=False)
class FakeSession:
    name: str
    active_streams: int = 0
    closed: bool = False
    draining: bool = False


def registry(*names: str, breaker: BreakerPolicy | None = None) -> tuple[TunnelRegistry, dict[str, Session]]:
    reg = TunnelRegistry(breaker=breaker)
    sessions = {}
    for name in names:
        sessions[name] = cast(Session, FakeSession(name))
        reg.register(AgentTunnel(agent_id=1, session=sessions[name], pod_name=name))
    return reg, sessions


def picks(reg: TunnelRegistry, count: int, *, now: float = 0.0, avoid: frozenset[Session] = frozenset()) -> str:
    out = ""
    for _ in range(count):
        session = reg.pick(1, now=now, avoid=avoid)
        out += cast(FakeSession, session).name if session is not None else "-"
    return out


def test_the_least_loaded_session_is_picked() -> None:
    reg, s = registry("a", "b", "c")
    cast(FakeSession, s["a"]).active_streams = 2
    cast(FakeSession, s["c"]).active_streams = 1
    assert picks(reg, 3) == "bbb"


def test_equally_loaded_sessions_take_turns() -> None:
    reg, _ = registry("a", "b", "c")
    assert picks(reg, 7) == "abcabca"


def test_turns_do_not_depend_on_what_a_session_took_in_its_lifetime() -> None:
    reg, _ = registry("a")
    assert picks(reg, 10) == "a" * 10
    reg.register(AgentTunnel(agent_id=1, session=cast(Session, FakeSession("b"))))
    assert picks(reg, 4) == "baba"


def test_turns_go_on_round_the_ties_when_loads_differ() -> None:
    reg, s = registry("a", "b", "c")
    assert picks(reg, 1) == "a"
    cast(FakeSession, s["b"]).active_streams = 1  # b is busy: among a and c, c comes next
    assert picks(reg, 2) == "ca"


def test_draining_and_closed_sessions_are_never_picked() -> None:
    reg, s = registry("a", "b", "c")
    cast(FakeSession, s["a"]).draining = True
    cast(FakeSession, s["c"]).closed = True
    assert picks(reg, 2) == "bb"
    cast(FakeSession, s["b"]).draining = True
    assert picks(reg, 1) == "-"


def test_avoided_sessions_are_never_picked() -> None:
    reg, s = registry("a", "b")
    assert picks(reg, 3, avoid=frozenset({s["a"]})) == "bbb"
    assert picks(reg, 1, avoid=frozenset({s["a"], s["b"]})) == "-"
    assert reg.has_usable(1, frozenset({s["a"]}))
    cast(FakeSession, s["a"]).draining = True
    assert not reg.has_usable(1, frozenset({s["a"]}))


def test_a_session_whose_api_server_is_unreachable_is_held_back_for_a_growing_while() -> None:
    reg, s = registry("a", "b", breaker=BreakerPolicy(initial=1.0, maximum=30.0))
    reg.upstream_unreachable(s["a"], now=0.0)
    assert picks(reg, 4, now=0.5) == "bbbb"
    assert picks(reg, 2, now=1.0) == "ab"  # the hold ran out: a takes its turn again (a probe)
    reg.upstream_unreachable(s["a"], now=1.0)  # still failing: twice as long
    assert picks(reg, 2, now=2.9) == "bb"
    assert "a" in picks(reg, 2, now=3.0)
    holds = []
    now = 3.0
    for _ in range(8):
        reg.upstream_unreachable(s["a"], now=now)
        tunnel = next(t for t in reg.tunnels(1) if t.session is s["a"])
        holds.append(tunnel.held_until - now)
        now = tunnel.held_until
    assert holds == [4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0, 30.0]


def test_refusals_during_a_hold_do_not_lengthen_it() -> None:
    # Requests that were in flight when the first refusal came say nothing new.
    reg, s = registry("a", "b")
    for now in (0.0, 0.1, 0.2, 0.9):
        reg.upstream_unreachable(s["a"], now=now)
    assert picks(reg, 2, now=1.0) == "ab"


def test_a_stream_taken_resets_the_breaker() -> None:
    reg, s = registry("a", "b")
    reg.upstream_unreachable(s["a"], now=0.0)
    reg.upstream_unreachable(s["a"], now=1.0)
    reg.took_stream(s["a"])
    assert picks(reg, 2, now=1.5) == "ab"
    reg.upstream_unreachable(s["a"], now=2.0)  # the first refusal again: 1 s
    assert picks(reg, 1, now=2.5) == "b" and "a" in picks(reg, 2, now=3.0)


def test_when_every_session_is_held_the_one_that_failed_longest_ago_is_used() -> None:
    reg, s = registry("a", "b", "c")
    reg.upstream_unreachable(s["b"], now=0.0)
    reg.upstream_unreachable(s["a"], now=0.2)
    reg.upstream_unreachable(s["c"], now=0.4)
    assert picks(reg, 2, now=0.5) == "bb"
    reg.upstream_unreachable(s["b"], now=0.6)  # b failed again (within its hold): now a is the oldest
    assert picks(reg, 1, now=0.7) == "a"


def test_a_session_that_leaves_takes_its_breaker_with_it() -> None:
    reg, s = registry("a", "b")
    (tunnel_a, _) = reg.tunnels(1)
    reg.unregister(tunnel_a)
    reg.upstream_unreachable(s["a"], now=0.0)  # a late report for a gone session: ignored
    assert picks(reg, 2) == "bb"


@pytest.mark.parametrize(("failures", "hold"), [(1, 0.5), (2, 1.0), (3, 2.0), (4, 3.0), (100, 3.0)])
def test_breaker_policy_doubles_up_to_its_maximum(failures: int, hold: float) -> None:
    assert BreakerPolicy(initial=0.5, maximum=3.0).hold(failures) == hold
