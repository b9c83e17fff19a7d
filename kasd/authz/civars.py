"""The predefined CI variables GitLab would give a job.

Rules and namespace templates are written against GitLab's predefined variables
(https://docs.gitlab.com/ci/variables/predefined_variables/); kasd derives them from the two values
it already holds: the verified job (``kasd.authz.jobtokens.JobClaims``, what its token says) and its
project as kasd's directory knows it (``kasd.authz.directory.Project``: its id, namespace and default
branch). Absent facts give absent variables, as in GitLab: no ``CI_COMMIT_BRANCH`` for a tag, no
``CI_ENVIRONMENT_*`` without an environment.
"""

from __future__ import annotations

import re

from kasd.authz.directory import Project
from kasd.authz.jobtokens import JobClaims
from kasd.authz.slugs import environment_slug, ref_slug

__all__ = ["ci_variables", "guess_environment_tier"]


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


def ci_variables(job: JobClaims, project: Project) -> dict[str, str]:
    """The predefined variables of ``job``, a job of ``project`` (the directory's: its path as
    declared, its id, namespace and default branch), by name."""
    variables = {
        "CI_PROJECT_ID": str(project.id),
        "CI_PROJECT_PATH": project.path,
        "CI_PROJECT_PATH_SLUG": ref_slug(project.path),  # Gitlab::Utils.slugify, as the ref's
        "CI_PROJECT_NAME": project.path.rsplit("/", 1)[-1],
        "CI_PROJECT_NAMESPACE": project.namespace,
        "CI_PROJECT_ROOT_NAMESPACE": project.namespace.split("/", 1)[0],
        "CI_COMMIT_REF_NAME": job.ref,
        "CI_COMMIT_REF_SLUG": ref_slug(job.ref),
        "CI_COMMIT_REF_PROTECTED": "true" if job.protected else "false",
        "CI_JOB_ID": str(job.job_id),
        "CI_PIPELINE_ID": str(job.pipeline_id),
    }
    variables["CI_COMMIT_TAG" if job.ref_type == "tag" else "CI_COMMIT_BRANCH"] = job.ref
    variables["CI_DEFAULT_BRANCH"] = project.default_branch
    if job.environment is not None:
        variables["CI_ENVIRONMENT_NAME"] = job.environment
        variables["CI_ENVIRONMENT_SLUG"] = environment_slug(job.environment)
        variables["CI_ENVIRONMENT_TIER"] = job.environment_tier or guess_environment_tier(job.environment)
    variables["GITLAB_USER_LOGIN"] = job.user
    return variables
