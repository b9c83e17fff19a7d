"""Which cluster objects kasd made: the UID of each object a managed plan created, per agent.

kasd's mark (``kasd.gitlab-agent.io/managed-by``), the project and agent labels and the ``used-by``
record are read from the objects themselves, and whoever may *update* an object may write them: an
identity allowed to patch namespaces but not to delete them could mark an operator's namespace as
kasd's with its own environment as the only user, and the environment's stop would delete it with
the agent's rights; one allowed to label namespaces could have kasd bind a project's group in any
of them. So kasd trusts those marks only on an object whose UID it recorded here when it created it
(a UID is never reused, and no identity on the cluster can write kasd's store).

Keys are ``<agent id>:<uid>``. A recorded UID is remembered in memory once seen (it never stops
being kasd's until deleted); a missing one is asked again each time (another replica may have made
it since). Without a store (tests, embedders) the record lives in this process only.
"""

from __future__ import annotations

from typing import Protocol

from kasd.store.protocol import StoreError

#: the most objects recorded at once (≈ 60 bytes each); past it kasd creates nothing more (503)
MAX_MADE = 100_000
#: recorded UIDs remembered per replica
REMEMBERED = 16_384


class MadeStore(Protocol):
    async def record_made(self, key: str) -> None:
        """Record ``key`` as made by kasd; ``StoreError`` (unreachable, or full)."""
        ...

    async def is_made(self, key: str) -> bool:
        """Whether ``key`` was recorded (and not forgotten); ``StoreError``."""
        ...

    async def forget_made(self, key: str) -> None:
        """Forget ``key`` (its object was deleted); ``StoreError``."""
        ...


def too_many_made(max_entries: int) -> str:
    return f"kasd records at most {max_entries} objects it made and holds that many; it creates no more"


class MemoryMade:
    """The record in this process only."""

    def __init__(self, max_entries: int = MAX_MADE) -> None:
        self.max_entries = max_entries
        self._keys: set[str] = set()

    async def record_made(self, key: str) -> None:
        if key not in self._keys and len(self._keys) >= self.max_entries:
            raise StoreError(too_many_made(self.max_entries))
        self._keys.add(key)

    async def is_made(self, key: str) -> bool:
        return key in self._keys

    async def forget_made(self, key: str) -> None:
        self._keys.discard(key)


class MadeObjects:
    """``record``/``made``/``forget`` by agent and UID, over a ``MadeStore``."""

    def __init__(self, store: MadeStore | None = None) -> None:
        self.store: MadeStore = store if store is not None else MemoryMade()
        self._known: dict[str, None] = {}

    async def record(self, agent_id: int, uid: str) -> None:
        key = f"{agent_id}:{uid}"
        await self.store.record_made(key)
        self._remember(key)

    async def made(self, agent_id: int, uid: object) -> bool:
        if not isinstance(uid, str) or not uid:
            return False
        key = f"{agent_id}:{uid}"
        if key in self._known:
            return True
        if await self.store.is_made(key):
            self._remember(key)
            return True
        return False

    async def forget(self, agent_id: int, uid: object) -> None:
        if not isinstance(uid, str) or not uid:
            return
        key = f"{agent_id}:{uid}"
        self._known.pop(key, None)
        await self.store.forget_made(key)

    def _remember(self, key: str) -> None:
        if len(self._known) >= REMEMBERED:
            del self._known[next(iter(self._known))]
        self._known[key] = None


__all__ = ["MAX_MADE", "MadeObjects", "MadeStore", "MemoryMade"]
