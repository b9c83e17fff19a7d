"""namespace: templates — GitLab's variable expansion and a result that is always a namespace name."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kasd.authz.expand import (
    NamespaceError,
    expand,
    is_dns1123_label,
    resolve_namespace,
    to_dns1123_label,
)

VARS = {"CI_PROJECT_NAME": "web", "CI_ENVIRONMENT_SLUG": "review-x-abc123", "EMPTY": "", "UPPER": "Web_App"}


@pytest.mark.parametrize(("template", "expanded"), [
    ("$CI_PROJECT_NAME-$CI_ENVIRONMENT_SLUG", "web-review-x-abc123"),
    ("${CI_PROJECT_NAME}prod", "webprod"),
    ("%CI_PROJECT_NAME%-x", "web-x"),
    ("$UNDEFINED-x", "-x"),
    ("$$CI_PROJECT_NAME", "$web"),  # no $$ escape on GitLab's side
    ("cost$", "cost$"),
    ("${CI_PROJECT_NAME", "${CI_PROJECT_NAME"),
    ("$CI_PROJECT_NAMEX", ""),  # the longest name is read
])
def test_expand_as_gitlab(template: str, expanded: str) -> None:
    assert expand(template, VARS) == expanded


def test_a_valid_namespace_is_returned_as_it_is() -> None:
    assert resolve_namespace("$CI_PROJECT_NAME-$CI_ENVIRONMENT_SLUG", VARS) == "web-review-x-abc123"
    assert resolve_namespace("$CI_PROJECT_NAME", VARS, on_overflow="truncate") == "web"


@pytest.mark.parametrize(("template", "problem"), [
    ("$UPPER", "is not a DNS-1123 label"),
    ("$EMPTY", "is empty"),
    ("$CI_ENVIRONMENT_SLUG" * 5, "is longer than 63 characters"),
    ("-$CI_PROJECT_NAME", "is not a DNS-1123 label"),
])
def test_fail_names_the_rule_and_the_value(template: str, problem: str) -> None:
    with pytest.raises(NamespaceError) as caught:
        resolve_namespace(template, VARS, rule_name="ci_access.projects[0].rules[2]")
    assert str(caught.value).startswith(
        f"ci_access.projects[0].rules[2]: namespace {template!r} resolved to {caught.value.value!r}, which {problem}")


def test_truncate_is_readable() -> None:
    assert resolve_namespace("$UPPER", VARS, on_overflow="truncate").startswith("web-app-")
    long = resolve_namespace("$CI_ENVIRONMENT_SLUG" * 5, VARS, on_overflow="truncate")
    assert long.startswith("review-x-abc123review-x") and len(long) <= 63  # a trailing '-' is dropped
    assert len(resolve_namespace("$EMPTY", VARS, on_overflow="truncate")) == 8


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=90))
def test_truncation_is_a_deterministic_valid_label(value: str) -> None:
    label = to_dns1123_label(value)
    assert is_dns1123_label(label)
    assert label == to_dns1123_label(value)
    assert resolve_namespace("$V", {"V": value}, on_overflow="truncate") == label


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="aA-_.9/", max_size=80), st.text(alphabet="aA-_.9/", max_size=80))
def test_distinct_values_give_distinct_labels(a: str, b: str) -> None:
    if a != b:
        assert to_dns1123_label(a) != to_dns1123_label(b)
