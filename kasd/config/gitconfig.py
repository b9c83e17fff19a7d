"""``authorization.config_git:``: read the agents' configuration from Git repositories under
``authorization.config_root`` (``kasd.authz.gitsource``) instead of checked-out files."""

from __future__ import annotations

from typing import Any

import attrs

from daemonkit.settings import Problem, setting
from kasd.authz.gitsource import check_ref
from kasd.config.values import parse_boolean, parse_seconds, parse_string

#: the shortest poll interval accepted (each poll reads one ref per config project)
MIN_POLL_INTERVAL = 0.1


def _ref(value: Any) -> str:
    ref = parse_string(value).strip() or "HEAD"
    problem = check_ref(ref)
    if problem:
        raise Problem(problem)
    return ref


def _interval(value: Any) -> float:
    seconds = parse_seconds(value)
    if seconds < MIN_POLL_INTERVAL:
        raise Problem(f"must be at least {MIN_POLL_INTERVAL:g} seconds")
    return seconds


@attrs.frozen(kw_only=True)
class ConfigGitSettings:
    """``config_root`` holds Git repositories: one holding every config project's tree at
    ``<project path>/``, or one per config project at ``<config_root>/<project path>.git`` (bare) or
    ``<config_root>/<project path>``."""

    #: read the agents' configuration from Git (else: files checked out under config_root)
    enabled: bool = setting(False, parse=parse_boolean)
    #: the branch, tag or full ref read; "HEAD" (the default): each repository's default branch
    ref: str = setting("HEAD", parse=_ref)
    #: seconds between two looks at the ref (one ref read per config project; 20 as Omnibus GitLab's
    #: gitlab-kas agent_configuration_poll_period); a push hook
    #: (``kasctl notify --config-changed``) makes kasd look at once
    poll_interval: float = setting(20.0, parse=_interval)
