"""The store seam (ARCHITECTURE.md, "A store"): one ``typing.Protocol``, two implementations —
``kasd.store.sqlite.SqliteStore`` (a lone kasd) and ``kasd.store.redis.RedisStore`` (replicas).

Its first content is the finished jobs: job id → until (seconds since the epoch), the moment after
which no token of that job could be accepted anyway and the entry is purged. Environments and their
deployment history (``kasd.store.deployments``) are kept there too, purged by the same loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import trio

from kasd.store.deployments import Deployment, Environment
from kasd.store.discovery import PodRecord
from kasd.store.errors import StoreError
from kasd.store.events import QueuedEvent
from kasd.store.finished import FinishedJobs


class Store(Protocol):
    async def finish_job(self, job_id: int, until: int) -> None:
        """Record job ``job_id`` as finished until ``until`` (a later ``until`` wins; never an
        earlier one). Every replica's ``FinishedJobs`` learns of it within a second; ``StoreError``."""
        ...

    async def finished_jobs(self, now: float) -> dict[int, int]:
        """Every job finished until after ``now``: job id → until; ``StoreError``."""
        ...

    async def purge(self, now: float) -> int:
        """Forget the jobs finished until ``now`` or earlier; how many went; ``StoreError``."""
        ...

    async def claim_environment(self, project_id: int, slug: str, name: str) -> str:
        """Record ``name`` as the owner of ``slug`` in project ``project_id`` unless one is already
        recorded; the owner's name either way (``kasd.store.environments``); ``StoreError``."""
        ...

    async def record_made(self, key: str) -> None:
        """Record an object kasd made (``kasd.store.made``: ``<agent id>:<uid>``); ``StoreError``."""
        ...

    async def is_made(self, key: str) -> bool:
        """Whether kasd recorded ``key`` as made; ``StoreError``."""
        ...

    async def forget_made(self, key: str) -> None:
        """Forget ``key`` (its object is deleted); ``StoreError``."""
        ...

    async def record_deployment(self, d: Deployment) -> Environment:
        """Record ``d``: its environment (project id, name) is created, or updated (a stopped one
        used by a job other than the one that stopped it is available again); the deployment of the
        same job and agent, if kept, is merged (namespaces joined, first use kept); beyond
        ``max_deployments`` the oldest of the environment go. The environment as it now is;
        ``StoreError`` (unreachable, or full)."""
        ...

    async def environments(self, *, project_id: int | None = None, project_prefix: str | None = None,
                           tier: str | None = None, state: str | None = None) -> list[Environment]:
        """Every environment that matches all the filters given (``project_prefix="group/"``: a
        group's projects and its subgroups', without case), by id; ``StoreError``."""
        ...

    async def environment(self, env_id: int) -> Environment | None:
        """The environment with id ``env_id``; ``StoreError``."""
        ...

    async def environment_named(self, project_id: int, name: str) -> Environment | None:
        """Project ``project_id``'s environment ``name``; ``StoreError``."""
        ...

    async def deployments(self, env_id: int, limit: int = 50) -> list[Deployment]:
        """Environment ``env_id``'s kept deployments, newest first, at most ``limit`` (≤ 1000); ``StoreError``."""
        ...

    async def mark_stopped(self, project_id: int, name: str, at: float, *, job_id: int | None = None
                           ) -> Environment | None:
        """Mark the environment stopped at ``at`` (by job ``job_id``, whose own later records do
        not make it available again); None if it was never recorded; ``StoreError``."""
        ...

    async def purge_history(self, now: float) -> int:
        """Forget the history older than the retention or beyond the cap (an available
        environment's newest deployment stays), and stopped environments untouched for the
        retention; how many records went; ``StoreError``."""
        ...

    async def run(self, view: FinishedJobs, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Fill ``view`` from the store (``started()`` once it holds what the store holds), then keep
        it in step with changes made anywhere, and purge both as entries expire, until cancelled."""
        ...

    # ---- connected agentd pods and their cluster reports (kasd.store.discovery; issue 28)

    async def put_pod_records(self, records: Sequence[PodRecord], ttl: float) -> None:
        """Write (or refresh) these tunnels' records, each kept ``ttl`` seconds; ``StoreError``."""
        ...

    async def drop_pod_record(self, agent_id: int, key: str) -> None:
        """Remove one tunnel's record (it ended); ``StoreError``."""
        ...

    async def pod_records(self, agent_ids: Sequence[int]) -> dict[int, list[PodRecord]]:
        """Every unexpired record of these agents, every replica's; ``StoreError``."""
        ...

    async def put_cluster_report(self, agent_id: int, pod: str, body: str, ttl: float) -> None:
        """Keep ``body`` (``kasd.store.discovery.report_body``) as pod ``pod``'s latest report for
        ``ttl`` seconds; ``StoreError``."""
        ...

    async def keep_cluster_reports(self, agent_id: int, pods: Sequence[str], ttl: float) -> None:
        """Keep these pods' reports (if any) ``ttl`` seconds more; ``StoreError``."""
        ...

    async def cluster_reports(self, agent_id: int) -> list[str]:
        """The agent's unexpired reports (bodies), one per pod; ``StoreError``."""
        ...



#: seconds between two purges of lapsed finished jobs (each replica purges its own memory; any may
#: purge a store shared in Redis)
PURGE_INTERVAL = 60.0


async def purge_lapsed(store: Store, view: FinishedJobs, clock: Callable[[], float],
                       failed: Callable[[StoreError], object]) -> None:
    """Every ``PURGE_INTERVAL``: the lapsed entries leave ``view`` (this replica's memory) and the
    store; a store that could not purge is told to ``failed`` and asked again next time. Until
    cancelled (both stores' ``run``)."""
    while True:
        await trio.sleep(PURGE_INTERVAL)
        now = clock()
        view.purge(now)
        try:
            await store.purge(now)
            await store.purge_history(now)
        except StoreError as exc:
            failed(exc)


__all__ = ["PURGE_INTERVAL", "EventStore", "Store", "StoreError", "purge_lapsed"]


# ------------------------------------------------------------------ events (issue 28: kasd.store.events)


class EventStore(Protocol):
    """Each agent's queue of events (``kasd.store.events``): ordered by ``seq``, bounded, expiring; a
    lease naming the one replica that delivers an agent's events; notices that wake it. Every call
    may raise ``StoreError``."""

    async def post_event(self, event: QueuedEvent, *, max_queued: int, ttl: float, keep_for: float,
                         max_kept: int, deliverer: str | None = None, handed_to: str | None = None
                         ) -> tuple[QueuedEvent, bool]:
        """Queue ``event`` (its ``seq`` given here) and announce it (``announce_events``): (the
        event, True); an id already known for its agent: (that event, False), nothing queued. ``QueueFull`` when ``max_queued`` wait undelivered
        (those older than ``ttl`` expire first); ended events beyond ``keep_for``/``max_kept`` go.
        ``deliverer``: a lease owner; when it holds the agent's lease and the new event is the only
        one waiting (the head of the queue), the event's delivery starts in the same step
        (``delivering``, one attempt: ``next_event(start=True)``'s work, done by the post) and the
        answer says so — the poster hands it to that deliverer in memory, without another round trip.
        ``handed_to`` (default ``deliverer``): who it is handed to; the started event is marked with
        it (never shown), so that this deliverer's own first take (``next_event(handed_to=…)``),
        should it find the event before the hand-off, does not count a second attempt."""
        ...

    async def event(self, agent_id: int, event_id: str) -> QueuedEvent | None: ...

    async def events(self, agent_id: int, *, state: str | None = None, limit: int = 100) -> list[QueuedEvent]:
        """The agent's kept events in ``state`` (any), newest first, at most ``limit``."""
        ...

    async def next_event(self, agent_id: int, now: float, ttl: float, *, start: bool = False,
                         handed_to: str | None = None) -> tuple[QueuedEvent | None, int]:
        """The agent's oldest undelivered event (after those older than ``ttl`` expired), and how
        many expired now; ``start``: its delivery starts (``start_delivery``, in the same step), one
        attempt more — except for the deliverer ``handed_to`` finding the event a post started and
        marked for it (``post_event(handed_to=…)``): that attempt was counted by the post, and it is
        this one (not yet sent). Either way the mark goes. A take to send an event again after a
        failed attempt passes no ``handed_to``: each send counts."""
        ...

    async def start_delivery(self, agent_id: int, event_id: str) -> None:
        """The event is being delivered: ``delivering``, one more attempt (a post's mark goes)."""
        ...

    async def end_delivery(self, agent_id: int, event_id: str, *, state: str, outcome: str | None, detail: str | None,
                           pod: str | None, at: float, next_ttl: float | None = None,
                           handed_to: str | None = None) -> tuple[QueuedEvent | None, int]:
        """The event ended (``delivered``/``failed``): it leaves the queue, its status is kept. With
        ``next_ttl``, in the same step: ``next_event(agent_id, at, next_ttl, start=True,
        handed_to=handed_to)``'s answer (else ``(None, 0)``)."""
        ...

    async def pending_agents(self) -> dict[int, int]:
        """The agents with undelivered events: agent id → how many."""
        ...

    async def take_lease(self, agent_id: int, owner: str, seconds: float) -> bool:
        """``owner`` delivers the agent's events for ``seconds`` from now (taken, or renewed when it
        already holds it); False when another holds it."""
        ...

    async def release_lease(self, agent_id: int, owner: str) -> None: ...

    async def announce_events(self, agent_id: int) -> None:
        """Wake whoever delivers the agent's events, on every replica (``listen_events``)."""
        ...

    async def listen_events(self, wake: Callable[[int], object], *,
                            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Call ``wake(agent_id)`` for each notice, until cancelled (``started()`` once listening)."""
        ...
