"""A CI job's identity, and the predefined CI variables GitLab would give that job.

Rules and namespace templates are written against GitLab's predefined variables
(https://docs.gitlab.com/ci/variables/predefined_variables/); kasd learns a job's identity from
GitLab (the job token's job) and derives them here. Absent facts give absent variables, as in
GitLab: no ``CI_COMMIT_BRANCH`` for a tag, no ``CI_ENVIRONMENT_*`` without an environment.
"""

from __future__ import annotations

import re

import attrs

from kasd.authz.slugs import environment_slug, ref_slug

__all__ = ["JobFacts", "ci_variables", "guess_environment_tier"]


@attrs.frozen(kw_only=True)
class JobFacts:
    """What GitLab says about the job a CI job token belongs to."""

    project_path: str
    """The project's full path, ``group/subgroup/project``."""
    project_id: int
    namespace: str
    """The full path of the project's group or user namespace, ``group/subgroup``."""
    ref: str
    """The branch or tag the pipeline runs for (its short name, ``main`` or ``v1.2.3``)."""
    tag: bool = False
    """Whether ``ref`` is a tag; refs are branches unless told otherwise."""
    protected: bool
    """Whether ``ref`` is a protected branch or tag."""
    default_branch: str | None = None
    """The project's default branch; None when the repository has none yet."""
    environment: str | None = None
    """The job's environment name, already expanded, if it deploys to one."""
    environment_tier: str | None = None
    """The environment's tier; None to guess it from the name, as GitLab does."""
    job_id: int
    pipeline_id: int
    user_login: str | None = None
    """The username of whoever started the job."""


# Environment#guess_tier (app/models/environment.rb), in GitLab's order: the first pattern found wins.
_TIERS = (
    (re.compile(r"dev|review|trunk", re.IGNORECASE), "development"),
    (re.compile(r"test|qc", re.IGNORECASE), "testing"),
    (re.compile(r"st(a|)g|mod(e|)l|pre|demo", re.IGNORECASE), "staging"),
    (re.compile(r"pr(o|)d|live", re.IGNORECASE), "production"),
)


def guess_environment_tier(name: str) -> str:
    """The tier GitLab gives an environment created without one (``Environment#guess_tier``)."""
    for pattern, tier in _TIERS:
        if pattern.search(name):
            return tier
    return "other"


def ci_variables(facts: JobFacts) -> dict[str, str]:
    """The predefined variables of the job ``facts`` describe, by name."""
    variables = {
        "CI_PROJECT_ID": str(facts.project_id),
        "CI_PROJECT_PATH": facts.project_path,
        "CI_PROJECT_PATH_SLUG": ref_slug(facts.project_path),  # Gitlab::Utils.slugify, as the ref's
        "CI_PROJECT_NAME": facts.project_path.rsplit("/", 1)[-1],
        "CI_PROJECT_NAMESPACE": facts.namespace,
        "CI_PROJECT_ROOT_NAMESPACE": facts.namespace.split("/", 1)[0],
        "CI_COMMIT_REF_NAME": facts.ref,
        "CI_COMMIT_REF_SLUG": ref_slug(facts.ref),
        "CI_COMMIT_REF_PROTECTED": "true" if facts.protected else "false",
        "CI_JOB_ID": str(facts.job_id),
        "CI_PIPELINE_ID": str(facts.pipeline_id),
    }
    variables["CI_COMMIT_TAG" if facts.tag else "CI_COMMIT_BRANCH"] = facts.ref
    if facts.default_branch is not None:
        variables["CI_DEFAULT_BRANCH"] = facts.default_branch
    if facts.environment is not None:
        variables["CI_ENVIRONMENT_NAME"] = facts.environment
        variables["CI_ENVIRONMENT_SLUG"] = environment_slug(facts.environment)
        variables["CI_ENVIRONMENT_TIER"] = facts.environment_tier or guess_environment_tier(facts.environment)
    if facts.user_login is not None:
        variables["GITLAB_USER_LOGIN"] = facts.user_login
    return variables
