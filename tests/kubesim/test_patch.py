"""The three patch flavours, sans I/O."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubesim.errors import ApiError
from kubesim.patch import apply_patch, json_patch, merge_patch, strategic_merge

DEPLOYMENT: dict[str, Any] = {
    "metadata": {"name": "web", "labels": {"app": "web"}, "finalizers": ["a"]},
    "spec": {"replicas": 1, "template": {"spec": {"containers": [
        {"name": "main", "image": "nginx:1", "ports": [{"containerPort": 80}],
         "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
        {"name": "side", "image": "busybox"},
    ]}}},
}


def test_merge_patch_sets_and_deletes() -> None:
    out = merge_patch(DEPLOYMENT, {"metadata": {"labels": {"app": None, "tier": "x"}}, "spec": {"replicas": 3}})
    assert out["metadata"]["labels"] == {"tier": "x"}
    assert out["spec"]["replicas"] == 3
    assert DEPLOYMENT["metadata"]["labels"] == {"app": "web"}


def test_merge_patch_replaces_lists() -> None:
    out = merge_patch(DEPLOYMENT, {"spec": {"template": {"spec": {"containers": [{"name": "only"}]}}}})
    assert out["spec"]["template"]["spec"]["containers"] == [{"name": "only"}]


def test_json_patch_operations() -> None:
    ops = [
        {"op": "replace", "path": "/spec/replicas", "value": 2},
        {"op": "add", "path": "/metadata/labels/tier", "value": "front"},
        {"op": "remove", "path": "/spec/template/spec/containers/1"},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "b"},
        {"op": "copy", "from": "/metadata/name", "path": "/metadata/labels/name"},
        {"op": "move", "from": "/metadata/labels/app", "path": "/metadata/labels/moved"},
        {"op": "test", "path": "/spec/replicas", "value": 2},
    ]
    out = json_patch(DEPLOYMENT, ops)
    assert out["spec"]["replicas"] == 2
    assert out["metadata"]["labels"] == {"tier": "front", "name": "web", "moved": "web"}
    assert [c["name"] for c in out["spec"]["template"]["spec"]["containers"]] == ["main"]
    assert out["metadata"]["finalizers"] == ["a", "b"]


def test_json_patch_failures_are_422() -> None:
    with pytest.raises(ApiError) as failed:
        json_patch(DEPLOYMENT, [{"op": "test", "path": "/spec/replicas", "value": 9}])
    assert failed.value.code == 422
    with pytest.raises(ApiError):
        json_patch(DEPLOYMENT, [{"op": "replace", "path": "/nope/deeper", "value": 1}])


def test_strategic_merge_by_keys() -> None:
    patch = {"spec": {"template": {"spec": {"containers": [
        {"name": "main", "image": "nginx:2", "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]},
    ]}}}}
    out = strategic_merge(DEPLOYMENT, patch)
    main, side = out["spec"]["template"]["spec"]["containers"]
    assert main["image"] == "nginx:2" and side["name"] == "side"
    assert main["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}, {"name": "C", "value": "4"}]
    assert main["ports"] == [{"containerPort": 80}]


def test_strategic_merge_directives() -> None:
    patch = {
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]},
        "spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "side"}, {"name": "main"}],
            "containers": [{"name": "main", "env": [{"name": "A", "$patch": "delete"}]}],
        }}},
    }
    out = strategic_merge(DEPLOYMENT, patch)
    assert out["metadata"]["finalizers"] == []
    containers = out["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["side", "main"]
    assert containers[1]["env"] == [{"name": "B", "value": "2"}]
    replaced = strategic_merge(DEPLOYMENT, {"spec": {"template": {"spec": {"containers": [
        {"name": "new", "image": "x"}, {"$patch": "replace"}]}}}})
    assert replaced["spec"]["template"]["spec"]["containers"] == [{"name": "new", "image": "x"}]
    deleted_map = strategic_merge(DEPLOYMENT, {"metadata": {"labels": {"$patch": "delete"}}})
    assert deleted_map["metadata"]["labels"] == {}


def test_patch_types_by_content_type() -> None:
    assert apply_patch("application/merge-patch+json", DEPLOYMENT, {"spec": {"replicas": 5}}, custom=False)["spec"]["replicas"] == 5
    with pytest.raises(ApiError) as custom:
        apply_patch("application/strategic-merge-patch+json", DEPLOYMENT, {}, custom=True)
    assert custom.value.code == 415
    with pytest.raises(ApiError) as server_side:
        apply_patch("application/apply-patch+yaml", DEPLOYMENT, None, custom=False)
    assert server_side.value.code == 415 and "server-side apply" in server_side.value.message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=2), children, max_size=3),
    max_leaves=10)
json_objects = st.dictionaries(st.text(max_size=2), json_values, max_size=4)


@given(json_objects, json_objects)
def test_merge_patch_is_idempotent(target: dict[str, Any], patch: dict[str, Any]) -> None:
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once
    assert merge_patch(target, {}) == target


@given(json_objects)
def test_strategic_merge_with_itself_is_identity_for_maps(obj: dict[str, Any]) -> None:
    nulls_removed = merge_patch({}, obj)
    assert strategic_merge(copy.deepcopy(nulls_removed), {}) == nulls_removed
