"""The identities kasd knows, laid out as GitLab lays them out: groups, projects, users with their
roles, agents.

Standalone kasd has no GitLab to ask, so its config declares them (``groups:``, ``projects:``,
``users:`` and the existing ``agents:``; docs/authorization.md). ``Directory.build`` checks them as a
whole and raises ``DirectoryError`` naming the key path (``projects[2].path``) of the first problem;
``kasd.config`` turns that into a configuration error. Lookups by path are case-insensitive, as
GitLab's routes are.

Memberships are inherited as GitLab inherits them: a role in a group covers its subgroups and every
project beneath, and a user's role in a project or group is the highest of their own there and
those of every ancestor group.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import attrs

from daemonkit.yamldoc import describe, excerpt


class Role(enum.IntEnum):
    """GitLab's membership roles, by access level (``Gitlab::Access``)."""

    GUEST = 10
    REPORTER = 20
    DEVELOPER = 30
    MAINTAINER = 40
    OWNER = 50

    @property
    def label(self) -> str:
        """The lower-case name GitLab uses in impersonation groups (``developer``)."""
        return self.name.lower()

    def and_below(self) -> tuple[Role, ...]:
        """This role and every lower one, lowest first: what ``gitlab:project_role:<id>:<role>``
        lists, so an RBAC binding to ``…:developer`` also holds for maintainers and owners."""
        return tuple(role for role in Role if role <= self)


ROLE_NAMES = tuple(role.label for role in Role)


def parse_role(text: object) -> Role:
    """``developer`` (any case) → ``Role.DEVELOPER``; ``ValueError`` naming the choices."""
    if isinstance(text, str):
        for role in Role:
            if role.label == text.lower():
                return role
    raise ValueError(f"must be one of {', '.join(ROLE_NAMES)}, got {text!r}")


# GitLab's path segments: letters, digits, '_', '.', '-', not starting with '-' or '.'; '..' never
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_USERNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}")


def full_path_problem(path: object) -> str | None:
    """Why ``path`` is not a GitLab full path (``group/sub/project``), or None."""
    if not isinstance(path, str):
        return f"must be a path like group/project, got {describe(path)}"
    if not path:
        return "must not be empty"
    for segment in path.split("/"):
        if not _SEGMENT.fullmatch(segment) or segment.endswith("."):
            return f"{excerpt(path)} is not a path like group/sub/project (segment {excerpt(segment, 20)})"
    return None


def username_problem(name: object) -> str | None:
    if not isinstance(name, str) or not _USERNAME.fullmatch(name) or name.endswith("."):
        shown = excerpt(name) if isinstance(name, str) else describe(name)
        return f"must be a GitLab username (letters, digits, '_', '.', '-'), got {shown}"
    return None


def _key(path: str) -> str:
    return path.lower()


def parent_path(path: str) -> str | None:
    """``a/b/c`` → ``a/b``; a top-level path has none."""
    head, sep, _ = path.rpartition("/")
    return head if sep else None


# --------------------------------------------------------------------------- the values


@attrs.frozen(kw_only=True)
class Group:
    #: full path, ``group/sub``, as declared (lookups ignore case)
    path: str
    id: int


@attrs.frozen(kw_only=True)
class Project:
    path: str
    id: int
    #: ``CI_DEFAULT_BRANCH`` of its jobs
    default_branch: str = "main"

    @property
    def namespace(self) -> str:
        """The group path (or user namespace) above it."""
        parent = parent_path(self.path)
        assert parent is not None  # checked by Directory.build
        return parent


@attrs.frozen(kw_only=True)
class User:
    username: str
    id: int | None = None
    #: project or group full path → role, as declared
    memberships: Mapping[str, Role] = attrs.field(factory=dict, hash=False)


@attrs.frozen(kw_only=True)
class Agent:
    id: int
    name: str
    #: full path of the project that holds ``.gitlab/agents/<name>/config.yaml``
    config_project: str


class DirectoryError(ValueError):
    """The declarations do not make a directory: ``key`` is the key path of the first problem
    (``projects[1].path``), ``problem`` says what is wrong."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


# --------------------------------------------------------------------------- what build() accepts
# kasd.config's settings classes satisfy these structurally (the directory never imports the config).


class GroupSpec(Protocol):
    @property
    def path(self) -> str: ...
    @property
    def id(self) -> int: ...


class ProjectSpec(Protocol):
    @property
    def path(self) -> str: ...
    @property
    def id(self) -> int: ...


class UserSpec(Protocol):
    @property
    def username(self) -> str: ...
    @property
    def id(self) -> int | None: ...
    @property
    def memberships(self) -> Mapping[str, Role]: ...


class AgentSpec(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def config_project(self) -> str: ...


# --------------------------------------------------------------------------- the directory


class Directory:
    """Groups, projects, users and agents, checked as a whole (``build``); lookups are by value."""

    def __init__(self, groups: Iterable[Group], projects: Iterable[Project], users: Iterable[User],
                 agents: Iterable[Agent]) -> None:
        # callers use build(); this trusts its arguments
        self._groups = {_key(g.path): g for g in groups}
        self._groups_by_id = {g.id: g for g in self._groups.values()}
        self._projects = {_key(p.path): p for p in projects}
        self._projects_by_id = {p.id: p for p in self._projects.values()}
        self._users = {_key(u.username): u for u in users}
        self._agents = {a.id: a for a in agents}

    @classmethod
    def build(cls, *, groups: Sequence[GroupSpec] = (), projects: Sequence[ProjectSpec] = (),
              users: Sequence[UserSpec] = (), agents: Sequence[AgentSpec] = (),
              require_agent_projects: bool = False) -> Directory:
        """Check the declarations and make the directory; ``DirectoryError`` names the first problem.

        ``require_agent_projects``: every agent's ``config_project`` must be a declared project
        (kasd's config asks for it once ``authorization:`` is in use).
        """
        usernames: dict[str, int] = {}
        for i, spec in enumerate(users):
            problem = username_problem(spec.username)
            if problem:
                raise DirectoryError(f"users[{i}].username", problem)
            other = usernames.setdefault(_key(spec.username), i)
            if other != i:
                raise DirectoryError(f"users[{i}].username", f"{spec.username!r} is already users[{other}]")
        group_list: list[Group] = []
        paths: dict[str, str] = {}  # lower-case path → the key that declared it
        ids: dict[int, str] = {}
        for i, g in enumerate(groups):
            problem = full_path_problem(g.path)
            if problem:
                raise DirectoryError(f"groups[{i}].path", problem)
            other_key = paths.setdefault(_key(g.path), f"groups[{i}]")
            if other_key != f"groups[{i}]":
                raise DirectoryError(f"groups[{i}].path", f"{g.path!r} is already {other_key}")
            other_key = ids.setdefault(g.id, f"groups[{i}]")
            if other_key != f"groups[{i}]":
                raise DirectoryError(f"groups[{i}].id", f"group id {g.id} is already {other_key}'s")
            group_list.append(Group(path=g.path, id=g.id))
        for i, g in enumerate(group_list):
            parent = parent_path(g.path)
            if parent is not None and _key(parent) not in paths:
                raise DirectoryError(
                    f"groups[{i}].path",
                    f"{g.path!r} is a subgroup of {parent!r}, which is not declared under groups:",
                )
        project_list: list[Project] = []
        project_ids: dict[int, str] = {}
        for i, p in enumerate(projects):
            problem = full_path_problem(p.path)
            if problem:
                raise DirectoryError(f"projects[{i}].path", problem)
            other_key = paths.setdefault(_key(p.path), f"projects[{i}]")
            if other_key != f"projects[{i}]":
                raise DirectoryError(f"projects[{i}].path", f"{p.path!r} is already {other_key}")
            other_key = project_ids.setdefault(p.id, f"projects[{i}]")
            if other_key != f"projects[{i}]":
                raise DirectoryError(f"projects[{i}].id", f"project id {p.id} is already {other_key}'s")
            parent = parent_path(p.path)
            if parent is None:
                raise DirectoryError(
                    f"projects[{i}].path", f"{p.path!r} names no namespace (a project is <group>/<name>)"
                )
            if not paths.get(_key(parent), "").startswith("groups[") and _key(parent) not in usernames:
                raise DirectoryError(
                    f"projects[{i}].path",
                    f"the group {parent!r} of project {p.path!r} is not declared under groups: "
                    "(nor is it a user's personal namespace)",
                )
            project_list.append(Project(path=p.path, id=p.id, default_branch=getattr(p, "default_branch", "main")))
        user_list: list[User] = []
        for i, u in enumerate(users):
            memberships: dict[str, Role] = {}
            for path, role in u.memberships.items():
                where = paths.get(_key(path))
                if where is None:
                    raise DirectoryError(
                        f"users[{i}].memberships.{path}",
                        f"{path!r} is neither a declared group nor a declared project",
                    )
                if not isinstance(role, Role):
                    raise DirectoryError(f"users[{i}].memberships.{path}", f"unknown role {role!r}")
                memberships[path] = role
            user_list.append(User(username=u.username, id=u.id, memberships=memberships))
        project_paths = {_key(p.path) for p in project_list}
        agent_list: list[Agent] = []
        agent_ids: dict[int, int] = {}
        for i, a in enumerate(agents):
            other = agent_ids.setdefault(a.id, i)
            if other != i:
                raise DirectoryError(f"agents[{i}].id", f"agent id {a.id} is already used by agents[{other}]")
            if require_agent_projects and _key(a.config_project) not in project_paths:
                raise DirectoryError(
                    f"agents[{i}].config_project",
                    f"{a.config_project!r} is not declared under projects: (the agent's config.yaml lives there)",
                )
            agent_list.append(Agent(id=a.id, name=a.name, config_project=a.config_project))
        return cls(group_list, project_list, user_list, agent_list)

    # ----------------------------------------------------------------------- lookups

    def group(self, path: str) -> Group | None:
        return self._groups.get(_key(path))

    def group_by_id(self, group_id: int) -> Group | None:
        return self._groups_by_id.get(group_id)

    def project(self, path: str) -> Project | None:
        return self._projects.get(_key(path))

    def project_by_id(self, project_id: int) -> Project | None:
        return self._projects_by_id.get(project_id)

    def user(self, username: str) -> User | None:
        return self._users.get(_key(username))

    def agent(self, agent_id: int) -> Agent | None:
        return self._agents.get(agent_id)

    @property
    def groups(self) -> tuple[Group, ...]:
        return tuple(self._groups.values())

    @property
    def projects(self) -> tuple[Project, ...]:
        return tuple(self._projects.values())

    @property
    def agents(self) -> tuple[Agent, ...]:
        return tuple(self._agents.values())

    def ancestors(self, item: Project | Group) -> list[Group]:
        """The groups above ``item``, **root first** (``acme``, ``acme/platform``), the order GitLab
        lists a CI job's groups in; a project in a user's namespace has none."""
        chain: list[Group] = []
        parent = parent_path(item.path)
        while parent is not None:
            group = self._groups.get(_key(parent))
            if group is not None:
                chain.append(group)
            parent = parent_path(parent)
        chain.reverse()
        return chain

    def _own_role(self, user: User, path: str) -> Role | None:
        wanted = _key(path)
        roles = [role for p, role in user.memberships.items() if _key(p) == wanted]
        return max(roles) if roles else None

    def role_of(self, user: User | str, project: Project | str) -> Role | None:
        """The user's effective role in the project: the highest of their own membership there and
        of every ancestor group's (GitLab's inherited membership); None if they are no member."""
        u = self.user(user) if isinstance(user, str) else user
        p = self.project(project) if isinstance(project, str) else project
        if u is None or p is None:
            return None
        return self._highest(u, [p.path, *(g.path for g in self.ancestors(p))])

    def group_role(self, user: User | str, group: Group | str) -> Role | None:
        """The user's effective role in the group: their own or an ancestor group's, the highest."""
        u = self.user(user) if isinstance(user, str) else user
        g = self.group(group) if isinstance(group, str) else group
        if u is None or g is None:
            return None
        return self._highest(u, [g.path, *(a.path for a in self.ancestors(g))])

    def group_roles(self, user: User | str) -> dict[Group, Role]:
        """Every declared group the user is a member of (directly or by inheritance) → their role."""
        out: dict[Group, Role] = {}
        for group in self._groups.values():
            role = self.group_role(user, group)
            if role is not None:
                out[group] = role
        return out

    def _highest(self, user: User, paths: Iterable[str]) -> Role | None:
        roles = [role for role in (self._own_role(user, path) for path in paths) if role is not None]
        return max(roles) if roles else None


__all__ = [
    "ROLE_NAMES",
    "Agent",
    "Directory",
    "DirectoryError",
    "Group",
    "Project",
    "Role",
    "User",
    "full_path_problem",
    "parent_path",
    "parse_role",
    "username_problem",
]
