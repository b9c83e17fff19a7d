"""The directory's settings: ``agents:``, and groups, projects and users as GitLab lays them out
(``kasd.authz.directory`` checks them as a whole; ``kasd.config.root`` turns its refusal into a
configuration error). docs/authorization.md, "## The model"."""

from __future__ import annotations

from typing import Any

import attrs

from daemonkit.settings import Problem, setting
from kasd.authz.directory import Role, full_path_problem, parse_role, username_problem
from kasd.config.receptive import ReceptiveEntry
from kasd.config.values import expect_type, parse_positive_id, parse_string
from kasd.tokens import is_token_hash


def _token_hash(value: Any) -> str:
    if not is_token_hash(value):
        raise Problem("must be 64 lower-case hex characters (use `kasd hash-token`)")
    return value  # type: ignore[no-any-return]


@attrs.frozen(kw_only=True)
class AgentEntry:
    """One ``agents:`` entry: an agent as the directory knows it (``kasd.authz.directory.Agent``) and
    the hash of its tunnel token, which only the agent port reads."""

    id: int = setting(parse=parse_positive_id)
    name: str = setting(parse=parse_string)
    config_project: str = setting(parse=parse_string)
    token_sha256: str = setting(parse=_token_hash, repr=False)
    #: a receptive agent: kasd dials it (``kasd.receptive``); None: it dials kasd
    receptive: ReceptiveEntry | None = setting(None)


def _full_path(value: Any) -> str:
    problem = full_path_problem(value)
    if problem:
        raise Problem(problem)
    return value  # type: ignore[no-any-return]


def _username(value: Any) -> str:
    problem = username_problem(value)
    if problem:
        raise Problem(problem)
    return value  # type: ignore[no-any-return]


def _optional_id(value: Any) -> int | None:
    return None if value is None else parse_positive_id(value)


def _memberships(value: Any) -> dict[str, Role]:
    """``{group or project path: role}``; the paths are checked against the directory by
    ``kasd.config.root.check``."""
    if value is None:
        return {}
    raw = expect_type(value, dict, "a mapping of group or project path to role")
    out: dict[str, Role] = {}
    for path, role in raw.items():
        problem = full_path_problem(path)
        if problem:
            raise Problem(problem, at=f".{path}")
        try:
            out[path] = parse_role(role)
        except ValueError as exc:
            raise Problem(str(exc), at=f".{path}") from None
    return out


@attrs.frozen(kw_only=True)
class GroupEntry:
    #: full path, ``group/subgroup``; a subgroup's parent must be declared too
    path: str = setting(parse=_full_path)
    id: int = setting(parse=parse_positive_id)


@attrs.frozen(kw_only=True)
class ProjectEntry:
    #: full path, ``group/subgroup/project``; its group must be declared (or be a user's namespace)
    path: str = setting(parse=_full_path)
    id: int = setting(parse=parse_positive_id)
    #: its jobs' ``CI_DEFAULT_BRANCH`` (for ``rules:``)
    default_branch: str = setting("main", parse=parse_string)


@attrs.frozen(kw_only=True)
class UserEntry:
    username: str = setting(parse=_username)
    id: int | None = setting(None, parse=_optional_id)
    #: project or group path → guest, reporter, developer, maintainer or owner
    memberships: dict[str, Role] = setting(factory=dict, parse=_memberships)
