"""Environments through the tunnel, end to end: a real kasd, a real agentd and kubesim (its
controllers make the ReplicaSets, Pods and EndpointSlices; its RBAC refuses what a user may not
list), driven through ``kasd.environments.EnvironmentViews`` as the agent and as an impersonated
user: discovery finds the labelled objects and their unlabelled dependents, a forbidden kind is a
problem, watches shared by two viewers see a scale-up and a deletion, a slow viewer is dropped."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from agentd.kubeapi import kubeconfig_target
from kasctl.authsetup import AuthSetup
from kasd.config import config_from_mapping
from kasd.environments import EnvironmentViews, Update, Viewer, ViewerTooSlow, ViewLimits
from kasd.server import Runtime
from kasd.tokens import hash_token
from kubesim.server import KubeSim, open_kubesim
from tests.agentd.harness import AGENT_TOKEN, SIM_TOKEN, agent_config, running_agent
from tests.kasd.helpers import running_kasd, wait_sessions
from tunnelhttp.head import Impersonation

pytestmark = pytest.mark.timeout(30)

LABELS = {"app.gitlab.com/project_id": "42", "app.gitlab.com/environment_slug": "production"}


@attrs.frozen
class Env:
    id: int = 1
    project_id: int = 42
    slug: str = "production"
    namespaces: tuple[str, ...] = ("prod",)


AGENT = Viewer(agent_id=7, identity=None, key="agent")
ALICE = Viewer(agent_id=7, identity=Impersonation(user="alice", groups=("devs",)), key="user:alice")


def _objects() -> list[dict[str, Any]]:
    """A labelled Deployment (its pods use an unlabelled Secret) and Service, a labelled ConfigMap and
    custom resource,
    an unlabelled Deployment of someone else; alice may read everything in prod but ConfigMaps."""
    template = {"metadata": {"labels": {"app": "hello"}},
                "spec": {"containers": [{"name": "web", "image": "nginx",
                                         "envFrom": [{"secretRef": {"name": "hello-db"}}]}]}}
    rules = [{"apiGroups": ["", "apps", "discovery.k8s.io", "example.com", "batch", "networking.k8s.io", "autoscaling",
                            "policy", "rbac.authorization.k8s.io"],
              "resources": ["pods", "pods/log", "widgets", "services", "secrets", "serviceaccounts", "persistentvolumeclaims",
                            "deployments", "replicasets", "statefulsets", "daemonsets", "endpointslices", "jobs",
                            "cronjobs", "ingresses", "horizontalpodautoscalers", "poddisruptionbudgets",
                            "roles", "rolebindings", "podtemplates", "replicationcontrollers",
                            "resourcequotas", "limitranges", "networkpolicies"],
              "verbs": ["get", "list", "watch"]}]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "prod"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "no-configmaps", "namespace": "prod"}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "alice", "namespace": "prod"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-configmaps"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "hello", "namespace": "prod",
                                                                    "labels": LABELS},
         "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "hello"}}, "template": template}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hello", "namespace": "prod", "labels": LABELS},
         "spec": {"selector": {"app": "hello"}, "ports": [{"port": 80}]}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hello", "namespace": "prod",
                                                               "labels": LABELS}, "data": {"a": "b"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hello-db", "namespace": "prod"},
         "stringData": {"password": "s3cret-value"}},
        {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
         "metadata": {"name": "widgets.example.com"},
         "spec": {"group": "example.com", "scope": "Namespaced",
                  "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                  "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                      "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}},
        {"apiVersion": "example.com/v1", "kind": "Widget",
         "metadata": {"name": "w1", "namespace": "prod", "labels": LABELS}, "spec": {"size": 3}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "other", "namespace": "prod"},
         "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "other"}},
                  "template": {"metadata": {"labels": {"app": "other"}},
                               "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}},
    ]


@asynccontextmanager
async def _stack(tmp_path: Path, limits: ViewLimits) -> AsyncIterator[tuple[Runtime, KubeSim, EnvironmentViews]]:
    auth = AuthSetup(tmp_path / "auth")
    auth.agent_config("group/infra", "prod", "{}\n")
    config = config_from_mapping({
        "listeners": {"agent": {"address": "127.0.0.1:0"}, "observability": {"address": "127.0.0.1:0"},
                      "kubernetes_api": {"address": "127.0.0.1:0"}},
        "agents": [{"id": 7, "name": "prod", "config_project": "group/infra", "token_sha256": hash_token(AGENT_TOKEN)}],
        "groups": [{"path": "group", "id": 10}],
        "projects": [{"path": "group/infra", "id": 1}, {"path": "group/app", "id": 42}],
        **auth.kasd_settings(), "agent_wait_timeout": 5, "shutdown_timeout": 5,
    })
    async with open_kubesim(token=SIM_TOKEN, bookmark_interval=3600, objects=_objects()) as sim, \
            running_kasd(config) as kasd, trio.open_nursery() as nursery:
        sim.controllers.reconcile()
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        async with running_agent(nursery, agent_config(tmp_path, kasd.agent_url),
                                 kubeconfig_target(tmp_path / "kubeconfig")):
            await wait_sessions(kasd, 7, 1)
            assert kasd.router is not None
            views = EnvironmentViews(kasd.router, limits=limits)
            await nursery.start(views.run)
            yield kasd, sim, views
        nursery.cancel_scope.cancel()


def _ids(objects: Any) -> set[str]:
    out = set()
    for o in objects:
        group = o["apiVersion"].rpartition("/")[0] if "/" in o["apiVersion"] else ""
        out.add(f"{group}/{o['kind']}/{o['metadata'].get('namespace', '')}/{o['metadata']['name']}")
    return out


class _Reader:
    """A viewer that keeps up: collects every update, and wakes ``until`` when its test holds."""

    def __init__(self) -> None:
        self.updates: list[Update] = []
        self.ids: set[str] = set()
        self._changed = trio.Event()

    async def read(self, updates: AsyncIterator[Update]) -> None:
        async for update in updates:
            self.updates.append(update)
            if update.type == "RESYNC":
                assert update.snapshot is not None
                self.ids = _ids(update.snapshot.objects)
            elif update.type == "DELETED":
                self.ids -= _ids([update.object])
            else:
                self.ids |= _ids([update.object])
            self._changed.set()
            self._changed = trio.Event()

    def last(self, ident: str) -> Mapping[str, Any]:
        """The latest state of ``ident`` this viewer was told of."""
        for update in reversed(self.updates):
            if update.object is not None and _ids([update.object]) == {ident}:
                return update.object
            if update.snapshot is not None:
                return next((o for o in update.snapshot.objects if _ids([o]) == {ident}), {})
        return {}

    async def until_last(self, ident: str, holds: Callable[[Mapping[str, Any]], bool]) -> None:
        while not holds(self.last(ident)):
            await self._changed.wait()

    async def until(self, holds: Callable[[set[str]], bool]) -> None:
        while not holds(self.ids):
            await self._changed.wait()


def _lists(sim: KubeSim) -> list[str]:
    """The paths kubesim was asked to list (no watch), in order."""
    return [r.path for r in sim.requests if r.method == "GET" and "watch=1" not in r.query
            and "labelSelector" in r.query]


async def _append(out: list[Any], value: Any) -> None:
    out.append(await value)


def _watches(sim: KubeSim) -> Counter[str]:
    """How many times kubesim was asked to watch each path."""
    return Counter(r.path for r in sim.requests if "watch=1" in r.query)


async def test_discovery_finds_the_labelled_objects_and_their_dependents_and_reports_a_forbidden_kind(
        tmp_path: Path) -> None:
    async with _stack(tmp_path, ViewLimits()) as (_, sim, views):
        snapshot = await views.snapshot(Env(), AGENT)
        ids = _ids(snapshot.objects)
        pods = {i for i in ids if i.startswith("/Pod/prod/hello-")}
        assert len(pods) == 2 and not any("other" in i for i in ids), ids
        assert {"apps/Deployment/prod/hello", "/Service/prod/hello", "/ConfigMap/prod/hello", "example.com/Widget/prod/w1",
                "/Secret/prod/hello-db", "/ServiceAccount/prod/default"} <= ids
        assert len([i for i in ids if i.startswith("apps/ReplicaSet/prod/hello-")]) == 1
        assert len([i for i in ids if i.startswith("discovery.k8s.io/EndpointSlice/prod/hello-")]) == 1
        secret = next(o for o in snapshot.objects if o["kind"] == "Secret")
        assert "data" not in secret and "stringData" not in secret and "s3cret" not in repr(snapshot)
        assert not any("managedFields" in o["metadata"] for o in snapshot.objects)
        assert snapshot.problems == () and snapshot.hint is None
        # as alice (impersonated by the agent): the same, but ConfigMaps are forbidden to her
        as_alice = await views.snapshot(Env(), ALICE)
        assert _ids(as_alice.objects) == ids - {"/ConfigMap/prod/hello"}
        problems = [(p.group, p.kind, p.namespace, p.reason) for p in as_alice.problems]
        assert problems == [("", "ConfigMap", "prod", "forbidden")], as_alice.problems
        assert 'User "alice" cannot list resource "configmaps"' in as_alice.problems[0].message
        assert any(r.impersonate.get("impersonate-user") == "alice" for r in sim.requests)
        # one object, as asked for in YAML: a Secret still comes as JSON, without its values
        secret_answer = await views.request(AGENT, "GET", "/api/v1/namespaces/prod/secrets/hello-db",
                                            accept="application/yaml")
        assert secret_answer.status == 200 and secret_answer.body["metadata"]["name"] == "hello-db"
        assert b"s3cret" not in secret_answer.raw and "data" not in secret_answer.body
        with pytest.raises(ValueError, match="watch"):
            await views.request(AGENT, "GET", "/api/v1/namespaces/prod/secrets?watch=1")
        # a pod's log, streamed; and only a pod's log
        pod = sorted(pods)[0].rsplit("/", 1)[1]
        async with views.stream(ALICE, f"/api/v1/namespaces/prod/pods/{pod}/log?container=web") as chunks:
            log = b"".join([chunk async for chunk in chunks])
        assert log, "kubesim's nginx container writes a log"
        with pytest.raises(ValueError, match="pod's log"):
            async with views.stream(AGENT, "/api/v1/namespaces/prod/secrets"):
                pass
        # nothing labelled for another environment: GitLab's message, naming both labels
        empty = await views.snapshot(Env(slug="staging"), AGENT)
        assert empty.objects == ()
        assert empty.hint is not None and empty.hint.startswith("There are no resources found for the environment.")
        assert "app.gitlab.com/project_id" in empty.hint and "app.gitlab.com/environment_slug" in empty.hint


async def test_two_viewers_share_one_watch_set_that_sees_a_scale_up_and_a_deletion_and_a_slow_viewer_is_dropped(
        tmp_path: Path) -> None:
    async with _stack(tmp_path, ViewLimits(viewer_queue=8)) as (_, sim, views):
        first, second = _Reader(), _Reader()
        async with trio.open_nursery() as nursery, views.watch(Env(), AGENT) as updates:
            nursery.start_soon(first.read, updates)
            with trio.fail_after(5):
                await first.until(lambda ids: "apps/Deployment/prod/hello" in ids)
            assert first.updates[0].type == "RESYNC"
            async with views.watch(Env(), AGENT) as updates2, views.watch(Env(), AGENT) as slow:
                nursery.start_soon(second.read, updates2)
                with trio.fail_after(5):
                    await second.until(lambda ids: ids == first.ids)
                assert second.updates[0].type == "RESYNC"
                stats = views.statistics()
                assert (stats.watch_sets, stats.viewers, stats.discoveries) == (1, 3, 1)
                # a snapshot while the view is live is its objects: no discovery; two at once for
                # a viewer key with no view share one discovery
                lists = len(_lists(sim))
                assert _ids((await views.snapshot(Env(), AGENT)).objects) == first.ids
                assert len(_lists(sim)) == lists
                answers: list[Any] = []
                async with trio.open_nursery() as both:
                    for _ in range(2):
                        both.start_soon(lambda: _append(answers, views.snapshot(Env(), ALICE)))
                assert answers[0] is answers[1] and answers[0].objects
                assert Counter(_lists(sim)[lists:]).most_common(1)[0][1] == 1  # each kind listed once
                stats = views.statistics()
                assert (stats.snapshots_from_views, stats.snapshots_discovered, stats.snapshots_shared) == (1, 1, 1)
                # scale up: the new pods (unlabelled, owned by the labelled Deployment's ReplicaSet) appear
                deployments = sim.store.kind("apps", "deployments")
                hello = sim.store.get(deployments, "prod", "hello")
                hello["spec"]["replicas"] = 5
                sim.store.update(deployments, "prod", "hello", hello)
                sim.controllers.reconcile()
                for reader in (first, second):
                    with trio.fail_after(5):
                        await reader.until(lambda ids: len([i for i in ids if i.startswith("/Pod/prod/hello-")]) == 5)
                # more changes than a viewer's queue holds: the one that never read fell behind and
                # was dropped; the others saw every change
                config_maps = sim.store.kind("", "configmaps")
                for n in range(12):
                    config_map = sim.store.get(config_maps, "prod", "hello")
                    config_map["data"] = {"n": str(n)}
                    sim.store.update(config_maps, "prod", "hello", config_map)
                for reader in (first, second):
                    with trio.fail_after(5):
                        await reader.until_last("/ConfigMap/prod/hello", lambda o: o.get("data") == {"n": "11"})
                    assert [u.object["data"]["n"] for u in reader.updates if u.object and
                            u.object["kind"] == "ConfigMap" and u.type == "MODIFIED"][-12:] == [str(n) for n in range(12)]
                with pytest.raises(ViewerTooSlow), trio.fail_after(5):
                    async for _ in slow:
                        pass
                assert views.statistics().viewers_dropped == 1  # (kasd_environment_viewers_dropped_total)
                services = sim.store.kind("", "services")
                sim.store.delete(services, "prod", "hello")
                sim.controllers.reconcile()
                for reader in (first, second):
                    with trio.fail_after(5):
                        await reader.until(lambda ids: "/Service/prod/hello" not in ids)
                # one set of watches for the three viewers: each path watched once, by one discovery
                watched = _watches(sim)
                assert watched and set(watched.values()) == {1}, watched
                assert sum(watched.values()) == views.statistics().watches_opened
                assert views.statistics().discoveries == 1
            nursery.cancel_scope.cancel()
        assert views.statistics().watch_sets == 0
