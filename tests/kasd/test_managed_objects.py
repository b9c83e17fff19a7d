"""Whose objects are whose, without a kasd: ``kasd.managed.objects`` decides from an object as the
API answered it, the plan and whether kasd recorded making it — what a first request records, what
a stop deletes or keeps — so each rule is checked here on plain dicts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kasd.authz.expand import RoleRef
from kasd.authz.templates import USED_BY, VARIABLES, ManagedResources, render, rules_objects
from kasd.managed.objects import (
    MAX_USERS,
    binding_list_path,
    dry_run_refusal,
    joining,
    leaving,
    plan_resources,
    resource_of,
    role_lookup,
    role_refusal,
    unnamed_bindings,
    user_of,
    users_of,
)
from kasd.seams import ProvisionError

pytestmark = pytest.mark.timeout(10)


def _objects(slug: str, project_id: int = 42, roles: tuple[RoleRef, ...] = ()) -> list[Any]:
    variables: dict[str, str | int] = {v: "" for v in VARIABLES}
    variables |= {"agent.id": 7, "project.id": project_id, "environment.slug": slug, "environment.name": slug}
    return list(render(rules_objects("app-42", [f"gitlab:project_env:{project_id}:{slug}"], slug, roles), variables))


def _plan(slug: str = "review-a", project_id: int = 42) -> ManagedResources:
    objects = _objects(slug, project_id)
    return ManagedResources(agent_id=7, project_id=project_id, environment=slug, slug=slug, source="rules",
                            namespace="app-42", objects=tuple(objects))


def _as_read(obj: Any, users: list[str] | None, **meta: Any) -> dict[str, Any]:
    """``obj`` as the API would answer it: a UID, a resourceVersion, and the record ``users``."""
    metadata = {**obj["metadata"], "uid": "u-1", "resourceVersion": "9", **meta}
    if users is not None:
        metadata["annotations"] = {**(metadata.get("annotations") or {}), USED_BY: json.dumps(users)}
    return {**obj, "metadata": metadata}


def test_the_plan_is_applied_namespace_first_and_a_dry_run_404_inside_it_waits_for_its_creation() -> None:
    plan = _plan()
    (namespace, _), (binding, _) = plan_resources(plan)
    assert (namespace.describe(), binding.describe()) == ("Namespace app-42", "RoleBinding app-42/gitlab-job-access-review-a")
    assert dry_run_refusal(plan, binding, 404, "namespaces \"app-42\" not found", {"app-42"}) is None
    refused = dry_run_refusal(plan, binding, 403, "forbidden", set())
    assert refused is not None and (refused.status, refused.message) == (
        403, "cannot create RoleBinding app-42/gitlab-job-access-review-a for this job's environment (agent 7, dry run): "
             "forbidden")
    assert dry_run_refusal(plan, namespace, 500, "boom", set()).status == 502  # type: ignore[union-attr]


def test_a_missing_role_is_the_jobs_422_naming_the_role() -> None:
    plan = _plan()
    binding, obj = plan_resources(plan)[1]
    role = role_lookup(binding, obj)
    assert role is not None and role.path == "/apis/rbac.authorization.k8s.io/v1/clusterroles/admin"
    error = role_refusal(plan, binding, role, 404, "not found")
    assert (error.status, error.message) == (422, "cannot create RoleBinding app-42/gitlab-job-access-review-a for "
                                                  "this job's environment (agent 7): it grants ClusterRole 'admin', "
                                                  "which the cluster does not have")


def test_an_object_kasd_did_not_record_making_is_used_as_it_is_and_never_written_or_deleted() -> None:
    plan = _plan()
    namespace, obj = plan_resources(plan)[0]
    forged = _as_read(obj, [user_of(_plan("other"))])  # kasd's mark and labels, written by someone else
    assert joining(forged, plan, namespace, made=False).record is None
    assert joining(forged, plan, namespace, made=False).ours is False
    assert leaving(forged, plan, namespace, made=False).kept == "not-made-by-kasd"


def test_a_first_request_records_its_environment_once_and_a_full_record_is_a_409() -> None:
    plan, other = _plan(), _plan("review-b")
    namespace, obj = plan_resources(plan)[0]
    join = joining(_as_read(obj, [user_of(other)]), plan, namespace, made=True)
    assert join.ours and join.record is not None
    assert users_of(join.record) == ["7:42:review-b", "7:42:review-a"]
    assert join.record["metadata"]["resourceVersion"] == "9"  # written only over what was read
    assert joining(_as_read(obj, [user_of(plan)]), plan, namespace, made=True).record is None
    full = _as_read(obj, [f"7:42:e{i}" for i in range(MAX_USERS)])
    with pytest.raises(ProvisionError) as caught:
        joining(full, plan, namespace, made=True)
    assert caught.value.status == 409 and "stop some of them" in caught.value.message
    with pytest.raises(ProvisionError, match="is being deleted"):
        joining(_as_read(obj, [user_of(other)], deletionTimestamp="now"), plan, namespace, made=True)


def test_another_projects_namespace_is_joined_but_its_objects_are_not() -> None:
    theirs, plan = _plan(project_id=43), _plan()
    (namespace, ns_obj), (binding, binding_obj) = plan_resources(theirs)
    assert not joining(_as_read(ns_obj, ["7:43:review-a"]), plan, namespace, made=True).ours
    assert joining(_as_read(ns_obj, ["7:43:review-a"]), plan, namespace, made=True).record is not None
    # a namespace is shared (recorded on, nothing placed in it); another project's object is not
    assert joining(_as_read(binding_obj, ["7:43:review-a"]), plan, binding, made=True) == type(
        joining(_as_read(binding_obj, ["7:43:review-a"]), theirs, binding, made=True))(ours=False)


def test_a_stop_removes_only_its_own_user_and_deletes_only_as_the_last() -> None:
    plan, other = _plan(), _plan("review-b")
    namespace, obj = plan_resources(plan)[0]
    shared = leaving(_as_read(obj, [user_of(plan), user_of(other)]), plan, namespace, made=True)
    assert shared.delete is None and shared.record is not None and users_of(shared.record) == [user_of(other)]
    last = leaving(_as_read(obj, [user_of(plan)]), plan, namespace, made=True)
    assert last.delete is not None and last.delete["preconditions"] == {"uid": "u-1", "resourceVersion": "9"}
    assert leaving(_as_read(obj, [user_of(other)]), plan, namespace, made=True).kept == "used-by-another-environment"
    assert leaving(_as_read(obj, None), plan, namespace, made=True).kept == "users-not-recorded"
    binding, binding_obj = plan_resources(plan)[1]  # an older binding without a record goes by its label
    assert leaving(_as_read(binding_obj, None), plan, binding, made=True).delete is not None


def test_a_stop_finds_the_environments_bindings_its_plan_no_longer_names() -> None:
    plan = _plan()
    stale = _objects("review-a", roles=(RoleRef("ClusterRole", "edit"),))[1]  # roles: edited since
    foreign = {"metadata": {"name": "mine", "labels": {}}}
    named = plan.objects[1]
    found = unnamed_bindings(plan, "app-42", [stale, foreign, named, "junk"])
    assert [r.describe() for r in found] == ["RoleBinding app-42/gitlab-job-access-review-a.clusterrole.edit"]
    assert unnamed_bindings(plan, "app-42", {"not": "a list"}) == []
    assert binding_list_path(plan, "app-42").startswith(
        "/apis/rbac.authorization.k8s.io/v1/namespaces/app-42/rolebindings?labelSelector=kasd.gitlab-agent.io%2Fmanaged-by%3Dkasd%2C")
    assert resource_of(stale).name == "gitlab-job-access-review-a.clusterrole.edit"
