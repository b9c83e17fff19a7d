"""One environment's discovery through the tunnel, as its viewer: which kinds the cluster serves
(``kinds``), the labelled objects of each in each of the environment's namespaces, then the
unlabelled dependents (``objects.member_ids``, ``objects.references``).

Cost, bounded: at most ``max_concurrency`` requests in flight (a ``trio.CapacityLimiter``), each
kind's list in one namespace within ``kind_time_cap`` (all its pages), the whole discovery within
``time_cap``, at most ``max_objects`` objects kept (labelled and dependents) and ``max_answer_bytes``
read of one answer. A kind that timed out, was forbidden or failed is a ``KindProblem``; the rest is
returned. Only when the agent cannot be reached at all (discovery itself had no answer) is the
``AgentRequestError`` raised, for the caller to answer (502/503) or retry.

The dependent kinds (``kinds.DEPENDENT``: ReplicaSets, Pods, Jobs, EndpointSlices) are listed whole
in each namespace, without the label selector, and kept when an owner is in the environment; the
others are kept to be recognised when their owner appears later (a watch set's ``candidates``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

import attrs
import trio

from kasd.agentclient import AgentApi, AgentRequestError, Answer, AnswerTooLarge
from kasd.environments import kinds as kinds_
from kasd.environments.kinds import ApiKind
from kasd.environments.objects import (
    label_selector,
    member_ids,
    no_resources_hint,
    node_id,
    references,
    sanitize,
)
from kasd.environments.values import EnvironmentRef, KindProblem, Snapshot, Viewer, ViewLimits


@attrs.define
class Discovered:
    """A snapshot and what watching it needs."""

    snapshot: Snapshot
    #: the kinds listed (labelled or dependent) and every kind served, by (group, plural)
    kinds: list[ApiKind]
    served: dict[tuple[str, str], ApiKind]
    #: (group, plural, namespace) → the list's resourceVersion: where its watch starts
    versions: dict[tuple[str, str, str], str]
    #: node id → object: the environment's, and the dependent kinds' others (kept for a later owner)
    members: dict[str, Mapping[str, Any]]
    candidates: dict[str, Mapping[str, Any]]
    #: the environment's namespaces listed (at most ``limits.max_namespaces``): those to watch
    namespaces: tuple[str, ...] = ()
    #: the problems that say a limit cut the environment short: discovering again changes nothing
    over_limits: tuple[KindProblem, ...] = ()


class _Budget:
    """Objects still allowed in this discovery (one ``max_objects`` for labelled and dependents)."""

    def __init__(self, limit: int) -> None:
        self.left = limit
        self.exceeded = False

    def take(self, count: int) -> int:
        allowed = max(0, min(count, self.left))
        self.left -= allowed
        if allowed < count:
            self.exceeded = True
        return allowed


async def discover(api: AgentApi, env: EnvironmentRef, viewer: Viewer, limits: ViewLimits) -> Discovered:
    """``env``'s objects as ``viewer`` sees them (see the module's docstring)."""
    deadline = trio.current_time() + limits.time_cap
    limiter = trio.CapacityLimiter(limits.max_concurrency)
    problems: list[KindProblem] = []

    async def get(target: str, accept: str = "application/json") -> Answer:
        async with limiter:
            return await api.request(viewer.agent_id, "GET", target, impersonate=viewer.identity, accept=accept,
                                     max_bytes=limits.max_answer_bytes)

    with trio.move_on_at(deadline) as scope:
        served_kinds = await _served(get, problems, limiter)
    if scope.cancelled_caught:
        problems.append(KindProblem("", "", "", "", "timeout",
                                    f"API discovery did not finish within {limits.time_cap:g} s"))
        return Discovered(Snapshot((), tuple(problems), None), [], {}, {}, {}, {})
    listed = kinds_.listable(served_kinds)
    over_limits: list[KindProblem] = []
    if len(listed) > limits.max_kinds:
        over_limits.append(KindProblem("", "", "", "", "error",
                                       f"the cluster serves {len(listed)} kinds: only the first {limits.max_kinds} "
                                       "are listed"))
        kept_kinds = set(sorted(listed, key=_priority)[:limits.max_kinds])
        listed = [k for k in listed if k in kept_kinds]
    served = kinds_.served(served_kinds)
    selector = label_selector(env.project_id, env.slug)
    budget = _Budget(limits.max_objects)
    found: dict[str, Mapping[str, Any]] = {}
    versions: dict[tuple[str, str, str], str] = {}
    namespaces = tuple(env.namespaces)[:limits.max_namespaces]
    if len(env.namespaces) > limits.max_namespaces:
        over_limits.append(KindProblem("", "", "", "", "error",
                                       f"the environment has {len(env.namespaces)} namespaces: only the first "
                                       f"{limits.max_namespaces} are listed and watched"))
    unfinished: set[tuple[ApiKind, str]] = {(k, ns) for k in listed for ns in namespaces}

    async def list_one(kind: ApiKind, namespace: str) -> None:
        async with limiter:
            with trio.move_on_after(limits.kind_time_cap) as kind_scope:
                page = limits.page_size
                query = {} if kind.dependent else {"labelSelector": selector}
                cont = ""
                while True:
                    target = kind.path(namespace) + "?" + urlencode(
                        {**query, "limit": str(page), **({"continue": cont} if cont else {})}, quote_via=quote)
                    try:
                        answer = await api.request(viewer.agent_id, "GET", target, impersonate=viewer.identity,
                                                   max_bytes=limits.max_answer_bytes)
                    except AnswerTooLarge as exc:
                        if page > 1:  # large objects: ask again for fewer at a time
                            page //= 2
                            continue
                        problems.append(_problem(kind, namespace, exc.status, exc.message))
                        break
                    except AgentRequestError as exc:
                        problems.append(_problem(kind, namespace, exc.status, exc.message))
                        break
                    if answer.status == 404:  # the kind went away (a CRD deleted) since discovery
                        break
                    if answer.status != 200:
                        problems.append(_problem(kind, namespace, answer.status, answer.message))
                        break
                    items = [i for i in answer.body.get("items") or () if isinstance(i, dict)]
                    for item in items[:budget.take(len(items))]:
                        obj = sanitize(item, api_version=kind.api_version, kind=kind.kind)
                        found[node_id(obj)] = obj
                    metadata = answer.body.get("metadata") or {}
                    cont = str(metadata.get("continue") or "")
                    if not cont:
                        versions[(kind.group, kind.plural, namespace)] = str(metadata.get("resourceVersion") or "")
                        break
                    if budget.exceeded:
                        break
            if kind_scope.cancelled_caught:
                problems.append(KindProblem(kind.group, kind.version, kind.kind, namespace, "timeout",
                                            f"listing {kind.plural} did not finish within "
                                            f"{limits.kind_time_cap:g} s"))
        unfinished.discard((kind, namespace))

    # max_concurrency workers taking the lists in turn: a task per list in flight, not per list
    # (1,000 kinds × 32 namespaces would be 32,000 tasks started at once)
    # Kubernetes' own kinds first (``_priority``): custom kinds whose lists hang (a broken conversion
    # webhook, an aggregated API that is down) in a group sorting before "apps" must not hold every
    # worker until the deadline while the Deployments wait
    pairs = iter(sorted(unfinished, key=lambda p: (_priority(p[0]), p[1])))

    async def worker() -> None:
        for kind, namespace in pairs:
            await list_one(kind, namespace)

    with trio.move_on_at(deadline):
        async with trio.open_nursery() as nursery:
            for _ in range(limits.max_concurrency):
                nursery.start_soon(worker)
    for kind, namespace in sorted(unfinished, key=lambda p: (p[0].group, p[0].kind, p[1])):
        problems.append(KindProblem(kind.group, kind.version, kind.kind, namespace, "timeout",
                                    f"not listed within the discovery's {limits.time_cap:g} s"))
    members = member_ids(found.values(), env.project_id, env.slug)
    labelled_found = bool(members)
    await _fetch_references(get, found, members, served, budget, problems, deadline, limits)
    if budget.exceeded:
        over_limits.append(KindProblem("", "", "", "", "error",
                                       f"more than {limits.max_objects} objects: the rest are left out"))
    problems[:0] = over_limits  # (first: the cut of the problems below never hides them)
    kept = {i: found[i] for i in sorted(members)}
    # one problem per kind, namespace and reason (a kind's list and its GETs for Pods may both fail)
    unique = {_problem_key(p): p for p in reversed(problems)}
    problems = [p for p in problems if unique.get(_problem_key(p)) is p]
    if len(problems) > limits.max_problems:  # (1,000 kinds timing out in 32 namespaces: 32,000 problems)
        more = KindProblem("", "", "", "", "error", f"and {len(problems) - limits.max_problems + 1} more problems")
        problems = [*problems[:limits.max_problems - 1], more]
        over_limits.append(more)
    snapshot = Snapshot(tuple(kept.values()), tuple(problems),
                        None if labelled_found else no_resources_hint(env.project_id, env.slug))
    return Discovered(snapshot, listed, served, versions, kept,
                      {i: o for i, o in found.items() if i not in members}, namespaces, tuple(over_limits))


async def _served(get: Any, problems: list[KindProblem], limiter: trio.CapacityLimiter) -> list[ApiKind]:
    """Every kind the cluster serves, read from ``/api`` and ``/apis``."""
    docs: dict[str, Answer] = {}
    failed: list[AgentRequestError] = []

    async def read(path: str) -> None:
        try:
            docs[path] = await get(path, kinds_.DISCOVERY_ACCEPT)
        except AgentRequestError as exc:
            failed.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read, "/api")
        nursery.start_soon(read, "/apis")
    if failed:  # no answer at all: the agent is away (one error for both, not a group)
        raise failed[0]
    for path, answer in docs.items():
        if answer.status != 200:
            problems.append(KindProblem("", "", "", "", _reason(answer.status),
                                        f"API discovery ({path}) answered {answer.status}: {answer.message}"))
    core, groups = docs["/api"].body, docs["/apis"].body
    if kinds_.is_aggregated(core) or kinds_.is_aggregated(groups):
        return kinds_.from_aggregated(core) + kinds_.from_aggregated(groups)
    found: list[ApiKind] = []
    lists: dict[tuple[str, str], Answer] = {}

    async def read_list(group: str, version: str) -> None:
        try:
            lists[(group, version)] = await get(f"/apis/{group}/{version}" if group else f"/api/{version}")
        except AgentRequestError as exc:
            problems.append(KindProblem(group, version, "", "", _reason(exc.status), exc.message))

    pairs = kinds_.legacy_group_versions(core, groups)
    async with trio.open_nursery() as nursery:
        for group, version in pairs:
            nursery.start_soon(read_list, group, version)
    for group, version in pairs:
        listed = lists.get((group, version))
        if listed is not None and listed.status == 200:
            found += kinds_.from_resource_list(group, version, listed.body)
        elif listed is not None and listed.status != 404:  # an aggregated API that is down: 503
            problems.append(KindProblem(group, version, "", "", _reason(listed.status),
                                        f"discovery of {group or 'core'}/{version} answered {listed.status}: "
                                        f"{listed.message}"))
    return found


async def _fetch_references(get: Any, found: dict[str, Mapping[str, Any]], members: set[str],
                            served: Mapping[tuple[str, str], ApiKind], budget: _Budget,
                            problems: list[KindProblem], deadline: float, limits: ViewLimits) -> None:
    """GET what member Pods and PVCs use and discovery did not find (two rounds: a Pod's PVC,
    then the PVC's PV); each object it reads is added to ``found`` and ``members``."""
    reported: set[tuple[str, str, str]] = set()
    for _ in range(2):
        wanted = sorted(ref for ref in references(found[i] for i in members)
                        if (kind := served.get(ref[:2])) is not None
                        and f"{kind.group}/{kind.kind}/{ref[2]}/{ref[3]}" not in members)
        if not wanted:
            return

        async def one(group: str, plural: str, namespace: str, name: str) -> None:
            kind = served[(group, plural)]
            try:
                with trio.move_on_after(limits.kind_time_cap):
                    answer = await get(kind.path(namespace or None, name))
                    if answer.status == 200 and budget.take(1):
                        obj = sanitize(answer.body, api_version=kind.api_version, kind=kind.kind)
                        found[node_id(obj)] = obj
                        members.add(node_id(obj))
                    elif answer.status not in (200, 404) and (group, plural, namespace) not in reported:
                        reported.add((group, plural, namespace))
                        problems.append(_problem(kind, namespace, answer.status, answer.message))
            except AgentRequestError as exc:
                if (group, plural, namespace) not in reported:
                    reported.add((group, plural, namespace))
                    problems.append(_problem(kind, namespace, exc.status, exc.message))

        with trio.move_on_at(deadline) as scope:
            async with trio.open_nursery() as nursery:
                for ref in wanted:
                    nursery.start_soon(one, *ref)
        if scope.cancelled_caught:
            problems.append(KindProblem("", "", "", "", "timeout", "objects the environment's Pods use were not "
                                        f"all read within the discovery's {limits.time_cap:g} s"))
            return


def _priority(kind: ApiKind) -> tuple[bool, bool, str, str]:
    """Kubernetes' own groups first (no dot, or ``*.k8s.io``; a CRD's group must have a dot), so no
    pile of custom kinds pushes a Deployment out of ``max_kinds`` or behind the deadline."""
    return ("." in kind.group, not kind.group.endswith(".k8s.io"), kind.group, kind.kind)


def _problem_key(problem: KindProblem) -> tuple[str, ...]:
    # a kind's problems are one per namespace and reason; discovery's own (no kind) each apart
    return (problem.group, problem.kind, problem.namespace, problem.reason, "" if problem.kind else problem.message)


def _reason(status: int) -> str:
    return "forbidden" if status == 403 else "timeout" if status == 504 else "error"


def _problem(kind: ApiKind, namespace: str, status: int, message: str) -> KindProblem:
    return KindProblem(kind.group, kind.version, kind.kind, namespace, _reason(status), message)

