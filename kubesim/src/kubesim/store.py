"""The in-memory object store: versions, identities, watch history and garbage collection.

Everything here is synchronous except waiting; a mutation bumps the one global
resourceVersion, records a `WatchEvent` in a bounded history (older versions answer 410 Gone)
and hands it to every watcher through a bounded channel. A watcher that falls behind is cut off,
as the API server does, and its client re-watches from the last version it saw.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import copy
import json
import random
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import attrs
import trio

from kubesim import conversion, errors, rbac
from kubesim.defaults import Allocator, apply_defaults, validate, validate_name, validate_update
from kubesim.resources import Kind, Registry
from kubesim.selectors import Predicate
from kubesim.timefmt import now, rfc3339

T = TypeVar("T")
Key = tuple[str, str, str, str]  # group, plural, namespace ("" if cluster-scoped), name

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
SYSTEM_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")


@attrs.frozen(kw_only=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED
    group: str
    plural: str
    namespace: str
    object: dict[str, Any]
    old: dict[str, Any] | None
    resource_version: int


@attrs.frozen(kw_only=True)
class ListResult:
    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str
    remaining: int | None


@attrs.frozen(kw_only=True)
class StoreStatistics:
    objects: int
    resource_version: int
    watchers: int
    history: int
    compacted_version: int


def random_suffix(length: int = 5) -> str:
    return "".join(random.choice(_NAME_CHARS) for _ in range(length))


def _key(kind: Kind, namespace: str | None, name: str) -> Key:
    return (kind.group, kind.plural, namespace or "" if kind.namespaced else "", name)


class _Objects(dict[Key, dict[str, Any]]):
    """The objects, also indexed by (group, plural) so one resource's objects are found fast."""

    def __init__(self) -> None:
        super().__init__()
        self.by_resource: dict[tuple[str, str], dict[Key, dict[str, Any]]] = {}
        # How many times each resource's objects were set or removed (indexes built on them
        # know when they are stale).
        self.changes: dict[tuple[str, str], int] = {}

    def __setitem__(self, key: Key, value: dict[str, Any]) -> None:
        super().__setitem__(key, value)
        self.by_resource.setdefault(key[:2], {})[key] = value
        self.changes[key[:2]] = self.changes.get(key[:2], 0) + 1

    def pop(self, key: Key, *default: Any) -> Any:
        value = super().pop(key, *default)
        self.by_resource.get(key[:2], {}).pop(key, None)
        self.changes[key[:2]] = self.changes.get(key[:2], 0) + 1
        return value

    def of(self, group: str, plural: str) -> dict[Key, dict[str, Any]]:
        return self.by_resource.get((group, plural), {})


class _Watcher:
    def __init__(self, group: str, plural: str, namespace: str | None, predicate: Predicate,
                 send: trio.MemorySendChannel[WatchEvent]) -> None:
        self.group = group
        self.plural = plural
        self.namespace = namespace
        self.predicate = predicate
        self.send = send

    def offer(self, event: WatchEvent) -> None:
        translated = translate_event(event, self.group, self.plural, self.namespace, self.predicate)
        if translated is None:
            return
        try:
            self.send.send_nowait(translated)
        except trio.WouldBlock:
            # Too slow: end the watch; the client re-watches from its last resourceVersion.
            self.send.close()
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass


def translate_event(event: WatchEvent, group: str | None, plural: str | None,
                    namespace: str | None, predicate: Predicate) -> WatchEvent | None:
    """The event as a watcher with this filter sees it, or None if it does not see it.

    A change that moves an object into or out of a selector's set is an ADDED or DELETED event
    for that watcher, as the API server's watch cache reports it.
    """
    if plural is not None and (event.group != group or event.plural != plural):
        return None
    if namespace and event.namespace != namespace:
        return None
    now_matches = predicate(event.object)
    if event.type != "MODIFIED" or event.old is None:
        return event if now_matches else None
    old_matches = predicate(event.old)
    if now_matches and old_matches:
        return event
    if now_matches:
        return attrs.evolve(event, type="ADDED")
    if old_matches:
        return attrs.evolve(event, type="DELETED")
    return None


class Store:
    """Objects by (group, plural, namespace, name), stored as the JSON-shaped dicts clients see."""

    def __init__(self, registry: Registry | None = None, *, history: int = 5000,
                 watch_buffer: int = 1000) -> None:
        self.registry = registry or Registry()
        self.allocator = Allocator()
        self._objects = _Objects()
        self._rv = 1
        self._history: deque[WatchEvent] = deque(maxlen=history)
        self._compacted = 0
        self._watchers: set[_Watcher] = set()
        self._watch_buffer = watch_buffer
        self._changed = trio.Event()
        for name in SYSTEM_NAMESPACES:
            self.create(self.kind("", "namespaces"), None, {"metadata": {"name": name}})
        rbac.bootstrap(self)

    def create_objects(self, objects: Iterable[dict[str, Any]]) -> None:
        """Create manifest objects (apiVersion and kind name the resource), as `kubectl create -f`."""
        for obj in objects:
            kind = self.registry.by_kind(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
            if kind is None or kind.virtual:
                raise errors.bad_request(f'no kind "{obj.get("kind")}" is registered for version '
                                         f'"{obj.get("apiVersion")}"')
            namespace = (obj.get("metadata") or {}).get("namespace") or "default" if kind.namespaced else None
            self.create(kind, namespace, obj)

    # -- lookups -------------------------------------------------------------------------------

    def kind(self, group: str, plural: str) -> Kind:
        kind = self.registry.storage_kind(group, plural)
        if kind is None:
            raise KeyError(f"{plural}.{group}")
        return kind

    @property
    def resource_version(self) -> int:
        return self._rv

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(objects=len(self._objects), resource_version=self._rv,
                               watchers=len(self._watchers), history=len(self._history),
                               compacted_version=self._compacted)

    def count(self, group: str, plural: str) -> int:
        """How many objects of (group, plural) are stored."""
        return len(self._objects.of(group, plural))

    def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self._objects.get(_key(kind, namespace, name))
        if obj is None:
            raise errors.not_found(kind.group, kind.plural, name)
        return self._out(kind, obj)

    def peek(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The live (not copied, stored-version) object, for controllers that only read it."""
        return self._objects.get(_key(kind, namespace, name))

    def changes(self, group: str, plural: str) -> int:
        """A number that changes whenever an object of the resource is set or removed."""
        return self._objects.changes.get((group, plural), 0)

    def exists(self, kind: Kind, namespace: str | None, name: str) -> bool:
        return _key(kind, namespace, name) in self._objects

    def find(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        obj = self._objects.get(_key(kind, namespace, name))
        return None if obj is None else self._out(kind, obj)

    def iter_objects(self, group: str, plural: str, namespace: str | None = None) -> Iterator[dict[str, Any]]:
        """Live (not copied) objects, for controllers that only read."""
        for (_, _, ns, _), obj in list(self._objects.of(group, plural).items()):
            if not namespace or ns == namespace:
                yield obj

    def list(self, kind: Kind, namespace: str | None, *, predicate: Predicate | None = None,
             limit: int | None = None, continue_token: str | None = None,
             exact_selector: bool = False) -> ListResult:
        start_after = ""
        list_rv = self._rv
        if continue_token:
            try:
                token = json.loads(base64.urlsafe_b64decode(continue_token.encode()))
                start_after, list_rv = token["start"], int(token["rv"])
            except (ValueError, KeyError, TypeError, binascii.Error) as exc:
                raise errors.bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)") from exc
            if list_rv < self._compacted:
                raise errors.gone(
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter, or use "
                    "the continue token in this response to retrieve the remainder of the results.")
        matching = []
        resource = self._objects.of(kind.group, kind.plural)
        for key in sorted(resource):
            _, _, ns, name = key
            if namespace and ns != namespace:
                continue
            if start_after and f"{ns}/{name}" <= start_after:
                continue
            obj = self._objects[key]
            if predicate is not None and not predicate(obj):
                continue
            matching.append(obj)
        token = ""
        remaining = None
        if limit and len(matching) > limit:
            last = matching[limit - 1]["metadata"]
            start = f"{last.get('namespace', '')}/{last['name']}"
            token = base64.urlsafe_b64encode(json.dumps({"rv": list_rv, "start": start}).encode()).decode()
            remaining = len(matching) - limit if predicate is None or exact_selector else None
            matching = matching[:limit]
        return ListResult(items=[self._out(kind, o) for o in matching],
                          resource_version=str(self._rv), continue_token=token, remaining=remaining)

    def _out(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(obj)
        storage = self.registry.storage_kind(kind.group, kind.plural) or kind
        out = conversion.from_storage(kind, out, storage)
        out["apiVersion"] = kind.api_version
        out["kind"] = kind.kind
        return out

    def present(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        """An object as a client of `kind`'s version sees it (watch events are stored-version)."""
        if obj.get("apiVersion") == kind.api_version:
            return obj
        return self._out(kind, obj)

    def _to_storage(self, kind: Kind, obj: dict[str, Any]) -> tuple[Kind, dict[str, Any]]:
        storage = self.registry.storage_kind(kind.group, kind.plural) or kind
        return storage, conversion.to_storage(kind, obj, storage)

    # -- mutations -----------------------------------------------------------------------------

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _emit(self, type_: str, kind: Kind, obj: dict[str, Any], old: dict[str, Any] | None, rv: int) -> None:
        ns = obj.get("metadata", {}).get("namespace", "") if kind.namespaced else ""
        event = WatchEvent(type=type_, group=kind.group, plural=kind.plural, namespace=ns,
                           object=self._out(kind, obj), old=old, resource_version=rv)
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].resource_version
        self._history.append(event)
        for watcher in list(self._watchers):
            watcher.offer(event)
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _check_namespace(self, kind: Kind, namespace: str | None) -> None:
        if not kind.namespaced:
            return
        if not namespace:
            raise errors.bad_request("the namespace of the object must be set")
        ns = self._objects.get(("", "namespaces", "", namespace))
        if ns is None:
            raise errors.not_found("", "namespaces", namespace)
        if ns.get("metadata", {}).get("deletionTimestamp"):
            raise errors.forbidden(
                f'{kind.group_resource} "{kind.plural}" is forbidden: unable to create new content '
                f"in namespace {namespace} because it is being terminated")

    def create(self, kind: Kind, namespace: str | None, obj: dict[str, Any], *,
               dry_run: bool = False) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        self._check_type(kind, obj)
        requested = kind
        kind, obj = self._to_storage(kind, obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        if kind.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and namespace and body_ns != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request")
            namespace = namespace or body_ns
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = meta["generateName"] + random_suffix()
            else:
                raise errors.invalid(kind.kind, kind.group, "",
                                     [("metadata.name", "Required value: name or generateName is required")])
        name = meta["name"]
        validate_name(kind, name)
        self._check_namespace(kind, namespace)
        key = _key(kind, namespace, name)
        if key in self._objects:
            raise errors.already_exists(kind.group, kind.plural, name)
        if kind.has_status and kind.plural not in ("services",):
            obj.pop("status", None)
        apply_defaults(kind, obj, self.allocator)
        if kind.plural == "namespaces":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
        validate(kind, obj)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(now())
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(field, None)
        if kind.has_generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        if kind.plural == "jobs" and kind.group == "batch":
            _default_job_selector(obj)
        if dry_run:
            meta["resourceVersion"] = ""
            return self._out(requested, obj)
        rv = self._next_rv()
        meta["resourceVersion"] = str(rv)
        obj.pop("apiVersion", None)
        obj.pop("kind", None)
        self._objects[key] = obj
        if kind.group == "apiextensions.k8s.io" and kind.plural == "customresourcedefinitions":
            self._establish_crd(obj)
        self._emit("ADDED", kind, obj, None, rv)
        return self._out(requested, self._objects[key])

    def _check_type(self, kind: Kind, obj: dict[str, Any]) -> None:
        if not isinstance(obj, dict):
            raise errors.bad_request("the body of the request was in an unknown format")
        api_version, kind_name = obj.get("apiVersion"), obj.get("kind")
        if kind_name and kind_name != kind.kind:
            raise errors.bad_request(
                f"the kind in the data ({kind_name}) does not match the expected kind ({kind.kind})")
        if api_version and api_version != kind.api_version:
            group = api_version.rpartition("/")[0]
            if group != kind.group or self.registry.lookup(kind.group, api_version.rpartition("/")[2], kind.plural) is None:
                raise errors.bad_request(
                    f"the API version in the data ({api_version}) does not match the expected "
                    f"API version ({kind.api_version})")

    def _establish_crd(self, crd: dict[str, Any]) -> None:
        spec = crd.get("spec", {})
        crd["status"] = {
            "acceptedNames": dict(spec.get("names", {})),
            "storedVersions": [v["name"] for v in spec.get("versions", []) if v.get("storage")],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": rfc3339(now())},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": rfc3339(now())},
            ],
        }
        self.registry.set_crd(crd)

    def update(self, kind: Kind, namespace: str | None, name: str, obj: dict[str, Any], *,
               subresource: str | None = None, dry_run: bool = False) -> dict[str, Any]:
        key = _key(kind, namespace, name)
        existing = self._objects.get(key)
        if existing is None:
            raise errors.not_found(kind.group, kind.plural, name)
        obj = copy.deepcopy(obj)
        self._check_type(kind, obj)
        requested = kind
        kind, obj = self._to_storage(kind, obj)
        meta = obj.setdefault("metadata", {})
        if meta.get("name") and meta["name"] != name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv and wanted_rv != existing["metadata"]["resourceVersion"]:
            raise errors.conflict(kind.group, kind.plural, name)
        old_meta = existing["metadata"]
        if subresource == "status":
            new = copy.deepcopy(existing)
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
        else:
            new = obj
            if kind.has_status and kind.plural != "namespaces":
                if "status" in existing:
                    new["status"] = copy.deepcopy(existing["status"])
                else:
                    new.pop("status", None)
            if kind.plural == "namespaces":
                new["status"] = copy.deepcopy(existing.get("status", {}))
                new["spec"] = copy.deepcopy(existing.get("spec", {}))
                new["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            apply_defaults(kind, new, self.allocator)
            if kind.plural == "services":
                spec, old_spec = new.setdefault("spec", {}), existing.get("spec", {})
                for field in ("clusterIP", "clusterIPs"):
                    if field in old_spec:
                        spec[field] = old_spec[field]
            validate(kind, new)
            validate_update(kind, existing, new)
        new_meta = new["metadata"]
        for field in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if field in old_meta:
                new_meta[field] = old_meta[field]
            else:
                new_meta.pop(field, None)
        new_meta["name"] = name
        if kind.namespaced:
            new_meta["namespace"] = old_meta.get("namespace")
        new.pop("apiVersion", None)
        new.pop("kind", None)
        if kind.has_generation:
            generation = old_meta.get("generation", 1)
            if _spec_of(new) != _spec_of(existing):
                generation += 1
            new_meta["generation"] = generation
        else:
            new_meta.pop("generation", None)
        new_meta["resourceVersion"] = old_meta["resourceVersion"]
        if new == existing or dry_run:
            return self._out(requested, new)
        if old_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
            self._objects[key] = new
            return self._remove(kind, key, propagation="Background")
        rv = self._next_rv()
        new_meta["resourceVersion"] = str(rv)
        self._objects[key] = new
        if kind.plural == "customresourcedefinitions" and kind.group == "apiextensions.k8s.io":
            self.registry.set_crd(new)
        self._emit("MODIFIED", kind, new, existing, rv)
        return self._out(requested, new)

    def delete(self, kind: Kind, namespace: str | None, name: str, *,
               propagation: str | None = None, precondition_uid: str | None = None,
               precondition_rv: str | None = None, dry_run: bool = False) -> dict[str, Any]:
        key = _key(kind, namespace, name)
        existing = self._objects.get(key)
        if existing is None:
            raise errors.not_found(kind.group, kind.plural, name)
        meta = existing["metadata"]
        if precondition_uid and precondition_uid != meta.get("uid"):
            raise errors.conflict(kind.group, kind.plural, name)
        if precondition_rv and precondition_rv != meta.get("resourceVersion"):
            raise errors.conflict(kind.group, kind.plural, name)
        if dry_run:
            return self._out(kind, existing)
        if kind.plural == "namespaces" and not kind.group:
            if name in ("default", "kube-system", "kube-public"):
                raise errors.forbidden(f'namespaces "{name}" is forbidden: this namespace may not be deleted')
            return self._delete_namespace(kind, key)
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return self._out(kind, existing)
            old = copy.deepcopy(existing)
            meta["deletionTimestamp"] = rfc3339(now())
            meta["deletionGracePeriodSeconds"] = 0
            rv = self._next_rv()
            meta["resourceVersion"] = str(rv)
            self._emit("MODIFIED", kind, existing, old, rv)
            return self._out(kind, existing)
        if kind.plural == "pods" and not kind.group:
            # Graceful deletion as the kubelet finishes it at once: watchers see Terminating first.
            old = copy.deepcopy(existing)
            meta["deletionTimestamp"] = rfc3339(now())
            meta["deletionGracePeriodSeconds"] = 0
            rv = self._next_rv()
            meta["resourceVersion"] = str(rv)
            self._emit("MODIFIED", kind, existing, old, rv)
        return self._remove(kind, key, propagation=propagation or "Background")

    def _remove(self, kind: Kind, key: Key, *, propagation: str) -> dict[str, Any]:
        obj = self._objects.pop(key)
        rv = self._next_rv()
        obj["metadata"]["resourceVersion"] = str(rv)
        self._emit("DELETED", kind, obj, None, rv)
        if kind.plural == "customresourcedefinitions" and kind.group == "apiextensions.k8s.io":
            self._drop_custom_resources(obj)
        self._collect_dependents(obj["metadata"]["uid"], orphan=propagation == "Orphan")
        return self._out(kind, obj)

    def _drop_custom_resources(self, crd: dict[str, Any]) -> None:
        spec = crd.get("spec", {})
        group, plural = spec.get("group", ""), spec.get("names", {}).get("plural", "")
        kind = self.registry.storage_kind(group, plural)
        if kind is not None:
            for key in list(self._objects.of(group, plural)):
                self._remove(kind, key, propagation="Background")
        self.registry.remove_crd(crd["metadata"]["name"])

    def _collect_dependents(self, uid: str, *, orphan: bool) -> None:
        """Owner-reference garbage collection, done at once rather than in the background."""
        for key, obj in list(self._objects.items()):
            if key not in self._objects:
                continue
            refs = obj.get("metadata", {}).get("ownerReferences") or []
            if not any(ref.get("uid") == uid for ref in refs):
                continue
            kind = self.registry.storage_kind(key[0], key[1])
            if kind is None:
                continue
            remaining = [ref for ref in refs if ref.get("uid") != uid]
            if orphan or remaining:
                changed = copy.deepcopy(obj)
                if remaining:
                    changed["metadata"]["ownerReferences"] = remaining
                else:
                    changed["metadata"].pop("ownerReferences", None)
                self.update(kind, key[2], key[3], changed)
            else:
                self.delete(kind, key[2], key[3])

    def _delete_namespace(self, kind: Kind, key: Key) -> dict[str, Any]:
        """Namespace deletion: Terminating, then everything inside goes, then the namespace."""
        name = key[3]
        ns = self._objects[key]
        if not ns["metadata"].get("deletionTimestamp"):
            old = copy.deepcopy(ns)
            ns["metadata"]["deletionTimestamp"] = rfc3339(now())
            ns["metadata"]["deletionGracePeriodSeconds"] = 0
            ns["status"] = {"phase": "Terminating"}
            rv = self._next_rv()
            ns["metadata"]["resourceVersion"] = str(rv)
            self._emit("MODIFIED", kind, ns, old, rv)
        terminating = self._out(kind, ns)
        for obj_key in sorted(k for k in self._objects if k[2] == name):
            if obj_key not in self._objects:
                continue
            inner = self.registry.storage_kind(obj_key[0], obj_key[1])
            if inner is not None and inner.namespaced:
                self._objects[obj_key]["metadata"].pop("finalizers", None)
                self._remove(inner, obj_key, propagation="Background")
        self._remove(kind, key, propagation="Background")
        return terminating

    # -- watching ------------------------------------------------------------------------------

    @contextmanager
    def watch(self, kind: Kind | None, namespace: str | None, *, resource_version: str | None,
              predicate: Predicate | None = None, send_initial: bool | None = None,
              ) -> Iterator[tuple[builtins.list[WatchEvent], trio.MemoryReceiveChannel[WatchEvent]]]:
        """Yield (initial events, channel of later events) for a watch from `resource_version`.

        `kind=None` watches everything (controllers do). With no resourceVersion (or "0") the
        initial events are one ADDED per existing object, as the API server sends them.
        """
        pred = predicate or (lambda obj: True)
        group = kind.group if kind else None
        plural = kind.plural if kind else None
        initial: builtins.list[WatchEvent] = []
        rv_text = resource_version or ""
        if send_initial or (send_initial is None and rv_text in ("", "0")):
            source = self._objects.of(kind.group, kind.plural) if kind is not None else self._objects
            for key, obj in sorted(source.items()):
                if namespace and key[2] != namespace:
                    continue
                if not pred(obj):
                    continue
                stored = self.registry.storage_kind(key[0], key[1])
                assert stored is not None
                initial.append(WatchEvent(
                    type="ADDED", group=key[0], plural=key[1], namespace=key[2],
                    object=self._out(kind or stored, obj), old=None,
                    resource_version=int(obj["metadata"]["resourceVersion"])))
        elif rv_text not in ("", "0"):
            try:
                since = int(rv_text)
            except ValueError as exc:
                raise errors.bad_request(f'invalid resource version: "{rv_text}"') from exc
            if since < self._compacted:
                raise errors.gone(f"too old resource version: {since} ({self._compacted + 1})")
            for event in self._history:
                if event.resource_version <= since:
                    continue
                seen = translate_event(event, group, plural, namespace, pred)
                if seen is not None:
                    initial.append(seen)
        send, receive = trio.open_memory_channel[WatchEvent](self._watch_buffer)
        watcher = _Watcher(group or "", plural or "", namespace, pred, send)
        if plural is None:
            watcher.offer = lambda event: _offer_all(send, event)  # type: ignore[method-assign]
        self._watchers.add(watcher)
        try:
            yield initial, receive
        finally:
            self._watchers.discard(watcher)
            send.close()

    async def wait_changed(self, since: int) -> int:
        """Wait until the store's resourceVersion passes `since`; return the new version."""
        while self._rv <= since:
            await self._changed.wait()
        return self._rv

    async def wait_for(self, check: Callable[[], T | None]) -> T:
        """Wait until `check()` returns something other than None (re-checked on every change)."""
        while True:
            result = check()
            if result is not None:
                return result
            await self.wait_changed(self._rv)


def _offer_all(send: trio.MemorySendChannel[WatchEvent], event: WatchEvent) -> None:
    try:
        send.send_nowait(event)
    except trio.WouldBlock:
        send.close()
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        pass


def _spec_of(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _default_job_selector(job: dict[str, Any]) -> None:
    """The Job strategy labels pods with the Job's uid and selects on it (unless manual)."""
    spec = job.setdefault("spec", {})
    if spec.get("manualSelector"):
        return
    meta = job["metadata"]
    uid, name = meta["uid"], meta["name"]
    labels = {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
              "controller-uid": uid, "job-name": name}
    template_meta = spec.setdefault("template", {}).setdefault("metadata", {})
    template_meta["labels"] = {**(template_meta.get("labels") or {}), **labels}
    spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
