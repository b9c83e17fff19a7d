"""kubesim over plain HTTP/1.1, byte for byte where clients are picky: discovery, OpenAPI,
tables, auth, watch streams with bookmarks."""

from __future__ import annotations

import functools
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
import trio

from kubesim.server import KubeSim, open_kubesim

TOKEN = "http-token"
pytestmark = pytest.mark.timeout(20)


def fetch(sim: KubeSim, path: str, *, accept: str = "application/json", token: str | None = TOKEN,
          method: str = "GET", body: Any = None, content_type: str = "application/json",
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(sim.url + path, method=method, headers={"Accept": accept, **(headers or {})})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        request.data = json.dumps(body).encode()
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


async def get(sim: KubeSim, path: str, **kwargs: Any) -> tuple[int, dict[str, str], Any]:
    status, headers, body = await trio.to_thread.run_sync(functools.partial(fetch, sim, path, **kwargs))
    try:
        return status, headers, json.loads(body)
    except ValueError:
        return status, headers, body


async def test_public_endpoints_and_auth() -> None:
    async with open_kubesim(token=TOKEN) as sim:
        status, _, body = await get(sim, "/healthz", token=None)
        assert (status, body) == (200, b"ok")
        status, _, version = await get(sim, "/version", token=None)
        assert status == 200 and version["gitVersion"] == "v1.32.0"
        status, _, denied = await get(sim, "/api/v1/pods", token=None)
        assert status == 401 and denied["reason"] == "Unauthorized" and denied["kind"] == "Status"
        status, _, _ = await get(sim, "/version", token="wrong")
        assert status == 401
        status, _, missing = await get(sim, "/apis/nope.example.com/v1")
        assert status == 404 and missing["reason"] == "NotFound"


async def test_discovery_documents() -> None:
    async with open_kubesim(token=TOKEN) as sim:
        _, _, api = await get(sim, "/api")
        assert api["kind"] == "APIVersions" and api["versions"] == ["v1"]
        _, _, core = await get(sim, "/api/v1")
        assert core["kind"] == "APIResourceList" and core["groupVersion"] == "v1"
        names = {r["name"] for r in core["resources"]}
        assert {"pods", "pods/log", "pods/exec", "pods/attach", "namespaces", "services"} <= names
        _, _, groups = await get(sim, "/apis")
        assert groups["kind"] == "APIGroupList"
        assert {g["name"] for g in groups["groups"]} >= {"apps", "batch", "autoscaling",
                                                         "networking.k8s.io", "discovery.k8s.io",
                                                         "apiextensions.k8s.io"}
        aggregated = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
        _, headers, doc = await get(sim, "/apis", accept=aggregated)
        assert headers["content-type"] == "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
        assert doc["kind"] == "APIGroupDiscoveryList" and doc["apiVersion"] == "apidiscovery.k8s.io/v2"
        apps = next(i for i in doc["items"] if i["metadata"]["name"] == "apps")
        deployments = next(r for r in apps["versions"][0]["resources"] if r["resource"] == "deployments")
        assert deployments["scope"] == "Namespaced" and deployments["shortNames"] == ["deploy"]
        assert {s["subresource"] for s in deployments["subresources"]} == {"status", "scale"}


async def test_openapi_documents() -> None:
    async with open_kubesim(token=TOKEN) as sim:
        _, _, root = await get(sim, "/openapi/v3")
        url = root["paths"]["apis/apps/v1"]["serverRelativeURL"]
        assert url.startswith("/openapi/v3/apis/apps/v1?hash=")
        _, _, doc = await get(sim, url)
        schemas = doc["components"]["schemas"]
        deployment = schemas["io.k8s.api.apps.v1.Deployment"]
        assert deployment["x-kubernetes-group-version-kind"] == [{"group": "apps", "version": "v1", "kind": "Deployment"}]
        containers = schemas["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]
        assert containers["x-kubernetes-patch-merge-key"] == "name"
        patch = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
        assert "fieldValidation" in {p["name"] for p in patch["parameters"]}
        _, _, v2 = await get(sim, "/openapi/v2")
        assert v2["swagger"] == "2.0" and "io.k8s.api.core.v1.Pod" in v2["definitions"]


async def test_lists_tables_and_strict_validation() -> None:
    async with open_kubesim(token=TOKEN) as sim:
        status, _, created = await get(sim, "/api/v1/namespaces/default/configmaps", method="POST",
                                       body={"metadata": {"name": "one"}, "data": {"a": "b"}})
        assert status == 201 and created["kind"] == "ConfigMap"
        _, _, listed = await get(sim, "/api/v1/namespaces/default/configmaps")
        assert listed["kind"] == "ConfigMapList" and listed["apiVersion"] == "v1"
        assert int(listed["metadata"]["resourceVersion"]) >= int(created["metadata"]["resourceVersion"])
        table_accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        _, _, table = await get(sim, "/api/v1/namespaces/default/configmaps", accept=table_accept)
        assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
        assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Data", "Age"]
        row = next(r for r in table["rows"] if r["cells"][0] == "one")
        assert row["cells"][1] == 1 and row["object"]["kind"] == "PartialObjectMetadata"
        status, _, refused = await get(sim, "/api/v1/namespaces/default/configmaps?fieldValidation=Strict",
                                       method="POST", body={"metadata": {"name": "two"}, "dta": {}})
        assert status == 400 and 'unknown field "dta"' in refused["message"]
        status, headers, _ = await get(sim, "/api/v1/namespaces/default/configmaps?fieldValidation=Warn",
                                       method="POST", body={"metadata": {"name": "three"}, "dta": {}})
        assert status == 201 and headers["warning"] == '299 - "unknown field \\"dta\\""'
        status, _, ssa = await get(sim, "/api/v1/namespaces/default/configmaps/one", method="PATCH",
                                   body={}, content_type="application/apply-patch+yaml")
        assert status == 415 and "server-side apply" in ssa["message"]


async def test_a_dry_run_stores_nothing_and_only_all_is_a_dry_run() -> None:
    async with open_kubesim(token=TOKEN) as sim:
        path = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"
        pdb = {"metadata": {"name": "web"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}}
        before = sim.store.statistics()
        status, _, created = await get(sim, path + "?dryRun=All", method="POST", body=pdb)
        assert status == 201 and created["kind"] == "PodDisruptionBudget" and created["metadata"]["uid"]
        assert created["metadata"]["resourceVersion"] == ""
        assert sim.store.statistics() == before
        status, _, missing = await get(sim, path + "/web")
        assert status == 404 and missing["reason"] == "NotFound"
        for value in ("all", ""):
            status, _, refused = await get(sim, path + f"?dryRun={value}", method="POST", body=pdb)
            assert status == 422 and refused["reason"] == "Invalid", refused
            assert refused["message"] == (f'CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: '
                                          f'[]string{{"{value}"}}: supported values: "All"')
            assert refused["details"]["causes"] == [
                {"reason": "FieldValueNotSupported", "field": "dryRun",
                 "message": f'Unsupported value: []string{{"{value}"}}: supported values: "All"'}]
        assert sim.store.statistics() == before


async def test_watch_stream_with_bookmarks_and_initial_events() -> None:
    async with open_kubesim(token=TOKEN, bookmark_interval=0.05) as sim:
        kind = sim.store.kind("", "configmaps")
        sim.store.create(kind, "default", {"metadata": {"name": "before"}})

        def read_events(path: str, count: int) -> tuple[str, list[dict[str, Any]]]:
            request = urllib.request.Request(sim.url + path, headers={"Authorization": f"Bearer {TOKEN}"})
            with urllib.request.urlopen(request, timeout=10) as response:
                events = [json.loads(response.readline()) for _ in range(count)]
                return response.headers["Content-Type"], events

        path = ("/api/v1/namespaces/default/configmaps?watch=1&allowWatchBookmarks=true"
                "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=5")
        content_type, events = await trio.to_thread.run_sync(read_events, path, 4)
        assert content_type == "application/json"
        assert [e["type"] for e in events[:3]] == ["ADDED", "ADDED", "BOOKMARK"]
        assert events[2]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
        assert events[3]["type"] == "BOOKMARK"
        from_zero = "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=0&timeoutSeconds=1"
        _, first = await trio.to_thread.run_sync(read_events, from_zero, 1)
        assert first[0]["type"] == "ADDED"


async def test_a_bug_answers_an_internal_error_status(monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_kubesim(token=TOKEN) as sim:
        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("simulated bug")

        monkeypatch.setattr(sim.store, "list", broken)
        status, _, body = await get(sim, "/api/v1/namespaces/default/configmaps")
        assert status == 500 and body["reason"] == "InternalError"
        assert "simulated bug" in body["message"]
        status, _, _ = await get(sim, "/version")
        assert status == 200


async def test_a_spdy_upgrade_gets_a_status_saying_kubesim_does_not_speak_spdy() -> None:
    spdy = {"Upgrade": "SPDY/3.1", "X-Stream-Protocol-Version": "portforward.k8s.io"}
    async with open_kubesim(token=TOKEN) as sim:
        pods = "/api/v1/namespaces/default/pods"
        # Port-forward is served now (SPDY on a raw upgrade, test_port_forward.py); an upgrade
        # kubesim cannot take over (urllib's, Connection: close) is refused saying what works, once
        # the API server's own checks passed: a missing pod is a 404 first.
        status, _, body = await get(sim, f"{pods}/web/portforward", method="POST", headers=spdy)
        assert status == 404 and body["message"] == 'pods "web" not found'
        sim.store.create(sim.store.kind("", "pods"), "default",
                         {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
        await sim.store.wait_for(lambda: (sim.store.find(sim.store.kind("", "pods"), "default", "web") or {})
                                 .get("spec", {}).get("nodeName"))
        status, _, body = await get(sim, f"{pods}/web/portforward", method="POST", headers=spdy)
        assert status == 400 and body["kind"] == "Status" and body["reason"] == "BadRequest"
        assert body["message"].startswith("kubesim does not support SPDY: port-forward works over WebSocket only")
        # exec and attach report what the kubelet would refuse first (here: no such pod) ...
        status, _, body = await get(sim, f"{pods}/nope/exec?command=true", method="POST", headers=spdy)
        assert status == 404 and body["message"] == 'pods "nope" not found'
        # ... and a request that is no upgrade at all gets the API server's own answer.
        status, _, body = await get(sim, f"{pods}/web/portforward", method="POST")
        assert status == 400 and body["message"] == "Upgrade request required"


async def test_plain_http2_with_prior_knowledge() -> None:
    import h2.config
    import h2.connection
    import h2.events

    async with open_kubesim(token=TOKEN) as sim:
        stream = await trio.open_tcp_stream("127.0.0.1", sim.port)
        async with stream:
            conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            conn.initiate_connection()
            conn.send_headers(1, [(":method", "GET"), (":path", "/api/v1/namespaces"),
                                  (":scheme", "http"), (":authority", f"127.0.0.1:{sim.port}"),
                                  ("authorization", f"Bearer {TOKEN}"), ("accept", "application/json")],
                              end_stream=True)
            await stream.send_all(conn.data_to_send())
            status, body, done = "", b"", False
            with trio.fail_after(10):
                while not done:
                    data = await stream.receive_some()
                    assert data
                    for event in conn.receive_data(data):
                        if isinstance(event, h2.events.ResponseReceived):
                            status = dict(event.headers)[b":status"].decode()
                        elif isinstance(event, h2.events.DataReceived):
                            body += event.data
                            conn.acknowledge_received_data(event.flow_controlled_length, 1)
                        elif isinstance(event, h2.events.StreamEnded):
                            done = True
                    await stream.send_all(conn.data_to_send())
        assert status == "200" and json.loads(body)["kind"] == "NamespaceList"
        assert sim.requests[-1].http_version == "2"
