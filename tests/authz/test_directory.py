"""The directory kasd's config declares: lookups, inherited roles, and every declaration mistake
named by its key path (through kasd's own config loader, as an operator meets it)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from kasd.authz.directory import Directory, DirectoryError, Group, Role
from kasd.config import ConfigError, config_from_mapping, directory_of

pytestmark = pytest.mark.timeout(10)

HASH = "a" * 64

DOC: dict[str, Any] = {
    "agents": [{"id": 1, "name": "prod", "config_project": "acme/infra", "token_sha256": HASH}],
    "groups": [
        {"path": "acme", "id": 10},
        {"path": "acme/web", "id": 11},
        {"path": "acme/web/frontend", "id": 12},
        {"path": "other", "id": 20},
    ],
    "projects": [
        {"path": "acme/infra", "id": 42},
        {"path": "acme/web/shop", "id": 43},
        {"path": "acme/web/frontend/ui", "id": 44},
        {"path": "other/tool", "id": 45},
        {"path": "carol/scratch", "id": 46},
    ],
    "users": [
        {"username": "alice", "id": 7, "memberships": {"acme/web": "developer", "acme/web/shop": "Maintainer"}},
        {"username": "bob", "memberships": {"acme": "guest", "acme/web/frontend": "reporter"}},
        {"username": "carol"},
    ],
}


@pytest.fixture
def directory() -> Directory:
    return directory_of(config_from_mapping(copy.deepcopy(DOC)))


def test_lookups_ignore_case_as_gitlab_paths_do(directory: Directory) -> None:
    project = directory.project("ACME/Web/Shop")
    assert project is not None and (project.path, project.id) == ("acme/web/shop", 43)
    assert directory.project_by_id(45) == directory.project("other/tool")
    assert directory.group("Acme/WEB") == Group(path="acme/web", id=11)
    assert directory.project("acme/web") is None  # a group is not a project
    assert directory.user("ALICE") is not None and directory.user("nobody") is None
    agent = directory.agent(1)
    assert agent is not None and agent.config_project == "acme/infra"


def test_ancestors_are_every_prefix_group_root_first(directory: Directory) -> None:
    ui = directory.project("acme/web/frontend/ui")
    assert ui is not None
    assert [g.id for g in directory.ancestors(ui)] == [10, 11, 12]
    personal = directory.project("carol/scratch")
    assert personal is not None and directory.ancestors(personal) == []


@pytest.mark.parametrize(
    ("user", "project", "role"),
    [
        ("alice", "acme/web/shop", Role.MAINTAINER),  # own membership beats the group's developer
        ("alice", "acme/web/frontend/ui", Role.DEVELOPER),  # inherited from acme/web
        ("alice", "acme/infra", None),  # acme/web covers nothing beside it
        ("alice", "other/tool", None),
        ("bob", "acme/infra", Role.GUEST),  # from the root group
        ("bob", "acme/web/frontend/ui", Role.REPORTER),  # the highest along the chain
        ("bob", "acme/web/shop", Role.GUEST),
        ("carol", "acme/infra", None),
        ("nobody", "acme/infra", None),
        ("alice", "no/such", None),
    ],
)
def test_role_of_is_the_highest_along_the_chain(directory: Directory, user: str, project: str,
                                                 role: Role | None) -> None:
    assert directory.role_of(user, project) == role


def test_group_roles_cover_subgroups(directory: Directory) -> None:
    roles = {g.path: r for g, r in directory.group_roles("bob").items()}
    assert roles == {"acme": Role.GUEST, "acme/web": Role.GUEST, "acme/web/frontend": Role.REPORTER}
    roles = {g.path: r for g, r in directory.group_roles("alice").items()}
    assert roles == {"acme/web": Role.DEVELOPER, "acme/web/frontend": Role.DEVELOPER}
    assert directory.group_roles("carol") == {}


def test_roles_and_below() -> None:
    assert [r.label for r in Role.DEVELOPER.and_below()] == ["guest", "reporter", "developer"]


def _mutated(change: Any) -> dict[str, Any]:
    doc = copy.deepcopy(DOC)
    change(doc)
    return doc


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["groups"].append({"path": "ACME", "id": 13}), "groups[4].path: 'ACME' is already groups[0]"),
        (lambda d: d["groups"].append({"path": "third", "id": 10}), "groups[4].id: group id 10 is already groups[0]'s"),
        (lambda d: d["groups"].append({"path": "x/y", "id": 14}),
         "groups[4].path: 'x/y' is a subgroup of 'x', which is not declared under groups:"),
        (lambda d: d["projects"].append({"path": "acme/infra", "id": 50}), "projects[5].path: 'acme/infra' is already projects[0]"),
        (lambda d: d["projects"].append({"path": "acme/web", "id": 50}), "projects[5].path: 'acme/web' is already groups[1]"),
        (lambda d: d["projects"].append({"path": "acme/new", "id": 42}), "projects[5].id: project id 42 is already projects[0]'s"),
        (lambda d: d["projects"].append({"path": "acme/nope/app", "id": 51}),
         "projects[5].path: the group 'acme/nope' of project 'acme/nope/app' is not declared under groups:"),
        (lambda d: d["projects"].append({"path": "lonely", "id": 52}), "projects[5].path: 'lonely' names no namespace"),
        (lambda d: d["projects"].append({"path": "acme/../etc", "id": 53}), "projects[5].path: 'acme/../etc' is not a path"),
        (lambda d: d["users"][0]["memberships"].update({"acme/ghost": "developer"}),
         "users[0].memberships.acme/ghost: 'acme/ghost' is neither a declared group nor a declared project"),
        (lambda d: d["users"][1]["memberships"].update({"acme": "admin"}),
         "users[1].memberships.acme: must be one of guest, reporter, developer, maintainer, owner, got 'admin'"),
        (lambda d: d["users"].append({"username": "Alice"}), "users[3].username: 'Alice' is already users[0]"),
        (lambda d: d["users"].append({"username": "bad name"}), "users[3].username: must be a GitLab username"),
        (lambda d: d["users"][2].update({"id": 0}), "users[2].id: must be a positive integer, got 0"),
        (lambda d: d["users"][2].update({"memberships": ["acme"]}), "users[2].memberships: must be a mapping"),
        (lambda d: d["groups"][0].pop("id"), "groups[0].id: missing"),
    ],
)
def test_declaration_mistakes_name_their_key(change: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(_mutated(change))
    assert str(info.value).startswith(message), str(info.value)


def test_with_authorization_every_agent_config_project_must_be_declared(tmp_path: Path) -> None:
    doc = _mutated(lambda d: d.update(authorization={"config_root": str(tmp_path)}))
    assert config_from_mapping(doc).authorization.config_root == tmp_path
    doc["agents"][0]["config_project"] = "acme/elsewhere"
    with pytest.raises(ConfigError, match=r"^agents\[0\]\.config_project: 'acme/elsewhere' is not declared under projects:"):
        config_from_mapping(doc)
    # without authorization.config_root (every agent has GitLab's default configuration) an agent's
    # config project need not be declared: no project's jobs are allowed then
    doc.pop("authorization")
    assert config_from_mapping(doc).agents[0].config_project == "acme/elsewhere"


def test_config_root_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^authorization\.config_root: directory '.*missing' does not exist"):
        config_from_mapping({"authorization": {"config_root": str(tmp_path / "missing")}})
    with pytest.raises(ConfigError, match=r"^authorization\.tokens\.audit: unknown key"):
        config_from_mapping({"authorization": {"tokens": {"audit": 1}}})


def test_build_without_the_config() -> None:
    directory = Directory.build()
    assert directory.project("a/b") is None and directory.groups == ()
    with pytest.raises(DirectoryError) as info:
        Directory.build(agents=[_Agent(), _Agent()])
    assert (info.value.key, info.value.problem) == ("agents[1].id", "agent id 1 is already used by agents[0]")


class _Agent:
    id = 1
    name = "a"
    config_project = "g/p"
