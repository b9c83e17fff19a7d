"""A job's identity → GitLab's predefined CI variables, absent ones omitted."""

from __future__ import annotations

import attrs
import pytest

from kasd.authz.civars import JobFacts, ci_variables, guess_environment_tier
from kasd.authz.slugs import environment_slug

FACTS = JobFacts(project_path="acme/platform/Web-App", project_id=42, namespace="acme/platform",
                 ref="feature/Login", protected=False, default_branch="main", job_id=7, pipeline_id=3,
                 user_login="alice")


def test_a_branch_job_without_an_environment() -> None:
    assert ci_variables(FACTS) == {
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
    facts = attrs.evolve(FACTS, ref="v1.2.3", tag=True, protected=True, environment="review/feature",
                         default_branch=None, user_login=None)
    variables = ci_variables(facts)
    assert variables["CI_COMMIT_TAG"] == "v1.2.3"
    assert "CI_COMMIT_BRANCH" not in variables
    assert variables["CI_COMMIT_REF_PROTECTED"] == "true"
    assert variables["CI_ENVIRONMENT_NAME"] == "review/feature"
    assert variables["CI_ENVIRONMENT_SLUG"] == environment_slug("review/feature")
    assert variables["CI_ENVIRONMENT_TIER"] == "development"
    assert "CI_DEFAULT_BRANCH" not in variables and "GITLAB_USER_LOGIN" not in variables


def test_a_given_tier_wins_over_the_guess() -> None:
    facts = attrs.evolve(FACTS, environment="review/x", environment_tier="production")
    assert ci_variables(facts)["CI_ENVIRONMENT_TIER"] == "production"


@pytest.mark.parametrize(("name", "tier"), [
    ("review/feature", "development"), ("dev", "development"), ("QA-test", "testing"),
    ("staging", "staging"), ("stg", "staging"), ("pre-prod", "staging"), ("production", "production"),
    ("prd", "production"), ("live", "production"), ("canary", "other"),
])
def test_the_tier_is_guessed_as_gitlab_does(name: str, tier: str) -> None:
    assert guess_environment_tier(name) == tier
