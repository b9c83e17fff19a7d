"""The values the shell answers with (``Viewer``, ``KindProblem``, ``Snapshot``, ``Update``), the
limits it keeps (``ViewLimits``) and what it needs of an environment (``EnvironmentRef``: the
store's ``kasd.store.deployments.Environment`` fits it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from tunnelhttp.head import Impersonation


class EnvironmentRef(Protocol):
    """What discovery needs of an environment: whose labels to select and where."""

    @property
    def id(self) -> int: ...

    @property
    def project_id(self) -> int: ...

    @property
    def slug(self) -> str: ...

    @property
    def namespaces(self) -> tuple[str, ...]: ...


@attrs.frozen
class Viewer:
    """As whom discovery and watches act: the agent itself (``identity`` None) or a user it
    impersonates (``user_access``' ``access_as: user``). ``key`` is what shares a watch set:
    ``"agent"`` or ``"user:<name>"``."""

    agent_id: int
    identity: Impersonation | None
    key: str


@attrs.frozen
class KindProblem:
    """A kind (in one namespace; empty for discovery itself) whose objects are missing from a
    snapshot: ``reason`` is ``"timeout"``, ``"forbidden"`` or ``"error"``."""

    group: str
    version: str
    kind: str
    namespace: str
    reason: str
    message: str


@attrs.frozen
class EnvironmentSnapshot:
    """An environment's objects at one time (``Snapshot``: the name issue 27's contract gives it;
    the class is named apart from ``kasd.authz.snapshot.Snapshot``, one concept, one name)."""

    #: whole objects as the API answered (``managedFields`` dropped; Secrets without their values)
    objects: tuple[Mapping[str, Any], ...]
    problems: tuple[KindProblem, ...]
    #: when nothing carries the labels: GitLab's message, naming both labels
    hint: str | None


#: the contract's name (``from kasd.environments import Snapshot``)
Snapshot = EnvironmentSnapshot


@attrs.frozen
class Update:
    """``ADDED``/``MODIFIED``/``DELETED`` of one ``object``, or ``RESYNC`` with a whole new
    ``snapshot`` (the first update of every watch, and after a watch broke)."""

    type: str
    object: Mapping[str, Any] | None
    snapshot: Snapshot | None


class ViewerTooSlow(Exception):
    """A viewer's queue filled up: it was dropped (its updates were not kept for it)."""


@attrs.frozen(kw_only=True)
class ViewLimits:
    """What one discovery and one watch set may cost (``EnvironmentViews`` takes them)."""

    #: lists in flight at once in one discovery
    max_concurrency: int = 8
    #: seconds for a whole discovery; kinds not listed by then are "timeout" problems
    time_cap: float = 10.0
    #: seconds for one kind's list in one namespace (all its pages)
    kind_time_cap: float = 5.0
    #: objects kept for one environment (labelled and dependents); more are a problem, not kept
    max_objects: int = 5000
    #: bytes of one answer (a list page, a discovery document, one watch event)
    max_answer_bytes: int = 8 << 20
    #: objects asked for in one list page
    page_size: int = 500
    #: updates waiting for one viewer; a viewer this far behind is dropped
    viewer_queue: int = 64
    #: seconds between re-discoveries of a watched environment (new kinds, unlabelled references)
    rediscover_interval: float = 300.0
    #: namespaces of one environment listed and watched (its first, sorted); the rest are a problem.
    #: An environment's namespaces are the union over its kept deployments (100 × 32): each one
    #: costs a list per kind in every discovery and a tunnel stream per watched kind while viewed
    max_namespaces: int = 32
    #: kinds one discovery lists (the first, by group and kind); the rest are a problem. A discovery
    #: document of 8 MiB names ~100,000 kinds: each a list (a task) per namespace in every discovery
    max_kinds: int = 1000
    #: problems one snapshot carries; past them one problem says how many more there were
    max_problems: int = 100
    #: first and longest wait before a broken watch set discovers again (doubling between)
    backoff: tuple[float, float] = (1.0, 30.0)


__all__ = ["EnvironmentRef", "EnvironmentSnapshot", "KindProblem", "Snapshot", "Update", "ViewLimits", "Viewer", "ViewerTooSlow"]
