"""``AgentProvisioner``: applies and deletes ``ManagedResources`` through an ``AgentClient`` — the
``kasd.seams.Provisioner`` that ``kasd.server`` gives the pipeline and the REST API's stop call.

- ``ensure(plan)``: server-side dry-run of every object first (a namespaced object whose namespace
  the plan itself creates is checked when created), then create-or-get: 201 made it, 409 means it
  exists (kasd never adopts an object it did not make); the role each RoleBinding grants is looked
  up first (the API takes a binding to a missing role, which then grants nothing: the job is told
  instead). One plan is applied once at a time per replica (a lock per key): concurrent first
  requests create once, the others wait and go on; a failure is answered from memory for
  ``failure_hold`` seconds to the requests that queued behind it. A plan applied is remembered for
  ``recheck`` seconds, then checked again (a replica does not hear that another stopped the
  environment).
- ``stop(plan)``: per ``delete_resources``, each object (in reverse order) that carries kasd's mark
  *and* this environment's label is deleted; any other is kept and named.

Who uses an object kasd made is recorded on the object itself (``objects.USED_BY`` records, whatever
the ``access_as`` mode). An object is created with its first user recorded; each later user adds
itself by read-modify-write on its ``resourceVersion`` (a ``409`` from a concurrent writer, another
replica, is read again and retried). A stop removes only its own user; the object is deleted only
when that user is the last, with the ``resourceVersion`` read as a delete precondition, so a user
that recorded itself meanwhile makes the delete a ``409`` and the object stays. A namespace without
a record (made by a kasd before it kept one) is never deleted: who uses it cannot be proved.

The mark, labels and record are trusted only on an object whose UID kasd recorded in its store when
it made it (``kasd.store.made``): whoever may update an object may write them, and must not thereby
get kasd to delete or bind with the agent's rights. What each answer means is ``objects``' to say;
this module does the I/O, the locking and the audit.

Deadlines are the caller's (``ProvisionLimits``, given by ``kasd.server``): each request to the
agent, and applying one plan in all. Each create and delete is an audit line (logger
``kasd.audit``): agent, project, environment, kind, namespace, name, outcome. Never a token.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from daemonkit.logs import logfmt
from kasd.authz.templates import ManagedResources
from kasd.managed.client import AgentClient, Answer
from kasd.managed.objects import (
    Resource,
    binding_list_path,
    checks_role_first,
    checks_role_when_made,
    create_refusal,
    delete_options,
    dry_run_refusal,
    joining,
    leaving,
    marked,
    namespace_resource,
    owned_namespace,
    plan_resources,
    project_ours,
    recording,
    resource_of,
    role_lookup,
    role_refusal,
    unnamed_binding_namespaces,
    unnamed_bindings,
    user_of,
)
from kasd.seams import ProvisionError, StopReport
from kasd.store.made import MadeObjects
from kasd.store.protocol import StoreError

log = logging.getLogger("kasd.audit")

#: plans remembered before the stale ones are forgotten
REMEMBERED = 1024
#: read-modify-write rounds lost to concurrent writers before kasd gives up (and says so)
MAX_CONFLICTS = 16


@attrs.frozen(kw_only=True)
class ProvisionLimits:
    """The deadlines and memory of an ``AgentProvisioner``, chosen by whoever makes it."""

    #: seconds one request to the agent may take
    request_timeout: float = 30.0
    #: seconds applying one plan may take in all (a job's request waits for it)
    ensure_timeout: float = 60.0
    #: seconds a failed apply is answered from memory (the requests that queued behind it, a retry
    #: loop) before it is tried again: a hung agent costs one timeout, not one per queued request
    failure_hold: float = 5.0
    #: seconds a plan applied here is trusted before it is checked again
    recheck: float = 60.0


class AgentProvisioner:
    """Applies and deletes ``ManagedResources`` through an ``AgentClient`` (``kasd.seams.Provisioner``)."""

    def __init__(self, client: AgentClient, *, limits: ProvisionLimits,
                 clock: Callable[[], float] = trio.current_time, made: MadeObjects | None = None) -> None:
        self.client = client
        self.limits = limits
        self._clock = clock
        #: by (key, fingerprint): plans of one key that create different objects are each applied
        self._applied: dict[tuple[tuple[int, int, str, str], str], float] = {}
        self._failed: dict[tuple[tuple[int, int, str, str], str], tuple[float, ProvisionError]] = {}
        self._locks: dict[tuple[int, int, str, str], trio.Lock] = {}
        #: the UIDs of what kasd made (kasd's store once ``serve_kasd`` opened it): only on those are
        #: kasd's mark and records trusted, since whoever may update an object may write them
        self.made = made if made is not None else MadeObjects()

    async def _request(self, agent_id: int, method: str, target: str, body: Mapping[str, Any] | None = None) -> Answer:
        """One request to the agent, within ``limits.request_timeout``; ``ProvisionError`` 504 beyond."""
        timeout = self.limits.request_timeout
        try:
            with trio.fail_after(timeout):
                return await self.client.request(agent_id, method, target, body)
        except trio.TooSlowError:
            raise ProvisionError(504, f"agent {agent_id} did not answer {method} {target} within "
                                      f"{timeout:.0f} s") from None

    def _audit(self, event: str, plan: ManagedResources, resource: Resource, outcome: str, request_id: str = "") -> None:
        log.info("%s agent=%d project_id=%d environment=%s source=%s kind=%s namespace=%s name=%s outcome=%s%s",
                 event, plan.agent_id, plan.project_id, logfmt(plan.environment) if plan.environment else "-",
                 logfmt(plan.source), resource.kind, resource.namespace or "-", logfmt(resource.name), outcome,
                 f" request_id={request_id}" if request_id else "")

    async def ensure(self, plan: ManagedResources, *, request_id: str = "") -> None:
        """Make sure ``plan``'s objects exist; ``ProvisionError`` naming the object that failed."""
        key = (plan.key, plan.fingerprint)
        if self._fresh(key):
            return
        async with self._holding(plan.key):
            if self._fresh(key):
                return  # another request applied it while this one waited
            failed = self._failed.get(key)
            if failed is not None and self._clock() - failed[0] < self.limits.failure_hold:
                raise ProvisionError(failed[1].status, failed[1].message)
            timeout = self.limits.ensure_timeout
            try:
                with trio.fail_after(timeout):
                    await self._apply(plan, request_id)
            except trio.TooSlowError:
                error = ProvisionError(504, f"creating this job's environment objects through agent "
                                            f"{plan.agent_id} took over {timeout:.0f} s")
                self._fail(key, error)
                raise error from None
            except ProvisionError as exc:
                self._fail(key, exc)
                raise
            self._failed.pop(key, None)
            self._remember(key)

    def _fail(self, key: tuple[tuple[int, int, str, str], str], error: ProvisionError) -> None:
        now = self._clock()
        if len(self._failed) >= REMEMBERED:
            hold = self.limits.failure_hold
            self._failed = {k: v for k, v in self._failed.items() if now - v[0] < hold}
        self._failed[key] = (now, error)

    @asynccontextmanager
    async def _holding(self, key: tuple[int, int, str, str]) -> AsyncIterator[None]:
        """The plan's lock (made when first wanted, dropped when nobody holds or waits for it):
        one apply or stop of a plan at a time on this replica."""
        lock = self._locks.setdefault(key, trio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.statistics().tasks_waiting and not lock.locked():
                self._locks.pop(key, None)

    def _remember(self, key: tuple[tuple[int, int, str, str], str]) -> None:
        now = self._clock()
        if len(self._applied) >= REMEMBERED:  # bounded: forget what is due for a check anyway
            recheck = self.limits.recheck
            self._applied = {k: at for k, at in self._applied.items() if now - at < recheck}
        self._applied[key] = now

    def _fresh(self, key: tuple[tuple[int, int, str, str], str]) -> bool:
        at = self._applied.get(key)
        return at is not None and self._clock() - at < self.limits.recheck

    async def _apply(self, plan: ManagedResources, request_id: str) -> None:
        resources = plan_resources(plan)
        created_here = {r.name for r, _ in resources if r.kind == "Namespace"}
        for resource, obj in resources:  # server-side dry-run: refuse before changing anything
            answer = await self._request(plan.agent_id, "POST", f"{resource.collection}?dryRun=All", obj)
            refusal = dry_run_refusal(plan, resource, answer.status, answer.message, created_here)
            if refusal is not None:
                raise refusal
        for resource, obj in resources:  # the API takes a binding to a role that is not there: kasd does not
            if checks_role_first(resource, obj):
                await self._check_role(plan, resource, obj, request_id)
        owned: dict[str, bool] = {}
        for resource, obj in resources:
            if resource.kind == "Namespace":
                owned[resource.name] = await self._use(plan, resource, obj, request_id)
                continue
            if resource.namespace is not None and not await self._owned(plan, resource.namespace, owned):
                # Never grant or place anything in a namespace kasd did not make for this project
                # and agent (a rule or an environment name could name kube-system).
                self._audit("managed resource created", plan, resource, "skipped:namespace-not-made-by-kasd",
                            request_id)
                continue
            if checks_role_when_made(resource, obj):
                # A Role lives in the namespace, which this plan may just have made: looked for now.
                await self._check_role(plan, resource, obj, request_id)
            # Objects, like namespaces, record their users: a template may give one object (a fixed
            # name) to every environment, and the first environment's stop must not delete it
            # under the others.
            await self._use(plan, resource, obj, request_id)

    async def _check_role(self, plan: ManagedResources, resource: Resource, obj: Mapping[str, Any],
                          request_id: str) -> None:
        """The role ``obj`` (a RoleBinding) grants exists: a binding to a missing role is accepted by
        the API and grants nothing, so the job would meet a bare 403 with no word of why."""
        role = role_lookup(resource, obj)
        if role is None:
            return  # the dry run refused any other roleRef
        answer = await self._request(plan.agent_id, "GET", role.path)
        if answer.status == 200:
            return
        if answer.status == 404:
            self._audit("managed resource created", plan, resource, "failed:role-not-found", request_id)
            log.warning("managed resource refused agent=%d project_id=%d environment=%s kind=RoleBinding "
                        "namespace=%s name=%s role_kind=%s role=%s problem=role-not-found",
                        plan.agent_id, plan.project_id, logfmt(plan.environment) if plan.environment else "-",
                        resource.namespace or "-", logfmt(resource.name), role.kind, logfmt(role.name))
        raise role_refusal(plan, resource, role, answer.status, answer.message)

    async def _use(self, plan: ManagedResources, resource: Resource, obj: Mapping[str, Any],
                   request_id: str) -> bool:
        """Create the object with this plan's user recorded, or record the user on the one that
        exists (``objects.joining`` says whether and how); whether kasd made it for this plan's
        project and agent (for a namespace: only then is anything placed inside)."""
        creating = recording(obj, [user_of(plan)])
        first = True
        for _ in range(MAX_CONFLICTS):
            answer = await self._request(plan.agent_id, "POST", resource.collection, creating)
            if answer.status in (200, 201):
                await self._record(plan, resource, answer.body)
                self._audit("managed resource created", plan, resource, "created", request_id)
                return True
            if answer.status != 409:
                self._audit("managed resource created", plan, resource, f"failed:{answer.status}", request_id)
                raise create_refusal(plan, resource, answer.status, answer.message)
            if first:
                self._audit("managed resource created", plan, resource, "exists", request_id)
                first = False
            current = await self._request(plan.agent_id, "GET", resource.path)
            if current.status == 404:
                continue  # deleted since (the last environment stopped): made again
            if current.status != 200:
                raise ProvisionError(502, f"cannot read {resource.describe()} (agent {plan.agent_id}): "
                                          f"{current.message}")
            made = marked(current.body) and await self._made(plan, resource, current.body)
            join = joining(current.body, plan, resource, made=made)
            if join.record is None:
                return join.ours
            put = await self._request(plan.agent_id, "PUT", resource.path, join.record)
            if put.status == 200:
                self._audit("managed namespace used" if resource.kind == "Namespace" else "managed resource used",
                            plan, resource, "recorded", request_id)
                return join.ours
            if put.status not in (404, 409):  # 409: changed since read (another replica): read again
                raise ProvisionError(put.status if put.status in (403, 422) else 502,
                                     f"cannot record this environment on {resource.describe()} "
                                     f"(agent {plan.agent_id}): {put.message}")
        raise ProvisionError(409, f"{resource.describe()} changed {MAX_CONFLICTS} times while this environment "
                                  "was recorded on it; try again")

    async def _record(self, plan: ManagedResources, resource: Resource, created: Mapping[str, Any]) -> None:
        """Record what was just created as kasd's; if the store cannot, delete it again (an object
        kasd made but did not record would be one it can neither use nor ever delete)."""
        uid = (created.get("metadata") or {}).get("uid")
        try:
            if not isinstance(uid, str) or not uid:
                raise StoreError("the API's answer named no uid")
            await self.made.record(plan.agent_id, uid)
        except StoreError as exc:
            with trio.CancelScope(shield=True), trio.move_on_after(self.limits.request_timeout):
                await self.client.request(plan.agent_id, "DELETE", resource.path, delete_options(uid=uid))
            raise ProvisionError(503, f"cannot record {resource.describe()} as made by kasd (agent {plan.agent_id}), "
                                      f"so it was not kept: {exc}") from None

    async def _made(self, plan: ManagedResources, resource: Resource, obj: Mapping[str, Any]) -> bool:
        """Whether kasd recorded ``obj`` (by its UID) when it made it."""
        try:
            return await self.made.made(plan.agent_id, (obj.get("metadata") or {}).get("uid"))
        except StoreError as exc:
            raise ProvisionError(503, f"cannot check that {resource.describe()} was made by kasd (agent "
                                      f"{plan.agent_id}): {exc}") from None

    async def _owned(self, plan: ManagedResources, namespace: str, known: dict[str, bool]) -> bool:
        """Whether ``namespace`` carries kasd's mark with this plan's project and agent labels."""
        if namespace not in known:
            resource = namespace_resource(namespace)
            answer = await self._request(plan.agent_id, "GET", resource.path)
            known[namespace] = answer.status == 200 and owned_namespace(
                answer.body, plan, made=project_ours(answer.body, plan) and await self._made(plan, resource, answer.body))
        return known[namespace]

    async def stop(self, plan: ManagedResources) -> StopReport:
        """Delete what kasd made for ``plan`` (``delete_resources: on_stop``), never anything else.
        Never while a first request applies the same plan here (it waits for it): a request that
        comes after the stop makes the objects again."""
        async with self._holding(plan.key):
            self._applied = {k: at for k, at in self._applied.items() if k[0] != plan.key}
            self._failed = {k: v for k, v in self._failed.items() if k[0] != plan.key}
            return await self._delete(plan)

    async def _delete(self, plan: ManagedResources) -> StopReport:
        deleted: list[str] = []
        kept: list[str] = []
        absent: list[str] = []
        if plan.delete_resources != "on_stop":
            return StopReport(kept=tuple(resource_of(o).describe() for o in plan.objects))
        outcomes = {"deleted": deleted, "kept": kept, "absent": absent}
        deleted += await self._unnamed_bindings(plan)
        for obj in reversed(plan.objects):
            resource = resource_of(obj)
            outcomes[await self._leave(plan, resource)].append(resource.describe())
        return StopReport(deleted=tuple(deleted), kept=tuple(kept), absent=tuple(absent))

    async def _unnamed_bindings(self, plan: ManagedResources) -> list[str]:
        """Delete this environment's kasd-made RoleBindings that the plan no longer names (a
        ``roles:`` or template edited since they were made): a grant never outlives its environment."""
        deleted: list[str] = []
        for namespace in unnamed_binding_namespaces(plan):
            answer = await self._request(plan.agent_id, "GET", binding_list_path(plan, namespace))
            if answer.status == 404:
                continue
            if answer.status != 200:
                raise ProvisionError(502, f"cannot list the RoleBindings in namespace {namespace} (agent "
                                          f"{plan.agent_id}): {answer.message}")
            for resource in unnamed_bindings(plan, namespace, answer.body.get("items")):
                if await self._leave(plan, resource) == "deleted":
                    deleted.append(resource.describe())
        return deleted

    async def _leave(self, plan: ManagedResources, resource: Resource) -> str:
        """Remove this plan's user from the object's record, deleting the object if that user was
        its only one (``objects.leaving`` says which): ``deleted``, ``kept`` or ``absent``."""
        for _ in range(MAX_CONFLICTS):
            current = await self._request(plan.agent_id, "GET", resource.path)
            if current.status == 404:
                return "absent"
            if current.status != 200:
                raise ProvisionError(502, f"cannot read {resource.describe()} (agent {plan.agent_id}): {current.message}")
            made = marked(current.body) and await self._made(plan, resource, current.body)
            leave = leaving(current.body, plan, resource, made=made)
            if leave.kept is not None:
                self._audit("managed resource deleted", plan, resource, f"kept:{leave.kept}")
                return "kept"
            if leave.record is not None:
                answer = await self._request(plan.agent_id, "PUT", resource.path, leave.record)
                if answer.status == 200:
                    self._audit("managed resource deleted", plan, resource, "kept:used-by-another-environment")
                    return "kept"
            else:
                answer = await self._request(plan.agent_id, "DELETE", resource.path, leave.delete)
                if answer.status in (200, 202):
                    self._audit("managed resource deleted", plan, resource, "deleted")
                    uid = (current.body.get("metadata") or {}).get("uid")
                    try:
                        await self.made.forget(plan.agent_id, uid)
                    except StoreError as exc:  # a UID is never reused: a stale entry misleads nobody
                        log.warning("managed resource deleted but still recorded as made agent=%d kind=%s name=%s "
                                    "error=%s", plan.agent_id, resource.kind, logfmt(resource.name), logfmt(str(exc)))
                    return "deleted"
            if answer.status not in (404, 409):
                self._audit("managed resource deleted", plan, resource, f"failed:{answer.status}")
                raise ProvisionError(502, f"cannot remove this environment from {resource.describe()} "
                                          f"(agent {plan.agent_id}): {answer.message}")
        raise ProvisionError(409, f"{resource.describe()} changed {MAX_CONFLICTS} times while this environment "
                                  "was removed from it; try again")


__all__ = ["MAX_CONFLICTS", "REMEMBERED", "AgentProvisioner", "ProvisionLimits"]
