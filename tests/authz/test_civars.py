"""A verified job and its project → GitLab's predefined CI variables, absent ones omitted."""

from __future__ import annotations

import attrs
import pytest

from kasd.authz.civars import ci_variables, guess_environment_tier
from kasd.authz.directory import Project
from kasd.authz.jobtokens import JobClaims
from kasd.authz.slugs import environment_slug

JOB = JobClaims(project="acme/platform/web-app", ref="feature/Login", protected=False, job_id=7, pipeline_id=3,
                user="alice")
#: the directory's project: its path as declared (the token's may differ in case), id and default branch
PROJECT = Project(path="acme/platform/Web-App", id=42, default_branch="main")


def test_a_branch_job_without_an_environment() -> None:
    assert ci_variables(JOB, PROJECT) == {
        "CI_PROJECT_ID": "42",
        "CI_PROJECT_PATH": "acme/platform/Web-App",
        "CI_PROJECT_PATH_SLUG": "acme-platform-web-app",
        "CI_PROJECT_NAME": "Web-App",
        "CI_PROJECT_NAMESPACE": "acme/platform",
        "CI_PROJECT_ROOT_NAMESPACE": "acme",
        "CI_COMMIT_REF_NAME": "feature/Login",
        "CI_COMMIT_REF_SLUG": "feature-login",
        "CI_COMMIT_REF_PROTECTED": "false",
        "CI_COMMIT_BRANCH": "feature/Login",
        "CI_DEFAULT_BRANCH": "main",
        "CI_JOB_ID": "7",
        "CI_PIPELINE_ID": "3",
        "GITLAB_USER_LOGIN": "alice",
    }


def test_a_protected_tag_deploying_to_an_environment() -> None:
    job = attrs.evolve(JOB, ref="v1.2.3", ref_type="tag", protected=True, environment="review/feature")
    variables = ci_variables(job, attrs.evolve(PROJECT, default_branch="trunk"))
    assert variables["CI_COMMIT_TAG"] == "v1.2.3"
    assert "CI_COMMIT_BRANCH" not in variables
    assert variables["CI_COMMIT_REF_PROTECTED"] == "true"
    assert variables["CI_ENVIRONMENT_NAME"] == "review/feature"
    assert variables["CI_ENVIRONMENT_SLUG"] == environment_slug("review/feature")
    assert variables["CI_ENVIRONMENT_TIER"] == "development"
    # a project always has a default branch in kasd's directory, and a verified job always names its user
    assert variables["CI_DEFAULT_BRANCH"] == "trunk" and variables["GITLAB_USER_LOGIN"] == "alice"


def test_a_given_tier_wins_over_the_guess() -> None:
    job = attrs.evolve(JOB, environment="review/x", environment_tier="production")
    assert ci_variables(job, PROJECT)["CI_ENVIRONMENT_TIER"] == "production"


@pytest.mark.parametrize(("name", "tier"), [
    ("review/feature", "development"), ("dev", "development"), ("QA-test", "testing"),
    ("staging", "staging"), ("stg", "staging"), ("pre-prod", "staging"), ("production", "production"),
    ("prd", "production"), ("live", "production"), ("canary", "other"),
])
def test_the_tier_is_guessed_as_gitlab_does(name: str, tier: str) -> None:
    assert guess_environment_tier(name) == tier
