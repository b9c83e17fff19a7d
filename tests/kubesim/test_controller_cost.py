"""The controllers' cost: a pass over a settled cluster does no work per pair of objects (owner ×
child, Service × pod), so creating N objects one by one is not quadratic in the store's size."""

from __future__ import annotations

from typing import Any

import pytest

from kubesim import controllers, objects, selectors, workloads
from kubesim.controllers import Controllers
from kubesim.store import Store

pytestmark = pytest.mark.timeout(60)

N = 60


def _deployment(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"app.gitlab.com/project_id": "1"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}}}


def test_a_settled_pass_is_linear_in_the_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store()
    ctl = Controllers(store)
    for i in range(N):
        store.create(store.kind("apps", "deployments"), "default", _deployment(f"d{i}"))
        store.create(store.kind("", "services"), "default", {"metadata": {"name": f"d{i}"}, "spec": {
            "selector": {"app": f"d{i}"}, "ports": [{"port": 80}]}})
    ctl.reconcile()
    assert sum(1 for _ in store.iter_objects("", "pods", "default")) == N
    assert all(p["status"]["phase"] == "Running" for p in store.iter_objects("", "pods", "default"))

    calls = {"owned_by": 0, "template_hash": 0, "selector": 0}

    def counting(name: str, real: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    for module in (objects, workloads, controllers):
        if hasattr(module, "owned_by"):
            monkeypatch.setattr(module, "owned_by", counting("owned_by", objects.owned_by))
    monkeypatch.setattr(workloads, "template_hash", counting("template_hash", objects.template_hash))
    monkeypatch.setattr(controllers, "selector_from_match_labels",
                        counting("selector", selectors.selector_from_match_labels))
    before = store.resource_version
    ctl.reconcile()
    assert store.resource_version == before  # settled: nothing written
    # Not one check per (owner, child) pair, nor a template hash or a selector per object and pass.
    assert calls["owned_by"] < N, calls
    assert calls["template_hash"] == 0 and calls["selector"] == 0, calls
