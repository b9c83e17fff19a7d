"""Managed namespaces: what a job's verdict asks to exist (``kasd.authz.templates.ManagedResources``)
is created through the tunnel, as the agent, before the job's first request; and deleted when the
environment stops.

- ``AgentClient``: one JSON request to an agent's Kubernetes API over the router (no impersonation:
  the agent's own service account acts, as GitLab's agentk applies environment templates).
- ``Provisioner.ensure(plan)``: server-side dry-run of every object first (a namespaced object
  whose namespace the plan itself creates is checked when created), then create-or-get: 201 made
  it, 409 means it exists (kasd never adopts an object it did not make); the role each RoleBinding
  grants is looked up first (the API takes a binding to a missing role, which then grants nothing:
  the job is told instead). One plan is applied once
  at a time per replica (a lock per key): concurrent first requests create once, the others wait
  and go on; a failure is answered from memory for ``FAILURE_HOLD`` seconds to the requests that
  queued behind it. A plan applied is remembered for ``RECHECK`` seconds, then checked again (a
  replica does not hear that another stopped the environment).
- ``Provisioner.stop(plan)``: per ``delete_resources``, each object (in reverse order) that
  carries kasd's mark *and* this environment's label is deleted; any other is kept and named.

Who uses a namespace kasd made is recorded on the namespace itself: its ``USED_BY`` annotation
lists every user (``<agent>:<project>:<environment slug>``, ``-`` for a job without environment),
whatever the ``access_as`` mode. A namespace is created with its first user recorded; each later
user adds itself by read-modify-write on the namespace's ``resourceVersion`` (a ``409`` from a
concurrent writer, another replica, is read again and retried). A stop removes only its own user;
the namespace is deleted only when that user is the last, with the ``resourceVersion`` read as a
delete precondition, so a user that recorded itself meanwhile makes the delete a ``409`` and the
namespace stays. A namespace without a record (made by a kasd before it kept one) is never deleted:
who uses it cannot be proved.

Every object keeps the same record (a template may give one object to every environment). The mark,
labels and record are trusted only on an object whose UID kasd recorded in its store when it made
it (``kasd.store.made``): whoever may update an object may write them, and must not thereby get
kasd to delete or bind with the agent's rights.

Each create and delete is an audit line (logger ``kasd.audit``): agent, project, environment,
kind, namespace, name, outcome. Never a token.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import attrs
import trio

from kasd.authz.templates import (
    MANAGED_BY,
    MANAGED_KINDS,
    USED_BY,
    ManagedResources,
    agent_label,
    env_label,
    project_label,
)
from kasd.k8sproxy.accesslog import logfmt
from kasd.seams import RouteError, Router
from kasd.store.made import MadeObjects
from kasd.store.protocol import StoreError
from tunnelhttp.head import RequestHead, ResponseHead
from wire.errors import RemoteProtocolError, UnsendableFrameError
from wire.session import SessionClosedError, StreamRefusedError, StreamResetError

log = logging.getLogger("kasd.audit")

#: seconds a plan applied here is trusted before it is checked again
RECHECK = 60.0
#: the most of an answer kasd reads (a Status or one object)
MAX_ANSWER = 1 << 20
#: seconds one request to the agent may take
REQUEST_TIMEOUT = 30.0
#: seconds applying one plan may take in all (a job's request waits for it)
ENSURE_TIMEOUT = 60.0
#: plans remembered before the stale ones are forgotten
REMEMBERED = 1024
#: seconds a failed apply is answered from memory (the requests that queued behind it, a retry
#: loop) before it is tried again: a hung agent costs one timeout, not one per queued request
FAILURE_HOLD = 5.0
#: users one namespace's record may list: bounds what is read and written per request (the
#: annotation stays far below Kubernetes' 256 KiB for all of an object's annotations)
MAX_USERS = 1000
#: read-modify-write rounds lost to concurrent writers before kasd gives up (and says so)
MAX_CONFLICTS = 16


class ProvisionError(Exception):
    """The plan could not be applied: ``status`` for the job's answer, ``message`` safe to show."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@attrs.frozen
class Answer:
    status: int
    body: Mapping[str, Any]

    @property
    def message(self) -> str:
        return str(self.body.get("message") or f"HTTP {self.status}")


class AgentClient:
    """JSON requests to an agent's Kubernetes API through the tunnel, as the agent itself."""

    def __init__(self, router: Router) -> None:
        self.router = router

    async def request(self, agent_id: int, method: str, target: str, body: Mapping[str, Any] | None = None) -> Answer:
        payload = json.dumps(body).encode() if body is not None else b""
        headers: list[tuple[str, str]] = [("accept", "application/json"), ("user-agent", "kasd/managed-namespaces")]
        if body is not None:
            headers += [("content-type", "application/json"), ("content-length", str(len(payload)))]
        head = RequestHead(method=method, target=target, headers=tuple(headers), impersonate=None,
                           request_id=os.urandom(16).hex())
        try:
            with trio.fail_after(REQUEST_TIMEOUT):
                stream = await self.router.open_stream(agent_id, head.to_metadata())
                try:
                    if payload:
                        await stream.send_all(payload)
                    await stream.send_eof()
                    try:
                        metadata = await stream.wait_accepted()
                    except StreamRefusedError as exc:
                        self.router.report(stream, exc)
                        raise
                    self.router.report(stream, None)
                    answer = ResponseHead.from_metadata(metadata)
                    data = bytearray()
                    while chunk := await stream.receive_some(65536):
                        data += chunk
                        if len(data) > MAX_ANSWER:
                            raise ProvisionError(502, f"agent {agent_id} answered {method} {target} with "
                                                      f"more than {MAX_ANSWER} bytes")
                finally:
                    with trio.CancelScope(shield=True):
                        await stream.aclose()
        except trio.TooSlowError:
            raise ProvisionError(504, f"agent {agent_id} did not answer {method} {target} within "
                                      f"{REQUEST_TIMEOUT:.0f} s") from None
        except RouteError as exc:
            raise ProvisionError(exc.status, exc.message) from None
        except (StreamRefusedError, StreamResetError, SessionClosedError, trio.BrokenResourceError,
                RemoteProtocolError, UnsendableFrameError) as exc:
            raise ProvisionError(502, f"tunnel to agent {agent_id} failed: {exc}") from None
        try:
            parsed = json.loads(bytes(data)) if data else {}
        except ValueError:
            parsed = {}
        return Answer(status=answer.status, body=parsed if isinstance(parsed, dict) else {})


@attrs.frozen(kw_only=True)
class Resource:
    """Where one manifest object lives in the API (from its apiVersion, kind and names)."""

    api_version: str
    kind: str
    plural: str
    name: str
    namespace: str | None

    @property
    def collection(self) -> str:
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespace is not None:
            return f"{prefix}/namespaces/{quote(self.namespace, safe='')}/{self.plural}"
        return f"{prefix}/{self.plural}"

    @property
    def path(self) -> str:
        return f"{self.collection}/{quote(self.name, safe='')}"

    def describe(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


def resource_of(obj: Mapping[str, Any]) -> Resource:
    served = MANAGED_KINDS[str(obj["kind"])]
    meta = obj.get("metadata") or {}
    return Resource(api_version=str(obj["apiVersion"]), kind=str(obj["kind"]), plural=served.plural,
                    name=str(meta["name"]),
                    namespace=str(meta.get("namespace") or "default") if served.namespaced else None)


def _env_label(plan: ManagedResources) -> str | None:
    return env_label(plan.slug, plan.project_id, plan.agent_id) if plan.slug else None


def _project_ours(obj: Mapping[str, Any], plan: ManagedResources) -> bool:
    """kasd made it for this plan's project through this plan's agent (any environment of it)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return (labels.get(MANAGED_BY[0]) == MANAGED_BY[1] and project_label(plan.project_id) in labels
            and agent_label(plan.agent_id) in labels)


def _ours(obj: Mapping[str, Any], plan: ManagedResources) -> bool:
    """kasd made it for this plan's environment (without one: for this project and agent). A
    namespace is shared: whether it may go is its record's to say (``Provisioner._leave``)."""
    if not _project_ours(obj, plan):
        return False
    env = _env_label(plan)
    if env is None:
        return True
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return env in labels


def user_of(plan: ManagedResources) -> str:
    """How ``plan``'s environment is named in a namespace's ``USED_BY`` record."""
    return f"{plan.agent_id}:{plan.project_id}:{plan.slug or '-'}"


def _marked(obj: Mapping[str, Any]) -> bool:
    """It carries kasd's mark (made by kasd, for whichever project and agent)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(MANAGED_BY[0]) == MANAGED_BY[1])


def users_of(obj: Mapping[str, Any]) -> list[str] | None:
    """The namespace's record of its users; None when it has none that can be read (made by a
    kasd before it kept one, or edited into something else): then nobody can prove who uses it."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(USED_BY)
    if not isinstance(raw, str):
        return None
    try:
        users = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
        return None
    return users


def _recording(obj: Mapping[str, Any], users: list[str]) -> dict[str, Any]:
    """``obj`` with its record saying ``users`` (the rest as it was, ``resourceVersion`` too)."""
    meta = dict(obj.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), USED_BY: json.dumps(users, separators=(",", ":"))}
    return {**obj, "metadata": meta}


@attrs.frozen(kw_only=True)
class StopReport:
    deleted: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()


class Provisioner:
    """Applies and deletes ``ManagedResources`` through an ``AgentClient``."""

    def __init__(self, client: AgentClient, *, clock: Any = trio.current_time, made: MadeObjects | None = None) -> None:
        self.client = client
        self._clock = clock
        #: by (key, fingerprint): plans of one key that create different objects are each applied
        self._applied: dict[tuple[tuple[int, int, str, str], str], float] = {}
        self._failed: dict[tuple[tuple[int, int, str, str], str], tuple[float, ProvisionError]] = {}
        self._locks: dict[tuple[int, int, str, str], trio.Lock] = {}
        #: the UIDs of what kasd made (kasd's store once ``serve_kasd`` opened it): only on those are
        #: kasd's mark and records trusted, since whoever may update an object may write them
        self.made = made if made is not None else MadeObjects()

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
            if failed is not None and self._clock() - failed[0] < FAILURE_HOLD:
                raise ProvisionError(failed[1].status, failed[1].message)
            try:
                with trio.fail_after(ENSURE_TIMEOUT):
                    await self._apply(plan, request_id)
            except trio.TooSlowError:
                error = ProvisionError(504, f"creating this job's environment objects through agent "
                                            f"{plan.agent_id} took over {ENSURE_TIMEOUT:.0f} s")
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
            self._failed = {k: v for k, v in self._failed.items() if now - v[0] < FAILURE_HOLD}
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
            self._applied = {k: at for k, at in self._applied.items() if now - at < RECHECK}
        self._applied[key] = now

    def _fresh(self, key: tuple[tuple[int, int, str, str], str]) -> bool:
        at = self._applied.get(key)
        return at is not None and self._clock() - at < RECHECK

    async def _apply(self, plan: ManagedResources, request_id: str) -> None:
        resources = [(resource_of(obj), obj) for obj in plan.objects]
        created_here = {r.name for r, _ in resources if r.kind == "Namespace"}
        for resource, obj in resources:  # server-side dry-run: refuse before changing anything
            answer = await self.client.request(plan.agent_id, "POST", f"{resource.collection}?dryRun=All", obj)
            if answer.status in (200, 201, 409):
                continue
            if answer.status == 404 and resource.namespace in created_here:
                continue  # its namespace is made by this plan: checked when created
            raise ProvisionError(answer.status if answer.status in (400, 403, 422) else 502,
                                 f"cannot create {resource.describe()} for this job's environment "
                                 f"(agent {plan.agent_id}, dry run): {answer.message}")
        for resource, obj in resources:  # the API takes a binding to a role that is not there: kasd does not
            if resource.kind == "RoleBinding" and (obj.get("roleRef") or {}).get("kind") == "ClusterRole":
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
            if resource.kind == "RoleBinding" and (obj.get("roleRef") or {}).get("kind") == "Role":
                # A Role lives in the namespace, which this plan may just have made: looked for now.
                await self._check_role(plan, resource, obj, request_id)
            # Objects, like namespaces, record their users: a template may give one object (a fixed
            # name) to every environment, and the first environment's stop must not delete it
            # under the others.
            await self._use(plan, resource, obj, request_id)

    @staticmethod
    def _create_failed(plan: ManagedResources, resource: Resource, answer: Answer) -> ProvisionError:
        return ProvisionError(answer.status if answer.status in (400, 403, 422) else 502,
                              f"cannot create {resource.describe()} for this job's environment "
                              f"(agent {plan.agent_id}): {answer.message}")

    async def _check_role(self, plan: ManagedResources, resource: Resource, obj: Mapping[str, Any],
                          request_id: str) -> None:
        """The role ``obj`` (a RoleBinding) grants exists: a binding to a missing role is accepted by
        the API and grants nothing, so the job would meet a bare 403 with no word of why."""
        ref = obj.get("roleRef") or {}
        kind, name = str(ref.get("kind") or ""), str(ref.get("name") or "")
        if kind == "ClusterRole":
            path, what = f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{quote(name, safe='')}", f"ClusterRole {name!r}"
        elif kind == "Role" and resource.namespace is not None:
            path = (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{quote(resource.namespace, safe='')}/roles/"
                    f"{quote(name, safe='')}")
            what = f"Role {name!r} in namespace {resource.namespace}"
        else:
            return  # the dry run refused any other roleRef
        answer = await self.client.request(plan.agent_id, "GET", path)
        if answer.status == 200:
            return
        if answer.status == 404:
            self._audit("managed resource created", plan, resource, "failed:role-not-found", request_id)
            log.warning("managed resource refused agent=%d project_id=%d environment=%s kind=RoleBinding "
                        "namespace=%s name=%s role_kind=%s role=%s problem=role-not-found",
                        plan.agent_id, plan.project_id, logfmt(plan.environment) if plan.environment else "-",
                        resource.namespace or "-", logfmt(resource.name), kind, logfmt(name))
            raise ProvisionError(422, f"cannot create {resource.describe()} for this job's environment "
                                      f"(agent {plan.agent_id}): it grants {what}, which the cluster does not have")
        raise ProvisionError(answer.status if answer.status == 403 else 502,
                             f"cannot check that {what}, which {resource.describe()} grants, exists "
                             f"(agent {plan.agent_id}): {answer.message}")

    async def _use(self, plan: ManagedResources, resource: Resource, obj: Mapping[str, Any],
                   request_id: str) -> bool:
        """Create the object with this plan's user recorded, or record the user on the one that
        exists (if kasd made it: a namespace for whichever project, any other object for this
        plan's project and agent); whether kasd made it for this plan's project and agent (for a
        namespace: only then is anything placed inside)."""
        me = user_of(plan)
        creating = _recording(obj, [me])
        first = True
        for _ in range(MAX_CONFLICTS):
            answer = await self.client.request(plan.agent_id, "POST", resource.collection, creating)
            if answer.status in (200, 201):
                await self._record(plan, resource, answer.body)
                self._audit("managed resource created", plan, resource, "created", request_id)
                return True
            if answer.status != 409:
                self._audit("managed resource created", plan, resource, f"failed:{answer.status}", request_id)
                raise self._create_failed(plan, resource, answer)
            if first:
                self._audit("managed resource created", plan, resource, "exists", request_id)
                first = False
            current = await self.client.request(plan.agent_id, "GET", resource.path)
            if current.status == 404:
                continue  # deleted since (the last environment stopped): made again
            if current.status != 200:
                raise ProvisionError(502, f"cannot read {resource.describe()} (agent {plan.agent_id}): "
                                          f"{current.message}")
            if not _marked(current.body) or not await self._made(plan, resource, current.body):
                return False  # not kasd's: used as it is, and nothing of kasd's goes in or on it
            if resource.kind != "Namespace" and not _project_ours(current.body, plan):
                return False  # kasd's for another project or agent: used as it is, never recorded on
            if (current.body.get("metadata") or {}).get("deletionTimestamp"):
                raise ProvisionError(409, f"{resource.describe()} is being deleted (the last environment that "
                                          "used it stopped); try again once it is gone")
            users = users_of(current.body)
            if users is None:
                # Made before kasd recorded users: it is never deleted, so recording is moot.
                return _project_ours(current.body, plan)
            if me in users:
                return _project_ours(current.body, plan)
            if len(users) >= MAX_USERS:
                raise ProvisionError(409, f"{resource.describe()} is already used by {len(users)} environments, "
                                          f"the most kasd records; stop some of them")
            put = await self.client.request(plan.agent_id, "PUT", resource.path, _recording(current.body, [*users, me]))
            if put.status == 200:
                self._audit("managed namespace used" if resource.kind == "Namespace" else "managed resource used",
                            plan, resource, "recorded", request_id)
                return _project_ours(current.body, plan)
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
            with trio.CancelScope(shield=True), trio.move_on_after(REQUEST_TIMEOUT):
                await self.client.request(plan.agent_id, "DELETE", resource.path, _delete_options(uid=uid))
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
            path = f"/api/v1/namespaces/{quote(namespace, safe='')}"
            answer = await self.client.request(plan.agent_id, "GET", path)
            known[namespace] = answer.status == 200 and _project_ours(answer.body, plan) and await self._made(
                plan, Resource(api_version="v1", kind="Namespace", plural="namespaces", name=namespace, namespace=None),
                answer.body)
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
        env = _env_label(plan)
        if env is None:
            return []
        resources = [resource_of(obj) for obj in plan.objects]
        named = {(r.namespace, r.name) for r in resources if r.kind == "RoleBinding"}
        namespaces = dict.fromkeys(r.name if r.kind == "Namespace" else r.namespace for r in resources)
        selector = quote(f"{MANAGED_BY[0]}={MANAGED_BY[1]},{env}", safe="")
        deleted: list[str] = []
        for namespace in namespaces:
            if namespace is None:
                continue
            answer = await self.client.request(
                plan.agent_id, "GET",
                f"/apis/rbac.authorization.k8s.io/v1/namespaces/{quote(namespace, safe='')}/rolebindings"
                f"?labelSelector={selector}")
            if answer.status == 404:
                continue
            if answer.status != 200:
                raise ProvisionError(502, f"cannot list the RoleBindings in namespace {namespace} (agent "
                                          f"{plan.agent_id}): {answer.message}")
            for item in answer.body.get("items") or ():
                if not isinstance(item, dict):
                    continue
                meta = item.get("metadata") or {}
                name = meta.get("name")
                if not isinstance(name, str) or (namespace, name) in named or not _ours(item, plan):
                    continue
                resource = Resource(api_version="rbac.authorization.k8s.io/v1", kind="RoleBinding",
                                    plural="rolebindings", name=name, namespace=namespace)
                if await self._leave(plan, resource) == "deleted":
                    deleted.append(resource.describe())
        return deleted

    async def _leave(self, plan: ManagedResources, resource: Resource) -> str:
        """Remove this plan's user from the object's record; delete the object if that user was its
        only one. An object other than a namespace that has no record (made by a kasd before objects
        kept one) goes as it did then: if it carries this environment's label. A namespace without
        one never goes. ``deleted``, ``kept`` or ``absent``."""
        me = user_of(plan)
        for _ in range(MAX_CONFLICTS):
            current = await self.client.request(plan.agent_id, "GET", resource.path)
            if current.status == 404:
                return "absent"
            if current.status != 200:
                raise ProvisionError(502, f"cannot read {resource.describe()} (agent {plan.agent_id}): {current.message}")
            if not _marked(current.body) or not await self._made(plan, resource, current.body):
                self._audit("managed resource deleted", plan, resource, "kept:not-made-by-kasd")
                return "kept"
            namespace = resource.kind == "Namespace"
            if not namespace and not _project_ours(current.body, plan):
                self._audit("managed resource deleted", plan, resource, "kept:not-made-by-kasd")
                return "kept"
            users = users_of(current.body)
            meta = current.body.get("metadata") or {}
            if users is None and not namespace and _ours(current.body, plan):
                users = [me]  # made before objects kept a record: this environment's by its label
            if users is None:
                why = "users-not-recorded" if namespace else "not-made-by-kasd"
                self._audit("managed resource deleted", plan, resource, f"kept:{why}")
                return "kept"
            others = [u for u in users if u != me]
            if others or me not in users:
                if others == users:  # not a user of it (never applied here): nothing to remove
                    self._audit("managed resource deleted", plan, resource, "kept:used-by-another-environment")
                    return "kept"
                answer = await self.client.request(plan.agent_id, "PUT", resource.path,
                                                   _recording(current.body, others))
                if answer.status == 200:
                    self._audit("managed resource deleted", plan, resource, "kept:used-by-another-environment")
                    return "kept"
            else:
                # Only this user: deleted unless the record changed since it was read (a user that
                # recorded itself meanwhile, on any replica, makes this a 409 and is seen next round).
                answer = await self.client.request(
                    plan.agent_id, "DELETE", resource.path,
                    _delete_options(uid=meta.get("uid"), resource_version=meta.get("resourceVersion")))
                if answer.status in (200, 202):
                    self._audit("managed resource deleted", plan, resource, "deleted")
                    try:
                        await self.made.forget(plan.agent_id, meta.get("uid"))
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


def _delete_options(*, uid: object, resource_version: object = None) -> dict[str, Any]:
    preconditions = {**({"uid": uid} if uid else {}), **({"resourceVersion": resource_version} if resource_version else {})}
    return {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background",
            **({"preconditions": preconditions} if preconditions else {})}


__all__ = ["MAX_USERS", "RECHECK", "AgentClient", "Answer", "ProvisionError", "Provisioner", "Resource", "StopReport",
           "resource_of", "user_of", "users_of"]
