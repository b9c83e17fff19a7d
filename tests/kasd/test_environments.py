"""The environments shell in-process: discovery documents (kubesim's, both forms) read into the
kinds to list; a Secret never leaves with its values; a watch set over a fake agent API (kasd's
``AgentApi`` is the seam) that re-lists on 410 Gone and on a broken stream, and takes in a Pod whose
ReplicaSet's event came after it."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import attrs
import pytest
import trio
import trio.testing

from kasd.agentclient import AgentApi, AgentRequestError, Answer, AnswerTooLarge
from kasd.environments import Update, Viewer, ViewLimits
from kasd.environments.discover import discover
from kasd.environments.kinds import (
    DISCOVERY_ACCEPT,
    SKIPPED,
    ApiKind,
    from_aggregated,
    from_resource_list,
    legacy_group_versions,
    listable,
)
from kasd.environments.objects import sanitize, sanitize_answer
from kasd.environments.watching import WatchSet
from kubesim import discovery
from kubesim.resources import Registry

pytestmark = pytest.mark.timeout(10)

LABELS = {"app.gitlab.com/project_id": "42", "app.gitlab.com/environment_slug": "production"}
AGENT = Viewer(agent_id=7, identity=None, key="agent")


@attrs.frozen
class Env:
    id: int = 1
    project_id: int = 42
    slug: str = "production"
    namespaces: tuple[str, ...] = ("prod",)


def test_aggregated_and_legacy_discovery_list_the_same_kinds_and_leave_out_what_no_one_deploys() -> None:
    registry = Registry()
    aggregated = from_aggregated(discovery.aggregated(registry, core=True, api_version="apidiscovery.k8s.io/v2")) + \
        from_aggregated(discovery.aggregated(registry, core=False, api_version="apidiscovery.k8s.io/v2"))
    legacy = []
    for group, version in legacy_group_versions(discovery.api_versions("x"), discovery.api_group_list(registry)):
        doc = discovery.api_resource_list(registry, group, version)
        assert doc is not None
        legacy += from_resource_list(group, version, doc)
    assert listable(aggregated) == listable(legacy)
    names = {(k.group, k.kind, k.version) for k in listable(aggregated)}
    assert {("apps", "Deployment", "v1"), ("", "Pod", "v1"), ("discovery.k8s.io", "EndpointSlice", "v1"),
            ("autoscaling", "HorizontalPodAutoscaler", "v2"), ("", "Secret", "v1")} <= names
    assert ("autoscaling", "HorizontalPodAutoscaler", "v1") not in names  # one version per kind: the preferred
    plurals = {(k.group, k.plural) for k in listable(aggregated)}
    assert not plurals & set(SKIPPED) and ("", "namespaces") not in plurals  # cluster-scoped
    assert ("authorization.k8s.io", "localsubjectaccessreviews") not in plurals  # create only
    assert "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList" in DISCOVERY_ACCEPT


def test_a_secret_leaves_the_shell_without_its_values_wherever_they_hide() -> None:
    applied = json.dumps({"apiVersion": "v1", "kind": "Secret", "data": {"password": "czNjcmV0"}})
    secret = {"metadata": {"name": "db", "namespace": "prod", "managedFields": [{"manager": "kubectl"}],
                           "annotations": {"kubectl.kubernetes.io/last-applied-configuration": applied, "keep": "me"}},
              "data": {"password": "czNjcmV0"}, "stringData": {"token": "s3cret"}, "type": "Opaque"}
    for out in (sanitize(secret, api_version="v1", kind="Secret"),
                sanitize_answer({"kind": "SecretList", "apiVersion": "v1", "metadata": {}, "items": [secret]})["items"][0],
                sanitize_answer({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "Secret", **secret}})["object"],
                sanitize_answer({"apiVersion": "v1", "kind": "Secret", **secret})):
        assert "czNjcmV0" not in repr(out) and "s3cret" not in repr(out)
        assert out["metadata"]["annotations"] == {"keep": "me"} and "managedFields" not in out["metadata"]
        assert out["type"] == "Opaque"
    # a ConfigMap keeps its data; only managedFields go
    config_map = sanitize({"metadata": {"name": "c", "managedFields": []}, "data": {"a": "b"}},
                          api_version="v1", kind="ConfigMap")
    assert config_map["data"] == {"a": "b"} and "managedFields" not in config_map["metadata"]


# ----------------------------------------------------------------------------- a fake agent API


def _discovery_doc(core: bool) -> dict[str, Any]:
    def resource(plural: str, kind: str, group: str) -> dict[str, Any]:
        return {"resource": plural, "responseKind": {"group": group, "version": "v1", "kind": kind},
                "scope": "Namespaced", "verbs": ["get", "list", "watch"]}
    if core:
        return {"kind": "APIGroupDiscoveryList", "items": [{"metadata": {}, "versions": [
            {"version": "v1", "resources": [resource("pods", "Pod", "")]}]}]}
    return {"kind": "APIGroupDiscoveryList", "items": [{"metadata": {"name": "apps"}, "versions": [
        {"version": "v1", "resources": [resource("deployments", "Deployment", "apps"),
                                        resource("replicasets", "ReplicaSet", "apps")]}]}]}


@attrs.define
class _Answer:
    status: int
    chunks_from: trio.MemoryReceiveChannel[bytes] | None
    body: bytes = b""

    async def chunks(self, max_bytes: int = 65536) -> AsyncIterator[bytes]:
        if self.chunks_from is None:
            yield self.body
            return
        async for chunk in self.chunks_from:
            if chunk == b"BREAK":
                raise AgentRequestError(502, "tunnel to agent 7 failed: reset")
            yield chunk


class FakeApi:
    """Discovery, lists from ``objects`` (at resourceVersion ``version``), and a watch per path
    whose lines the test sends (``b"BREAK"`` breaks the stream)."""

    def __init__(self) -> None:
        self.objects: dict[str, list[dict[str, Any]]] = {"pods": [], "replicasets": [], "deployments": []}
        self.version = 10
        self.lists: list[str] = []
        self.watching: dict[str, trio.MemorySendChannel[bytes]] = {}
        self.watch_opened = trio.Event()

    async def request(self, agent_id: int, method: str, target: str, body: Any = None, **_: Any) -> Answer:
        path = urlsplit(target).path
        if path in ("/api", "/apis"):
            return Answer(200, _discovery_doc(path == "/api"))
        self.lists.append(path)
        plural = path.rsplit("/", 1)[1]
        return Answer(200, {"kind": "List", "metadata": {"resourceVersion": str(self.version)},
                            "items": [dict(o) for o in self.objects[plural]]})

    @asynccontextmanager
    async def open(self, agent_id: int, method: str, target: str, body: Any = None, **_: Any) -> AsyncIterator[_Answer]:
        parts = urlsplit(target)
        assert parse_qs(parts.query)["watch"] == ["1"]
        send, receive = trio.open_memory_channel[bytes](100)
        self.watching[parts.path] = send
        self.watch_opened.set()
        yield _Answer(200, receive)

    async def send(self, plural: str, event: str, obj: Mapping[str, Any]) -> None:
        await self.watching[f"/api{'s/apps' if plural != 'pods' else ''}/v1/namespaces/prod/{plural}"].send(
            json.dumps({"type": event, "object": obj}).encode() + b"\n")


def _obj(kind: str, name: str, uid: str, *, owner: str | None = None, labels: Mapping[str, str] | None = None,
         rv: int = 1) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "prod", "uid": uid, "resourceVersion": str(rv)}
    if labels:
        meta["labels"] = dict(labels)
    if owner:
        meta["ownerReferences"] = [{"uid": owner, "controller": True}]
    return {"apiVersion": "apps/v1" if kind != "Pod" else "v1", "kind": kind, "metadata": meta}


async def _next(updates: AsyncIterator[Update]) -> Update:
    return await updates.__anext__()


async def test_a_watch_set_relists_on_410_gone_and_on_a_broken_stream_and_takes_in_a_pod_before_its_replicaset(
        autojump_clock: trio.testing.MockClock) -> None:
    api = FakeApi()
    api.objects["deployments"] = [_obj("Deployment", "hello", "d1", labels=LABELS)]
    watch_set = WatchSet(cast(AgentApi, api), Env(), AGENT, ViewLimits(backoff=(0.5, 2.0)))
    updates = watch_set.join()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_set.run)
        first = await _next(updates)
        assert first.type == "RESYNC" and first.snapshot is not None
        assert [o["metadata"]["name"] for o in first.snapshot.objects] == ["hello"]
        while len(api.watching) < 3:
            await api.watch_opened.wait()
            api.watch_opened = trio.Event()
        # a new ReplicaSet's pod comes first: kept aside, then taken in with its ReplicaSet
        await api.send("pods", "ADDED", _obj("Pod", "hello-1-a", "p1", owner="r1", rv=11))
        await api.send("pods", "ADDED", _obj("Pod", "other-a", "p9", owner="r9", rv=12))
        await api.send("replicasets", "ADDED", _obj("ReplicaSet", "hello-1", "r1", owner="d1", rv=13))
        seen = [await _next(updates), await _next(updates)]
        assert [(u.type, u.object["metadata"]["name"]) for u in seen if u.object] == [
            ("ADDED", "hello-1"), ("ADDED", "hello-1-a")]
        await api.send("pods", "DELETED", _obj("Pod", "hello-1-a", "p1", owner="r1", rv=14))
        deleted = await _next(updates)
        assert deleted.type == "DELETED" and deleted.object and deleted.object["metadata"]["name"] == "hello-1-a"
        # 410 Gone (the API server's ERROR event): a new list, a RESYNC
        api.objects["replicasets"] = [_obj("ReplicaSet", "hello-1", "r1", owner="d1")]
        lists = len(api.lists)
        broken_before = api.watching["/apis/apps/v1/namespaces/prod/replicasets"]
        await api.send("deployments", "ERROR", {"kind": "Status", "code": 410, "reason": "Expired"})
        resync = await _next(updates)
        assert resync.type == "RESYNC" and resync.snapshot is not None and len(api.lists) > lists
        assert sorted(o["metadata"]["name"] for o in resync.snapshot.objects) == ["hello", "hello-1"]
        # a broken stream (the tunnel reset): a new list, a RESYNC
        path = "/apis/apps/v1/namespaces/prod/replicasets"
        while api.watching[path] is broken_before:
            await api.watch_opened.wait()
            api.watch_opened = trio.Event()
        await api.watching[path].send(b"BREAK")
        again = await _next(updates)
        assert again.type == "RESYNC"
        assert watch_set.discoveries == 3
        nursery.cancel_scope.cancel()


async def test_while_the_agent_is_away_viewers_are_told_so_and_the_set_tries_again_with_backoff(
        autojump_clock: trio.testing.MockClock) -> None:
    api = FakeApi()
    api.objects["deployments"] = [_obj("Deployment", "hello", "d1", labels=LABELS)]
    away: list[float] = []
    answer = api.request

    async def unreachable(agent_id: int, method: str, target: str, *args: Any, **kwargs: Any) -> Answer:
        if target == "/api":
            away.append(trio.current_time())
        if trio.current_time() < 3.5:  # the agent comes back after 3.5 s
            raise AgentRequestError(503, "agent 7 is not connected: no tunnel to it within 5 s")
        return await answer(agent_id, method, target, *args, **kwargs)

    api.request = unreachable  # type: ignore[method-assign]
    watch_set = WatchSet(cast(AgentApi, api), Env(), AGENT, ViewLimits(backoff=(1.0, 30.0)))
    updates = watch_set.join()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_set.run)
        first = await _next(updates)
        assert first.type == "RESYNC" and first.snapshot is not None and first.snapshot.objects == ()
        assert [p.message for p in first.snapshot.problems] == ["agent 7 is not connected: no tunnel to it within 5 s"]
        while True:
            update = await _next(updates)
            assert update.type == "RESYNC" and update.snapshot is not None
            if update.snapshot.objects:
                break
        assert [o["metadata"]["name"] for o in update.snapshot.objects] == ["hello"]
        assert update.snapshot.problems == ()
        assert [round(b - a) for a, b in itertools.pairwise(away)] == [1, 2, 4]  # doubling waits
        nursery.cancel_scope.cancel()


async def test_a_list_page_over_the_byte_limit_is_asked_again_for_fewer_objects() -> None:
    api = FakeApi()
    api.objects["deployments"] = [_obj("Deployment", f"hello-{i}", f"d{i}", labels=LABELS) for i in range(5)]
    limits_seen: list[int] = []
    answer = api.request

    async def paged(agent_id: int, method: str, target: str, *args: Any, **kwargs: Any) -> Answer:
        query = parse_qs(urlsplit(target).query)
        if "deployments" in target:
            limit = int(query["limit"][0])
            limits_seen.append(limit)
            if limit > 2:  # big objects: only two fit in an answer
                raise AnswerTooLarge(502, f"agent 7 answered GET {urlsplit(target).path} with more than 8 bytes")
        return await answer(agent_id, method, target, *args, **kwargs)

    api.request = paged  # type: ignore[method-assign]
    found = await discover(cast(AgentApi, api), Env(), AGENT, ViewLimits(page_size=8))
    assert limits_seen == [8, 4, 2] and found.snapshot.problems == ()
    assert len(found.snapshot.objects) == 5


def test_a_name_the_api_server_would_refuse_is_never_put_into_a_path() -> None:
    """A Pod (as the cluster answered it) naming a ConfigMap ``..``, a Secret ``?`` or a claim
    ``a/b``, or a PVC naming a volume ``..``: no GET is made for them, since each would name another
    path (``/api/v1/namespaces/ns/secrets/?`` is the list of every Secret); good names still are."""
    from kasd.environments.objects import references

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
           "spec": {"serviceAccountName": "runner", "volumes": [
               {"name": "a", "configMap": {"name": ".."}}, {"name": "b", "secret": {"secretName": "?"}},
               {"name": "c", "persistentVolumeClaim": {"claimName": "a/b"}},
               {"name": "d", "configMap": {"name": "settings"}}]}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "c", "namespace": "ns"},
           "spec": {"volumeName": ".."}}
    assert references([pod, pvc]) == {("", "configmaps", "ns", "settings"), ("", "serviceaccounts", "ns", "runner")}


async def test_a_kind_that_was_not_listed_in_time_is_listed_and_watched_again_within_seconds(
        autojump_clock: trio.testing.MockClock) -> None:
    api = FakeApi()
    api.objects["deployments"] = [_obj("Deployment", "hello", "d1", labels=LABELS)]
    answer = api.request
    slow = [True]

    async def busy(agent_id: int, method: str, target: str, *args: Any, **kwargs: Any) -> Answer:
        if slow[0] and urlsplit(target).path.endswith("/deployments"):
            slow[0] = False
            await trio.sleep(60)  # the first list of Deployments does not come in time (many views opening at once)
        return await answer(agent_id, method, target, *args, **kwargs)

    api.request = busy  # type: ignore[method-assign]
    watch_set = WatchSet(cast(AgentApi, api), Env(), AGENT, ViewLimits(backoff=(1.0, 30.0)))
    updates = watch_set.join()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_set.run)
        first = await _next(updates)
        assert first.snapshot is not None and first.snapshot.objects == ()
        assert [(p.kind, p.reason) for p in first.snapshot.problems] == [("Deployment", "timeout")]
        began = trio.current_time()
        with trio.fail_after(30):  # (before: only at the periodic discovery, 5 minutes later)
            second = await _next(updates)
        assert second.snapshot is not None and [o["metadata"]["name"] for o in second.snapshot.objects] == ["hello"]
        assert second.snapshot.problems == () and trio.current_time() - began < 5
        while "/apis/apps/v1/namespaces/prod/deployments" not in api.watching:  # and now it is watched
            await api.watch_opened.wait()
            api.watch_opened = trio.Event()
        nursery.cancel_scope.cancel()


def test_the_views_figures_are_kasd_metrics() -> None:
    from kasd.environments import ViewsStatistics
    from kasd.metrics import Metrics
    from routing.local import TunnelRegistry

    metrics = Metrics(TunnelRegistry())
    metrics.enable_environment_views(lambda: ViewsStatistics(
        watch_sets=2, viewers=5, watches_opened=30, discoveries=3, viewers_dropped=1, snapshots_discovered=4,
        snapshots_shared=1, snapshots_from_views=6))
    lines = set(metrics.render().decode().splitlines())
    assert {"kasd_environment_watch_sets 2.0", "kasd_environment_viewers 5.0",
            "kasd_environment_watches_opened_total 30.0", "kasd_environment_discoveries_total 3.0",
            "kasd_environment_viewers_dropped_total 1.0", 'kasd_environment_snapshots_total{answered_by="discovery"} 4.0',
            'kasd_environment_snapshots_total{answered_by="shared"} 1.0',
            'kasd_environment_snapshots_total{answered_by="view"} 6.0'} <= lines


def test_a_chain_of_owners_the_tenant_wrote_costs_one_pass_in_discovery_and_in_a_watch_set() -> None:
    # 4,999 Jobs each owned by the one before, the first by a labelled Deployment, listed (and
    # watched) child first: before, discovery scanned every object once per link (9 s of a blocked
    # event loop) and the watch set adopted them one Python frame per link (a RecursionError after
    # 10 s); now both are one walk over an index.
    import time

    from kasd.environments.objects import member_ids

    def job(i: int) -> dict[str, Any]:
        owner = "d1" if i == 0 else f"j{i - 1}"
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": f"job-{i}", "namespace": "prod", "uid": f"j{i}", "ownerReferences": [{"uid": owner}]}}

    jobs = [job(i) for i in reversed(range(4999))]
    deployment = _obj("Deployment", "hello", "d1", labels=LABELS)
    began = time.perf_counter()
    assert len(member_ids([*jobs, deployment], 42, "production")) == 5000
    watch_set = WatchSet(cast(AgentApi, FakeApi()), Env(), AGENT, ViewLimits())
    updates = watch_set.join()
    for obj in jobs:
        watch_set._apply("ADDED", obj)
    watch_set._apply("ADDED", deployment)
    assert len(watch_set.members) == 5000 and not watch_set.candidates
    assert time.perf_counter() - began < 2.0
    assert watch_set.dropped == 1  # (the viewer's queue of 64 overflowed: dropped, as designed)
    assert updates.too_slow


async def test_an_answer_or_a_watch_line_nested_deeper_than_pythons_stack_is_unreadable_not_a_crash() -> None:
    # A custom resource whose schema keeps unknown fields (a HelmRelease's values) may nest 10,000
    # deep on a real API server; Python's JSON parser raises RecursionError past ~1,000, which no
    # caller of AgentApi.request or the watch expected (discovery failed with it).
    from kasd.environments.watching import _Resync

    deep = b'{"kind":"HelmRelease","spec":{"values":' + b"[" * 5000 + b"]" * 5000 + b"}}"

    class DeepStream:
        def __init__(self) -> None:
            self.sent = False

        async def send_all(self, data: bytes) -> None: ...
        async def send_eof(self) -> None: ...
        async def aclose(self) -> None: ...

        async def receive_some(self, max_bytes: int) -> bytes:
            if self.sent:
                return b""
            self.sent = True
            return deep

    api = AgentApi(cast(Any, None))
    import kasd.agentclient as agentclient

    async def open_stream(router: Any, agent_id: int, metadata: Any) -> DeepStream:
        return DeepStream()

    async def response_head(router: Any, stream: Any, agent_id: int) -> Any:
        return attrs.make_class("Head", ["status", "headers"])(200, (("content-type", "application/json"),))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agentclient, "open_stream", open_stream)
        patch.setattr(agentclient, "response_head", response_head)
        answer = await api.request(7, "GET", "/apis/helm.toolkit.fluxcd.io/v2/namespaces/prod/helmreleases",
                                   max_bytes=1 << 20)
    assert answer.status == 200 and answer.body == {}
    watch_set = WatchSet(cast(AgentApi, FakeApi()), Env(), AGENT, ViewLimits())
    kind = ApiKind("helm.toolkit.fluxcd.io", "v2", "HelmRelease", "helmreleases", True, ("list", "watch"))
    with pytest.raises(_Resync):
        watch_set._event(kind, b'{"type":"ADDED","object":' + deep + b"}", "1")


async def test_an_environment_of_many_namespaces_is_listed_and_watched_in_its_first_32_and_says_so(
        autojump_clock: trio.testing.MockClock) -> None:
    # 100 deployments × 32 namespaces each: before, every discovery listed every kind in all of
    # them, and a viewer opened a watch per watched kind in each — thousands of tunnel streams.
    api = FakeApi()
    api.objects["deployments"] = [_obj("Deployment", "hello", "d1", labels=LABELS)]
    many = Env(namespaces=tuple(f"ns-{i:04}" for i in range(3200)))
    watch_set = WatchSet(cast(AgentApi, api), many, AGENT, ViewLimits())
    updates = watch_set.join()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_set.run)
        first = await _next(updates)
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    assert first.snapshot is not None
    assert [p.message for p in first.snapshot.problems] == [
        "the environment has 3200 namespaces: only the first 32 are listed and watched"]
    namespaces = {path.split("/")[-2] for path in [*api.lists, *api.watching]}
    assert namespaces == set(many.namespaces[:32])
    assert len(api.watching) == 3 * 32 and watch_set.discoveries == 1  # (a limit is no reason to relist)


async def test_an_environment_over_max_objects_is_not_discovered_again_every_30_seconds(
        autojump_clock: trio.testing.MockClock) -> None:
    api = FakeApi()
    api.objects["deployments"] = [_obj("Deployment", f"hello-{i}", f"d{i}", labels=LABELS) for i in range(5)]
    watch_set = WatchSet(cast(AgentApi, api), Env(), AGENT, ViewLimits(max_objects=3))
    updates = watch_set.join()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_set.run)
        first = await _next(updates)
        await trio.sleep(290)  # (before: a new discovery after 1, 2, 4, 8, 16, 30, 30… s)
        nursery.cancel_scope.cancel()
    assert first.snapshot is not None and len(first.snapshot.objects) == 3
    assert [p.message for p in first.snapshot.problems] == ["more than 3 objects: the rest are left out"]
    assert watch_set.discoveries == 1


async def test_a_cluster_serving_100000_kinds_costs_one_bounded_discovery_with_a_bounded_list_of_problems(
        autojump_clock: trio.testing.MockClock) -> None:
    # An 8 MiB discovery document names ~100,000 kinds (a hostile cluster, or CRDs by the thousand)
    # whose lists never answer: before, a task per (kind, namespace) started at once and a problem
    # for each one not listed, in every snapshot and SSE event.
    api = FakeApi()
    many = [{"resource": f"things{i}", "responseKind": {"kind": f"Thing{i:06}"}, "scope": "Namespaced",
             "verbs": ["list", "watch"]} for i in range(100_000)]
    plain = api.request
    started = 0

    async def request(agent_id: int, method: str, target: str, *args: Any, **kwargs: Any) -> Answer:
        nonlocal started
        if urlsplit(target).path == "/apis":
            return Answer(200, {"kind": "APIGroupDiscoveryList", "items": [
                {"metadata": {"name": "a.example.com"}, "versions": [{"version": "v1", "resources": many}]},
                *_discovery_doc(False)["items"]]})
        if "a.example.com" in target:
            started += 1
            await trio.sleep_forever()
        return await plain(agent_id, method, target, *args, **kwargs)

    api.request = request  # type: ignore[method-assign]
    with trio.fail_after(60):
        found = await discover(cast(AgentApi, api), Env(namespaces=("a", "b")), AGENT, ViewLimits())
    problems = [p.message for p in found.snapshot.problems]
    assert len(problems) == 100 and problems[0] == (
        "the cluster serves 100003 kinds: only the first 1000 are listed")
    assert {"/apis/apps/v1/namespaces/a/deployments", "/api/v1/namespaces/b/pods"} <= set(api.lists)
    assert problems[-1].startswith("and ") and problems[-1].endswith(" more problems")
    assert started <= 1000 * 2


async def test_a_secret_is_read_as_json_however_its_path_is_spelled() -> None:
    # The API server decodes %-escapes in a path: "/%73ecrets/" is the Secrets, and an answer in
    # YAML is passed through as sent (not stripped): the shell must ask for JSON there too.
    from kasd.environments import EnvironmentViews

    asked: list[str] = []

    class Api:
        async def request(self, agent_id: int, method: str, target: str, body: Any = None, *, accept: str,
                          **_: Any) -> Answer:
            asked.append(accept)
            return Answer(200, {"apiVersion": "v1", "kind": "Secret", "data": {"password": "czNjcmV0"},
                                "metadata": {"name": "db"}})

    views = EnvironmentViews(cast(Any, None))
    views.api = cast(AgentApi, Api())
    for target in ("/api/v1/namespaces/prod/secrets/db", "/api/v1/namespaces/prod/%73ecrets/db",
                   "/api/v1/namespaces/prod/secret%73/db", "/api/v1/%73ecrets"):
        answer = await views.request(AGENT, "GET", target, accept="application/yaml")
        assert b"czNjcmV0" not in answer.raw
    assert asked == ["application/json"] * 4
