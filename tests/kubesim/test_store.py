"""The object store: identities, versions, selectors, paging, watch history and GC."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from kubesim.errors import ApiError
from kubesim.selectors import parse_field_selector, parse_label_selector
from kubesim.store import Store


def cm(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}


async def test_create_assigns_identity_and_versions() -> None:
    store = Store()
    kind = store.kind("", "configmaps")
    first = store.create(kind, "default", cm("a"))
    second = store.create(kind, "default", cm("b"))
    assert first["kind"] == "ConfigMap" and first["apiVersion"] == "v1"
    assert first["metadata"]["uid"] != second["metadata"]["uid"]
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    assert first["metadata"]["creationTimestamp"].endswith("Z")
    with pytest.raises(ApiError) as exists:
        store.create(kind, "default", cm("a"))
    assert exists.value.code == 409 and exists.value.reason == "AlreadyExists"
    with pytest.raises(ApiError) as no_ns:
        store.create(kind, "missing", cm("a"))
    assert no_ns.value.code == 404 and 'namespaces "missing" not found' in no_ns.value.message
    with pytest.raises(ApiError) as bad_name:
        store.create(kind, "default", cm("Bad_Name"))
    assert bad_name.value.code == 422
    generated = store.create(kind, "default", {"metadata": {"generateName": "gen-"}})
    assert generated["metadata"]["name"].startswith("gen-") and len(generated["metadata"]["name"]) == 9


async def test_update_generation_conflict_and_noop() -> None:
    store = Store()
    kind = store.kind("apps", "deployments")
    body = {"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
        "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}
    created = store.create(kind, "default", body)
    assert created["metadata"]["generation"] == 1 and created["spec"]["replicas"] == 1
    same = store.update(kind, "default", "d", created)
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    labelled = dict(created, metadata={**created["metadata"], "labels": {"x": "y"}})
    after_label = store.update(kind, "default", "d", labelled)
    assert after_label["metadata"]["generation"] == 1
    scaled = dict(after_label, spec={**after_label["spec"], "replicas": 3})
    after_scale = store.update(kind, "default", "d", scaled)
    assert after_scale["metadata"]["generation"] == 2
    with pytest.raises(ApiError) as stale:
        store.update(kind, "default", "d", created)
    assert stale.value.code == 409 and "the object has been modified" in stale.value.message
    status_only = dict(after_scale, status={"replicas": 7}, spec={**after_scale["spec"], "replicas": 9})
    after_status = store.update(kind, "default", "d", status_only, subresource="status")
    assert after_status["status"] == {"replicas": 7} and after_status["spec"]["replicas"] == 3


async def test_a_namespace_is_updated_and_deleted_only_at_the_version_read() -> None:
    # What kasd's record of a managed namespace's users relies on (kasd.managed): an annotation
    # written back with the resourceVersion read is a 409 once another writer came first, and so is
    # a delete whose precondition names an older version; neither changes anything.
    store = Store()
    kind = store.kind("", "namespaces")
    read = store.create(kind, None, {"metadata": {"name": "app", "annotations": {"users": "[a]"}}})
    mine = dict(read, metadata={**read["metadata"], "annotations": {"users": "[a,b]"}})
    theirs = dict(read, metadata={**read["metadata"], "annotations": {"users": "[a,c]"}})
    written = store.update(kind, None, "app", theirs)
    with pytest.raises(ApiError) as lost:
        store.update(kind, None, "app", mine)
    assert lost.value.code == 409 and lost.value.reason == "Conflict"
    with pytest.raises(ApiError) as stale:
        store.delete(kind, None, "app", precondition_uid=read["metadata"]["uid"],
                     precondition_rv=read["metadata"]["resourceVersion"])
    assert stale.value.code == 409
    assert store.get(kind, None, "app")["metadata"]["annotations"] == {"users": "[a,c]"}
    store.delete(kind, None, "app", precondition_rv=written["metadata"]["resourceVersion"])
    assert store.find(kind, None, "app") is None


async def test_selectors_and_paging() -> None:
    store = Store()
    kind = store.kind("", "configmaps")
    for i in range(5):
        store.create(kind, "default", cm(f"c{i}", tier="web" if i % 2 else "db", idx=str(i)))
    web = parse_label_selector("tier=web")
    assert [o["metadata"]["name"] for o in store.list(kind, "default", predicate=web).items] == ["c1", "c3"]
    set_based = parse_label_selector("tier in (db),idx notin (0,2)")
    assert [o["metadata"]["name"] for o in store.list(kind, "default", predicate=set_based).items] == ["c4"]
    exists = parse_label_selector("!tier")
    assert [o["metadata"]["name"] for o in store.list(kind, "default", predicate=exists).items] == []
    field = parse_field_selector("metadata.name!=c0,metadata.namespace=default")
    assert len(store.list(kind, "default", predicate=field).items) == 4
    seen = []
    token = None
    while True:
        page = store.list(kind, "default", limit=2, continue_token=token)
        seen += [o["metadata"]["name"] for o in page.items if o["metadata"]["name"].startswith("c")]
        token = page.continue_token
        if not token:
            break
        assert page.remaining is not None
    assert seen == [f"c{i}" for i in range(5)]
    with pytest.raises(ApiError):
        parse_label_selector("tier in in (")


async def test_watch_replays_history_and_expires() -> None:
    store = Store(history=10)
    kind = store.kind("", "configmaps")
    start = str(store.resource_version)
    store.create(kind, "default", cm("a", tier="web"))
    with store.watch(kind, "default", resource_version=start,
                     predicate=parse_label_selector("tier=web")) as (initial, events):
        assert [(e.type, e.object["metadata"]["name"]) for e in initial] == [("ADDED", "a")]
        obj = store.get(kind, "default", "a")
        obj["metadata"]["labels"] = {"tier": "db"}
        store.update(kind, "default", "a", obj)
        left = await events.receive()
        assert left.type == "DELETED"  # left the selector's set
        store.create(kind, "default", cm("b", tier="web"))
        assert (await events.receive()).object["metadata"]["name"] == "b"
    for i in range(20):
        store.create(kind, "default", cm(f"x{i}"))
    with pytest.raises(ApiError) as gone, store.watch(kind, "default", resource_version=start):
        pass
    assert gone.value.code == 410 and "too old resource version" in gone.value.message
    with store.watch(kind, "default", resource_version="") as (initial, _):
        assert {e.object["metadata"]["name"] for e in initial} >= {"a", "b", "x0"}


async def test_slow_watcher_is_cut_off() -> None:
    store = Store(watch_buffer=2)
    kind = store.kind("", "configmaps")
    with store.watch(kind, None, resource_version=str(store.resource_version)) as (_, events):
        for i in range(5):
            store.create(kind, "default", cm(f"c{i}"))
        received = [e async for e in events]
    assert len(received) == 2


async def test_cascading_delete_and_orphans() -> None:
    store = Store()
    cms = store.kind("", "configmaps")
    owner = store.create(cms, "default", cm("owner"))
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    child = cm("child")
    child["metadata"]["ownerReferences"] = [ref]
    store.create(cms, "default", child)
    store.delete(cms, "default", "owner")
    assert store.find(cms, "default", "child") is None
    owner = store.create(cms, "default", cm("owner"))
    child["metadata"]["ownerReferences"] = [dict(ref, uid=owner["metadata"]["uid"])]
    store.create(cms, "default", child)
    store.delete(cms, "default", "owner", propagation="Orphan")
    assert "ownerReferences" not in store.get(cms, "default", "child")["metadata"]


async def test_finalizers_hold_deletion() -> None:
    store = Store()
    cms = store.kind("", "configmaps")
    body = cm("held")
    body["metadata"]["finalizers"] = ["example.com/hold"]
    store.create(cms, "default", body)
    marked = store.delete(cms, "default", "held")
    assert marked["metadata"]["deletionTimestamp"]
    marked["metadata"]["finalizers"] = []
    store.update(cms, "default", "held", marked)
    assert store.find(cms, "default", "held") is None


async def test_namespace_deletion_removes_contents() -> None:
    store = Store()
    namespaces, cms = store.kind("", "namespaces"), store.kind("", "configmaps")
    store.create(namespaces, None, {"metadata": {"name": "doomed"}})
    store.create(cms, "doomed", cm("inside"))
    with store.watch(namespaces, None, resource_version=str(store.resource_version)) as (_, events):
        terminating = store.delete(namespaces, None, "doomed")
        assert terminating["status"]["phase"] == "Terminating"
        assert (await events.receive()).type == "MODIFIED"
        assert (await events.receive()).type == "DELETED"
    assert store.find(cms, "doomed", "inside") is None
    with pytest.raises(ApiError) as protected:
        store.delete(namespaces, None, "default")
    assert protected.value.code == 403


async def test_wait_for_wakes_on_change() -> None:
    store = Store()
    kind = store.kind("", "configmaps")
    async with trio.open_nursery() as nursery:
        result: list[dict] = []

        async def waiter() -> None:
            result.append(await store.wait_for(lambda: store.find(kind, "default", "late")))

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        store.create(kind, "default", cm("late"))
    assert result[0]["metadata"]["name"] == "late"


operations = st.lists(
    st.tuples(st.sampled_from(["create", "update", "delete", "mark"]), st.integers(0, 4),
              st.sampled_from(["a", "b"])),
    max_size=40)


@settings(max_examples=60, deadline=None)
@given(operations)
async def test_watch_from_any_version_replays_to_the_current_state(ops: list[tuple[str, int, str]]) -> None:
    """Whatever happened, state at version V plus the watch events from V is the state now."""
    store = Store()
    kind = store.kind("", "configmaps")
    marks: list[tuple[str, dict[str, dict]]] = []

    def snapshot() -> dict[str, dict]:
        return {o["metadata"]["name"]: o["data"] for o in store.list(kind, "default").items}

    marks.append((str(store.resource_version), snapshot()))
    for op, index, value in ops:
        name = f"c{index}"
        current = store.find(kind, "default", name)
        if op == "create" and current is None:
            store.create(kind, "default", {"metadata": {"name": name}, "data": {"v": value}})
        elif op == "update" and current is not None:
            current["data"] = {"v": value}
            store.update(kind, "default", name, current)
        elif op == "delete" and current is not None:
            store.delete(kind, "default", name)
        elif op == "mark":
            marks.append((str(store.resource_version), snapshot()))
    final = snapshot()
    for version, state in marks:
        replayed = dict(state)
        with store.watch(kind, "default", resource_version=version) as (events, _):
            for event in events:
                name = event.object["metadata"]["name"]
                if event.type == "DELETED":
                    replayed.pop(name, None)
                else:
                    replayed[name] = event.object["data"]
        assert replayed == final
