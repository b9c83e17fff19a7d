"""In-memory stand-ins for ``routing.membership`` and ``routing.directory`` (design15.md's
interfaces), shared by several in-process kasd runtimes: one ``MemoryWorld`` is "the Redis" every
replica of a test sees. Tests of the router and the private hop use these; the Redis-backed classes
have tests of their own."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from kasd.replicas import Replication
from routing.membership import Member

__all__ = ["Member", "MemoryWorld", "TestRing", "WorldDirectory", "WorldMembership"]


class TestRing:
    """Rendezvous order over the members (tests only need *an* order; ``order`` pins one)."""

    def __init__(self, names: list[str], order: list[str] | None = None) -> None:
        self.names = names
        self.order = order

    def preference(self, key: str, n: int | None = None) -> list[str]:
        if self.order is not None:
            ranked = [name for name in self.order if name in self.names]
        else:
            ranked = sorted(self.names, key=lambda name: -zlib.crc32(f"{name}/{key}".encode()))
        return ranked[:n] if n is not None else ranked

    def home(self, key: str) -> str | None:
        ranked = self.preference(key, 1)
        return ranked[0] if ranked else None


class MemoryWorld:
    """Members and tunnel holders of every replica in the test, and the change events."""

    def __init__(self) -> None:
        self.members: dict[str, Member] = {}
        self.holders: dict[int, set[str]] = {}
        self.healthy = True
        #: a fixed ring order (names), or None for rendezvous
        self.order: list[str] | None = None
        self._agent_events: dict[int, trio.Event] = {}
        self._members_changed = trio.Event()

    def join(self, me: Member) -> Replication:
        return Replication(membership=WorldMembership(self, me), directory=WorldDirectory(self, me.name))

    def add_member(self, member: Member) -> None:
        self.members[member.name] = member
        self.members_changed()

    def remove_member(self, name: str) -> None:
        self.members.pop(name, None)
        self.members_changed()

    def add_holder(self, agent_id: int, name: str) -> None:
        self.holders.setdefault(agent_id, set()).add(name)
        self.agent_changed(agent_id)

    def set_healthy(self, healthy: bool) -> None:
        self.healthy = healthy
        self.members_changed()

    def members_changed(self) -> None:
        self._members_changed.set()
        self._members_changed = trio.Event()
        for agent_id in list(self._agent_events):
            self.agent_changed(agent_id)

    def agent_changed(self, agent_id: int) -> None:
        event = self._agent_events.pop(agent_id, None)
        if event is not None:
            event.set()

    def changed(self, agent_id: int) -> trio.Event:
        return self._agent_events.setdefault(agent_id, trio.Event())

    async def wait_members_changed(self) -> None:
        await self._members_changed.wait()


class WorldMembership:
    def __init__(self, world: MemoryWorld, me: Member) -> None:
        self.world = world
        self.me = me
        self.draining_calls = 0
        self.left = False

    @property
    def self_name(self) -> str:
        return self.me.name

    def members(self) -> Mapping[str, Member]:
        return dict(self.world.members)

    @property
    def ring(self) -> TestRing:
        return TestRing([m.name for m in self.world.members.values() if not m.draining], self.world.order)

    async def wait_changed(self) -> None:
        await self.world.wait_members_changed()

    def changes(self) -> trio.Event:
        return self.world._members_changed

    @property
    def healthy(self) -> bool:
        return self.world.healthy

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self.world.add_member(self.me)
        task_status.started()
        await trio.sleep_forever()

    async def set_draining(self) -> None:
        self.draining_calls += 1
        self.world.add_member(attrs.evolve(self.me, draining=True))
        await trio.lowlevel.checkpoint()

    async def leave(self) -> None:
        self.left = True
        self.world.remove_member(self.me.name)
        await trio.lowlevel.checkpoint()


class WorldDirectory:
    def __init__(self, world: MemoryWorld, name: str) -> None:
        self.world = world
        self.name = name
        #: (agent id, "+"/"-") in the order the registry reported them
        self.calls: list[tuple[int, str]] = []

    def tunnels_up(self, agent_id: int) -> None:
        self.calls.append((agent_id, "+"))
        self.world.add_holder(agent_id, self.name)

    def tunnels_down(self, agent_id: int) -> None:
        self.calls.append((agent_id, "-"))
        self.world.holders.get(agent_id, set()).discard(self.name)
        self.world.agent_changed(agent_id)

    async def holders(self, agent_id: int) -> frozenset[str]:
        await trio.lowlevel.checkpoint()
        if not self.world.healthy:
            return frozenset()
        live = self.world.members
        return frozenset(n for n in self.world.holders.get(agent_id, ()) if n in live and n != self.name)

    def changed(self, agent_id: int) -> trio.Event:
        return self.world.changed(agent_id)

    @property
    def healthy(self) -> bool:
        return self.world.healthy

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def withdraw(self) -> None:
        self.calls.append((0, "withdraw"))
        for holders in self.world.holders.values():
            holders.discard(self.name)
        await trio.lowlevel.checkpoint()
