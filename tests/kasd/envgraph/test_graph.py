"""build_graph, rollup, tree_lines, dependents_to_fetch: on an environment kubesim made, on the
references each edge reads, and as properties over generated ownership data (hypothesis)."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kasd.envgraph import (
    DEGRADED,
    HEALTHY,
    MISSING,
    PROGRESSING,
    SUSPENDED,
    UNKNOWN,
    FetchRequest,
    Graph,
    Health,
    build_graph,
    dependents_to_fetch,
    node_id,
    rollup,
    tree_lines,
)

pytestmark = pytest.mark.timeout(30)

ENVIRONMENT = Path(__file__).parent / "shapes" / "kubesim-prod-environment.json"


def environment() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(ENVIRONMENT.read_text(encoding="utf-8"))["items"]
    return items


def obj(api_version: str, kind: str, name: str, namespace: str = "prod", *, uid: str | None = None,
        owners: list[dict[str, Any]] | None = None, labels: dict[str, str] | None = None,
        spec: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": uid or f"uid-{kind}-{namespace}-{name}"}
    if namespace:
        meta["namespace"] = namespace
    if owners is not None:
        meta["ownerReferences"] = owners
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spec or {}}


def ref(owner: Mapping[str, Any], *, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": controller}


def owns(graph: Graph) -> dict[str, str]:
    """child → owner"""
    parents: dict[str, str] = {}
    for edge in graph.edges:
        if edge.relation == "owns":
            assert edge.target not in parents, f"{edge.target} has two owners"
            parents[edge.target] = edge.source
    return parents


def linked(graph: Graph, relation: str) -> set[tuple[str, str]]:
    return {(e.source, e.target) for e in graph.edges if e.relation == relation}


# -- an environment as kubesim made it ---------------------------------------------------------------


def test_node_ids() -> None:
    assert node_id(obj("apps/v1", "Deployment", "hello")) == "apps/Deployment/prod/hello"
    assert node_id(obj("v1", "Pod", "hello-7d9-abc")) == "/Pod/prod/hello-7d9-abc"
    assert node_id(obj("v1", "PersistentVolume", "pv-1", "")) == "/PersistentVolume//pv-1"


def test_the_kubesim_environment_as_people_see_it() -> None:
    graph = build_graph(environment())
    tree = [("  " * depth) + i for depth, i in tree_lines(graph)]
    hello = [line for line in tree if "hello" in line and "/Pod/" not in line and "Slice" not in line]
    assert hello == ["/ConfigMap/prod/hello-config", "/Service/prod/hello",
                     "apps/Deployment/prod/hello", "  apps/ReplicaSet/prod/hello-r762dkrkm9",
                     "autoscaling/HorizontalPodAutoscaler/prod/hello", "networking.k8s.io/Ingress/prod/hello"]
    assert tree[tree.index("  apps/ReplicaSet/prod/hello-r762dkrkm9") + 1:][:2] == [
        "    /Pod/prod/hello-r762dkrkm9-6frdq", "    /Pod/prod/hello-r762dkrkm9-zb29k"]
    assert "  discovery.k8s.io/EndpointSlice/prod/hello-l2j5h" in tree
    assert {i for i, n in graph.nodes.items() if n.labelled} == {
        "/ConfigMap/prod/hello-config", "/Service/prod/hello", "apps/Deployment/prod/hello"}
    pods = {"/Pod/prod/hello-r762dkrkm9-6frdq", "/Pod/prod/hello-r762dkrkm9-zb29k"}
    assert linked(graph, "selects") == {(s, p) for s in ("/Service/prod/hello", "/Service/prod/public")
                                        for p in pods}
    assert linked(graph, "routes") == {("networking.k8s.io/Ingress/prod/hello", "/Service/prod/hello")}
    assert linked(graph, "scales") == {("autoscaling/HorizontalPodAutoscaler/prod/hello",
                                        "apps/Deployment/prod/hello")}
    assert {(p, "/ConfigMap/prod/hello-config") for p in pods} <= linked(graph, "uses")
    assert graph.health == Health(DEGRADED, "batch/Job/prod/broken: Job has reached the specified backoff limit")


def test_the_environment_is_judged_by_its_roots_as_argo_judges_an_application() -> None:
    """A crash-looping pod is Degraded itself, its Deployment Progressing until the progress
    deadline; a failed pod that its Job retried past, or a failed Job a CronJob keeps, does not hold
    the environment Degraded."""
    kept = ("crashy", "hello", "migrate", "hello-config", "default")
    crashing = [o for o in environment() if o["metadata"]["name"].startswith(kept)
                and o["kind"] not in ("HorizontalPodAutoscaler", "Ingress")]
    graph = build_graph(crashing)
    assert graph.nodes["/Pod/prod/crashy-rtnxqws6ds-x98q8"].health.status == DEGRADED
    assert graph.health == Health(PROGRESSING, "apps/Deployment/prod/crashy: Waiting for rollout to "
                                               "finish: 0 of 1 updated replicas are available...")
    cronjob = obj("batch/v1", "CronJob", "nightly", spec={"suspend": False})
    cronjob["status"] = {"lastScheduleTime": "2026-11-27T03:00:00Z", "lastSuccessfulTime": "2026-11-27T03:00:41Z"}
    failed_job = obj("batch/v1", "Job", "nightly-1", owners=[ref(cronjob)])
    failed_job["status"] = {"conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]}
    retried = obj("batch/v1", "Job", "migrate")
    retried["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    failed_pod = obj("v1", "Pod", "migrate-1", owners=[ref(retried)])
    failed_pod["status"] = {"phase": "Failed"}
    graph = build_graph([cronjob, failed_job, retried, failed_pod])
    assert {n.health.status for n in graph.nodes.values()} == {HEALTHY, DEGRADED}
    assert graph.health == Health(HEALTHY)
    orphan = build_graph([failed_pod])  # its owner not fetched: a root, and it counts
    assert orphan.health.status == DEGRADED


def test_to_json_is_the_contracts_shape() -> None:
    document = build_graph(environment()).to_json()
    assert list(document) == ["health", "nodes", "edges", "roots"]
    deployment = next(n for n in document["nodes"] if n["id"] == "apps/Deployment/prod/hello")
    assert deployment == {"id": "apps/Deployment/prod/hello", "group": "apps", "version": "v1",
                          "kind": "Deployment", "namespace": "prod", "name": "hello",
                          "uid": deployment["uid"], "labelled": True,
                          "created": deployment["created"], "health": {"status": HEALTHY, "message": ""}}
    assert deployment["uid"] and deployment["created"].endswith("Z")
    assert [n["id"] for n in document["nodes"]] == sorted(n["id"] for n in document["nodes"])
    assert document["edges"] == sorted(document["edges"], key=lambda e: (e["source"], e["target"], e["relation"]))
    assert set(document["edges"][0]) == {"source", "target", "relation"}
    assert '"spec":' not in json.dumps(document)  # no object bodies


# -- each reference ---------------------------------------------------------------------------------


def test_a_pod_uses_what_it_mounts_reads_and_pulls_with() -> None:
    pod = obj("v1", "Pod", "p", spec={
        "serviceAccountName": "runner",
        "imagePullSecrets": [{"name": "registry"}],
        "volumes": [
            {"name": "cfg", "configMap": {"name": "cm-vol"}},
            {"name": "sec", "secret": {"secretName": "sec-vol"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "claim"}},
            {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
            {"name": "all", "projected": {"sources": [{"configMap": {"name": "cm-proj"}},
                                                      {"secret": {"name": "sec-proj"}},
                                                      {"serviceAccountToken": {"path": "token"}}]}}],
        "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "sec-init"}}]}],
        "containers": [{"name": "c",
                        "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm-env", "key": "a"}}},
                                {"name": "B", "valueFrom": {"secretKeyRef": {"name": "sec-env", "key": "b"}}},
                                {"name": "C", "value": "plain"}],
                        "envFrom": [{"configMapRef": {"name": "cm-from"}}]}]})
    used = [("ConfigMap", n) for n in ("cm-vol", "cm-proj", "cm-env", "cm-from")] + [
        ("Secret", n) for n in ("sec-vol", "sec-proj", "sec-init", "sec-env", "registry")] + [
        ("PersistentVolumeClaim", "claim"), ("PersistentVolumeClaim", "p-scratch"),
        ("ServiceAccount", "runner")]
    others = [obj("v1", kind, name) for kind, name in used] + [obj("v1", "ConfigMap", "unused")]
    graph = build_graph([pod, *others])
    assert linked(graph, "uses") == {("/Pod/prod/p", f"/{kind}/prod/{name}") for kind, name in used}


def test_an_ingress_routes_to_every_backend_of_either_api() -> None:
    services = [obj("v1", "Service", n) for n in ("default", "web", "old", "elsewhere")]
    v1 = obj("networking.k8s.io/v1", "Ingress", "new", spec={
        "defaultBackend": {"service": {"name": "default", "port": {"number": 80}}},
        "rules": [{"http": {"paths": [{"path": "/", "backend": {"service": {"name": "web"}}},
                                      {"path": "/r", "backend": {"resource": {"kind": "Bucket", "name": "b"}}}]}}]})
    old = obj("extensions/v1beta1", "Ingress", "old", spec={
        "rules": [{"http": {"paths": [{"backend": {"serviceName": "old", "servicePort": 80}}]}}]})
    other_ns = obj("v1", "Service", "web", "staging")
    graph = build_graph([*services, v1, old, other_ns])
    assert linked(graph, "routes") == {
        ("networking.k8s.io/Ingress/prod/new", "/Service/prod/default"),
        ("networking.k8s.io/Ingress/prod/new", "/Service/prod/web"),
        ("extensions/Ingress/prod/old", "/Service/prod/old")}


def test_hpa_scales_its_target_and_pvc_binds_its_volume() -> None:
    deployment = obj("apps/v1", "Deployment", "web")
    hpa = obj("autoscaling/v2", "HorizontalPodAutoscaler", "web", spec={
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}})
    pvc = obj("v1", "PersistentVolumeClaim", "data", spec={"volumeName": "pv-1"})
    pv = obj("v1", "PersistentVolume", "pv-1", "")
    graph = build_graph([deployment, hpa, pvc, pv])
    assert linked(graph, "scales") == {("autoscaling/HorizontalPodAutoscaler/prod/web", "apps/Deployment/prod/web")}
    assert linked(graph, "binds") == {("/PersistentVolumeClaim/prod/data", "/PersistentVolume//pv-1")}


def test_an_endpointslice_without_owner_hangs_under_its_service_by_label() -> None:
    service = obj("v1", "Service", "web")
    mirrored = obj("discovery.k8s.io/v1", "EndpointSlice", "web-abc",
                   labels={"kubernetes.io/service-name": "web"})
    stray = obj("discovery.k8s.io/v1", "EndpointSlice", "gone-abc",
                labels={"kubernetes.io/service-name": "gone"})
    graph = build_graph([service, mirrored, stray])
    assert owns(graph) == {"discovery.k8s.io/EndpointSlice/prod/web-abc": "/Service/prod/web"}


def test_the_controller_reference_wins_and_owners_are_not_taken_across_namespaces() -> None:
    helper = obj("example.com/v1", "Helper", "h")
    rs = obj("apps/v1", "ReplicaSet", "rs")
    foreign = obj("apps/v1", "ReplicaSet", "rs", "staging")
    node = obj("v1", "Node", "n1", "")
    pod = obj("v1", "Pod", "p", owners=[ref(helper, controller=False), ref(rs)])
    stray = obj("v1", "Pod", "q", owners=[ref(foreign)])
    cluster_owned = obj("v1", "Pod", "r", owners=[ref(node)])
    nameless = obj("v1", "Pod", "s", owners=[{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs"}])
    graph = build_graph([helper, rs, foreign, node, pod, stray, cluster_owned, nameless])
    assert owns(graph) == {"/Pod/prod/p": "apps/ReplicaSet/prod/rs", "/Pod/prod/r": "/Node//n1",
                           "/Pod/prod/s": "apps/ReplicaSet/prod/rs"}
    assert "/Pod/prod/q" in graph.roots


def test_an_ownership_cycle_is_cut_at_its_smallest_id() -> None:
    a, b, c = (obj("example.com/v1", "Thing", n) for n in "abc")
    a["metadata"]["ownerReferences"] = [ref(c)]
    b["metadata"]["ownerReferences"] = [ref(a)]
    c["metadata"]["ownerReferences"] = [ref(b)]
    graph = build_graph([c, a, b])
    assert owns(graph) == {"example.com/Thing/prod/b": "example.com/Thing/prod/a",
                           "example.com/Thing/prod/c": "example.com/Thing/prod/b"}
    assert graph.roots == ("example.com/Thing/prod/a",)


def test_unidentifiable_objects_are_left_out_and_duplicates_are_one_node() -> None:
    older = obj("v1", "ConfigMap", "c")
    older["metadata"]["resourceVersion"] = "9"
    newer = json.loads(json.dumps(older))
    newer["metadata"]["resourceVersion"] = "10"
    newer["metadata"]["uid"] = "new"
    junk: list[Any] = [{"kind": "Pod"}, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a/b"}},
                       "not an object", {"apiVersion": "v1", "kind": "Pod", "metadata": []}]
    for objects in ([older, newer, *junk], [newer, *junk, older]):
        graph = build_graph(objects)
        assert list(graph.nodes) == ["/ConfigMap/prod/c"] and graph.nodes["/ConfigMap/prod/c"].uid == "new"


# -- rollup -----------------------------------------------------------------------------------------


def test_rollup_takes_argos_order_and_names_the_worst() -> None:
    assert rollup([]) == Health(MISSING, "nothing deployed")
    assert rollup([Health(HEALTHY, "fine"), Health(SUSPENDED)]) == Health(SUSPENDED)
    order = [HEALTHY, SUSPENDED, PROGRESSING, MISSING, DEGRADED, UNKNOWN]
    for worse_at, status in enumerate(order):
        assert rollup([("x", Health(s, "m")) for s in order[:worse_at + 1]]).status == status
    assert rollup([("b", Health(DEGRADED, "bad")), ("a", Health(DEGRADED, "")),
                   ("c", Health(PROGRESSING, "slow"))]) == Health(DEGRADED, "a; b: bad")
    many = rollup([(f"/Pod/prod/p{i:05}", Health(DEGRADED, "x" * 1000)) for i in range(10_000)])
    assert many.message.startswith("/Pod/prod/p00000: xxx") and many.message.endswith("(and 9997 more)")
    assert len(many.message) < 700
    assert rollup([Health("Weird")]).status == UNKNOWN
    assert rollup([Health(HEALTHY, "all good"), Health(HEALTHY)]) == Health(HEALTHY)


# -- dependents -------------------------------------------------------------------------------------


def _matches(selector: str | None, labels: Mapping[str, str]) -> bool:
    for term in (selector or "").split(","):
        if not term:
            continue
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _answer(request: FetchRequest, cluster: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the API would answer, filtered by owner as the shell does."""
    found = []
    for o in cluster:
        group = o["apiVersion"].rpartition("/")[0]
        meta = o["metadata"]
        if (group, o["kind"], meta.get("namespace", "")) != (request.group, request.kind, request.namespace):
            continue
        if request.name is not None and meta["name"] != request.name:
            continue
        if not _matches(request.label_selector, meta.get("labels", {})):
            continue
        if request.owner_uid and request.owner_uid not in {r["uid"] for r in meta.get("ownerReferences", [])}:
            continue
        found.append(o)
    return found


def test_discovery_reaches_the_unlabelled_dependents_in_a_few_rounds() -> None:
    cluster = environment()
    have = {node_id(o): o for o in cluster if "app.gitlab.com/project_id" in o["metadata"].get("labels", {})}
    made: set[FetchRequest] = set()
    rounds = 0
    while new := [r for r in dependents_to_fetch(have.values()) if r not in made]:
        rounds += 1
        made.update(new)
        for request in new:
            have.update((node_id(o), o) for o in _answer(request, cluster))
    assert rounds <= 4
    assert sorted(have) == [
        "/ConfigMap/prod/hello-config", "/Pod/prod/hello-r762dkrkm9-6frdq", "/Pod/prod/hello-r762dkrkm9-zb29k",
        "/Service/prod/hello", "/ServiceAccount/prod/default", "apps/Deployment/prod/hello",
        "apps/ReplicaSet/prod/hello-r762dkrkm9", "discovery.k8s.io/EndpointSlice/prod/hello-l2j5h"]
    first = dependents_to_fetch([o for o in cluster if node_id(o) == "apps/Deployment/prod/hello"])
    assert [(r.path(), r.label_selector) for r in first] == [("/apis/apps/v1/namespaces/prod/replicasets", "app=hello")]
    assert first[0].owner_uid == have["apps/Deployment/prod/hello"]["metadata"]["uid"]


def test_dependents_of_a_cronjob_a_claim_and_an_ingress() -> None:
    cronjob = obj("batch/v1", "CronJob", "nightly", uid="cj", spec={
        "jobTemplate": {"metadata": {"labels": {"team": "a"}}, "spec": {}}})
    bare = obj("batch/v1", "CronJob", "hourly", uid="cj2", spec={"jobTemplate": {"spec": {}}})
    pvc = obj("v1", "PersistentVolumeClaim", "data", spec={"volumeName": "pv-1"})
    ingress = obj("networking.k8s.io/v1", "Ingress", "web", spec={"defaultBackend": {"service": {"name": "web"}}})
    requests = dependents_to_fetch([cronjob, bare, pvc, ingress, "junk"])  # type: ignore[list-item]
    assert [(r.path(), r.label_selector, r.owner_uid) for r in requests] == [
        ("/apis/batch/v1/namespaces/prod/jobs", None, "cj2"),
        ("/apis/batch/v1/namespaces/prod/jobs", "team=a", "cj"),
        ("/api/v1/persistentvolumes/pv-1", None, None),
        ("/api/v1/namespaces/prod/services/web", None, None)]
    assert dependents_to_fetch([obj("v1", "Service", "web"), ingress])[0].kind == "EndpointSlice"


# -- properties over generated ownership ------------------------------------------------------------

KINDS = [("v1", "Pod"), ("apps/v1", "ReplicaSet"), ("apps/v1", "Deployment"), ("example.com/v1", "Thing")]


@st.composite
def forests(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Objects whose each has at most one owner, an earlier one (so: a forest), in one of two
    namespaces or cluster-scoped; some references point at objects not in the set."""
    count = draw(st.integers(1, 25))
    objects: list[dict[str, Any]] = []
    for i in range(count):
        api_version, kind = draw(st.sampled_from(KINDS))
        namespace = draw(st.sampled_from(["prod", "prod", "staging", ""]))
        o = obj(api_version, kind, f"o{i}", namespace, uid=f"u{i}")
        eligible = [p for p in objects if p["metadata"].get("namespace", "") in ("", namespace)]
        owners = []
        if len(eligible) > 0 and draw(st.booleans()):
            owners.append(ref(draw(st.sampled_from(eligible)), controller=draw(st.booleans())))
        if draw(st.booleans()):
            owners.append({"apiVersion": "v1", "kind": "Gone", "name": "gone", "uid": f"gone{i}"})
        draw(st.randoms()).shuffle(owners)
        o["metadata"]["ownerReferences"] = owners
        objects.append(o)
    return objects


@st.composite
def tangles(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Objects with any number of owner references to any of them: cycles, self-references."""
    count = draw(st.integers(1, 20))
    objects = [obj("example.com/v1", "Thing", f"t{i}", uid=f"u{i}") for i in range(count)]
    for o in objects:
        o["metadata"]["ownerReferences"] = [
            ref(objects[j], controller=draw(st.booleans()))
            for j in draw(st.lists(st.integers(0, count - 1), max_size=3))]
    return objects


def _acyclic(graph: Graph) -> None:
    parents = owns(graph)
    for start in graph.nodes:
        seen, node = set(), start
        while node in parents:
            assert node not in seen, f"ownership cycle through {node}"
            seen.add(node)
            node = parents[node]
    assert set(graph.roots) == set(graph.nodes) - set(parents)
    assert sorted(i for _, i in tree_lines(graph)) == sorted(graph.nodes)  # the forest reaches all


@settings(max_examples=40, deadline=None)
@given(objects=st.one_of(forests(), tangles()))
def test_the_owns_edges_are_a_forest(objects: list[dict[str, Any]]) -> None:
    _acyclic(build_graph(objects))


@settings(max_examples=40, deadline=None)
@given(objects=forests())
def test_every_object_with_an_owner_in_the_set_is_attached_once_to_it(objects: list[dict[str, Any]]) -> None:
    graph = build_graph(objects)
    by_uid = {o["metadata"]["uid"]: node_id(o) for o in objects}
    expected = {}
    for o in objects:
        present = [r for r in o["metadata"]["ownerReferences"] if r["uid"] in by_uid]
        if present:
            expected[node_id(o)] = by_uid[present[0]["uid"]]
    assert owns(graph) == expected


@settings(max_examples=40, deadline=None)
@given(objects=forests(), data=st.data())
def test_removing_an_owner_orphans_exactly_its_dependents(objects: list[dict[str, Any]], data: st.DataObject) -> None:
    before = build_graph(objects)
    gone = data.draw(st.sampled_from(objects))
    after = build_graph([o for o in objects if o is not gone])
    orphans = {child for child, owner in owns(before).items() if owner == node_id(gone)}
    assert set(after.roots) == (set(before.roots) - {node_id(gone)}) | orphans


@settings(max_examples=40, deadline=None)
@given(objects=st.one_of(forests(), tangles()), seed=st.integers(0, 2**32))
def test_to_json_does_not_depend_on_the_order_objects_came_in(objects: list[dict[str, Any]], seed: int) -> None:
    shuffled = [*objects, objects[0]]  # a duplicate too
    random.Random(seed).shuffle(shuffled)
    assert json.dumps(build_graph(objects).to_json()) == json.dumps(build_graph(shuffled).to_json())


# -- bounded cost -----------------------------------------------------------------------------------


def test_ten_thousand_owner_refs_and_selectors_over_ten_thousand_pods_stay_linear() -> None:
    """1,000 Services each selecting 10 of 10,000 pods (a naive match is 10,000,000 label checks),
    one Service selecting all of them, one object with 10,000 owner references."""
    pods = [obj("v1", "Pod", f"p{i}", labels={"app": f"a{i % 1000}", "tier": "web"}) for i in range(10_000)]
    services = [obj("v1", "Service", f"s{i}", spec={"selector": {"app": f"a{i}", "tier": "web"}})
                for i in range(1000)]
    everything = obj("v1", "Service", "all", spec={"selector": {"tier": "web"}})
    hoarder = obj("example.com/v1", "Thing", "t", owners=[ref(p, controller=False) for p in pods])
    started = time.perf_counter()
    graph = build_graph([*pods, *services, everything, hoarder])
    elapsed = time.perf_counter() - started
    assert len(linked(graph, "selects")) == 20_000
    assert owns(graph)["example.com/Thing/prod/t"] == "/Pod/prod/p0"
    assert elapsed < 10, f"build_graph took {elapsed:.1f}s"


def test_a_name_the_api_server_would_refuse_makes_no_request() -> None:
    """Names and labels come from the cluster's answers and go into a path or a query: one that
    could not be a name (``..``, ``a?b``, a selector with a comma in a value) must not become a
    different request (``/secrets/..`` is the list of every Secret)."""
    pod = obj("v1", "Pod", "p", spec={"volumes": [
        {"name": "a", "secret": {"secretName": ".."}},
        {"name": "b", "configMap": {"name": "cm?labelSelector=x"}},
        {"name": "c", "configMap": {"name": "fine"}}]})
    odd_ns = obj("v1", "Pod", "q", "prod/../kube-system", spec={"serviceAccountName": "sa"})
    rs = obj("apps/v1", "ReplicaSet", "rs", spec={"selector": {"matchLabels": {"app": "a,tier!=z"}}})
    expr = obj("apps/v1", "ReplicaSet", "rs2", spec={"selector": {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["a) or (b"]}]}})
    good = obj("apps/v1", "ReplicaSet", "rs3", spec={"selector": {"matchLabels": {"app.kubernetes.io/name": "web"}}})
    requests = dependents_to_fetch([pod, odd_ns, rs, expr, good])
    assert [(r.path(), r.label_selector) for r in requests] == [
        ("/api/v1/namespaces/prod/configmaps/fine", None),
        ("/api/v1/namespaces/prod/pods", "app.kubernetes.io/name=web")]


def test_a_resource_version_that_is_no_number_never_fails_the_graph() -> None:
    """The same object twice (two versions, or a re-list), one with a resourceVersion Python's
    ``isdigit`` takes but ``int`` refuses: the graph is still built, from the one with a number."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "n", "uid": "u"}}
    odd = {**pod, "metadata": {**pod["metadata"], "resourceVersion": "\u00b2"}}
    good = {**pod, "metadata": {**pod["metadata"], "resourceVersion": "7"}}
    for objects in ([odd, good], [good, odd]):
        graph = build_graph(objects)
        assert list(graph.nodes) == ["/Pod/n/a"]
