"""First match decides: which rule, allowed or not, the namespace, and a reason a 403 can give."""

from __future__ import annotations

from pathlib import Path

import pytest

from kasd.authz.agentconfig import AgentConfigError, agent_config_path, parse_agent_config
from kasd.authz.directory import Agent, Directory, Group, Project
from kasd.authz.expand import RoleRef
from kasd.authz.expr import parse
from kasd.authz.rules import Rule, RuleMatch, compile_rules, first_match
from kasd.authz.snapshot import load_agents

RULES = [
    Rule(if_=parse('$CI_COMMIT_REF_NAME =~ /^wip\\//'), when="never"),
    Rule(if_=parse('$CI_COMMIT_REF_PROTECTED == "true"'), namespace="prod-$CI_PROJECT_NAME"),
    Rule(if_=parse("$CI_ENVIRONMENT_SLUG"), namespace="review-$CI_ENVIRONMENT_SLUG-$CI_PROJECT_NAME",
         on_overflow="truncate"),
    Rule(if_=parse("$CI_COMMIT_BRANCH =~ $ALLOWED"), namespace="$CI_COMMIT_REF_NAME"),
]


def test_the_first_matching_rule_decides() -> None:
    job = {"CI_COMMIT_REF_NAME": "main", "CI_COMMIT_REF_PROTECTED": "true", "CI_PROJECT_NAME": "web",
           "CI_ENVIRONMENT_SLUG": "review-x"}
    assert first_match(RULES, job) == RuleMatch(
        allowed=True, index=1, namespace="prod-web",
        reason='rules[1] matched (if: $CI_COMMIT_REF_PROTECTED == "true"): namespace prod-web')


def test_when_never_denies_even_if_a_later_rule_would_allow() -> None:
    job = {"CI_COMMIT_REF_NAME": "wip/x", "CI_COMMIT_REF_PROTECTED": "true", "CI_PROJECT_NAME": "web"}
    assert first_match(RULES, job) == RuleMatch(
        allowed=False, index=0, reason="rules[0] matched (if: $CI_COMMIT_REF_NAME =~ /^wip\\//): when: never")


def test_no_match_denies_and_says_so() -> None:
    assert first_match(RULES, {"CI_COMMIT_REF_NAME": "main"}) == RuleMatch(
        allowed=False, index=None, reason="none of the 4 rules matched")
    assert not first_match([], {}).allowed


def test_truncate_and_fail() -> None:
    job = {"CI_COMMIT_REF_NAME": "x", "CI_PROJECT_NAME": "web", "CI_ENVIRONMENT_SLUG": "r" * 60}
    match = first_match(RULES, job)
    assert match.allowed and match.index == 2 and match.namespace is not None and len(match.namespace) <= 63
    job = {"CI_COMMIT_BRANCH": "Feature/X", "CI_COMMIT_REF_NAME": "Feature/X", "ALLOWED": "/^feature/i"}
    denied = first_match(RULES, job)
    assert (denied.allowed, denied.index) == (False, 3)
    assert denied.reason.startswith("rules[3]: namespace '$CI_COMMIT_REF_NAME' resolved to 'Feature/X'")


def test_an_expression_that_cannot_be_evaluated_denies_naming_the_rule() -> None:
    rule = Rule(if_=parse("$CI_COMMIT_BRANCH =~ $ALLOWED"), name="ci_access.projects[0].rules[0]")
    match = first_match([rule, Rule()], {"CI_COMMIT_BRANCH": "main", "ALLOWED": "main"})
    assert (match.allowed, match.index) == (False, 0)
    assert match.reason.startswith("ci_access.projects[0].rules[0] could not be evaluated: $ALLOWED")


def test_a_rule_without_if_matches_and_without_namespace_leaves_it_to_the_entry() -> None:
    assert first_match([Rule()], {}) == RuleMatch(allowed=True, index=0, reason="rules[0] matched")


def test_a_bad_expression_is_a_load_error_at_its_file_line_and_column() -> None:
    import pytest

    from kasd.authz.agentconfig import AgentConfigError, parse_agent_config
    from kasd.authz.rules import compile_rules

    text = (
        "ci_access:\n"
        "  projects:\n"
        "    - id: acme/web\n"
        "      rules:\n"
        "        - if: '$CI_COMMIT_BRANCH == \"main\"'\n"
        "        - if: $CI_COMMIT_BRANCH == && $X\n"
    )
    entry = parse_agent_config(text, "config.yaml").config.ci_access.projects[0]
    with pytest.raises(AgentConfigError) as info:
        compile_rules(entry.rules, "ci_access.projects[0].rules")
    message = str(info.value)
    # line 6; the value starts at column 15, and '&&' is the expression's column 22
    assert message.startswith("config.yaml:6:36: ci_access.projects[0].rules[1].if: "), message
    assert "'$CI_COMMIT_BRANCH == && $X'" in message
    good = compile_rules(entry.rules[:1], "ci_access.projects[0].rules")
    assert first_match(good, {"CI_COMMIT_BRANCH": "main"}).allowed


def test_roles_are_read_expanded_and_a_variable_never_picks_the_kind(tmp_path: Path) -> None:
    text = (
        "ci_access:\n"
        "  projects:\n"
        "    - id: acme/web\n"
        "      access_as: {ci_job: {}}\n"
        "      rules:\n"
        "        - namespace: app-$CI_PROJECT_ID\n"
        "          roles: [edit, ClusterRole/view, Role/deploy-$CI_ENVIRONMENT_SLUG]\n"
    )
    entry = parse_agent_config(text, "config.yaml").config.ci_access.projects[0]
    rules = compile_rules(entry.rules, "rules")
    match = first_match(rules, {"CI_PROJECT_ID": "42", "CI_ENVIRONMENT_SLUG": "production"})
    assert match.roles == (RoleRef("ClusterRole", "edit"), RoleRef("ClusterRole", "view"),
                           RoleRef("Role", "deploy-production"))
    assert match.reason == "rules[0] matched: namespace app-42 (ClusterRole/edit, ClusterRole/view, Role/deploy-production)"
    denied = first_match(rules, {"CI_PROJECT_ID": "42", "CI_ENVIRONMENT_SLUG": "x/../admin"})
    assert (denied.allowed, denied.roles) == (False, ())
    assert denied.reason == ("rules[0]: role 'Role/deploy-$CI_ENVIRONMENT_SLUG' resolved to 'deploy-x/../admin', "
                             "which is not a role name (a letter or digit, then letters, digits, ':', '.', '_' and '-')")
    # With agent or impersonate kasd binds nothing: roles there would be a setting that does nothing.
    directory = Directory.build(groups=[Group(path="acme", id=2)], projects=[Project(path="acme/web", id=1)],
                                agents=[Agent(id=1, name="prod", config_project="acme/web")])
    path = agent_config_path(tmp_path, "acme/web", "prod")
    path.parent.mkdir(parents=True)
    path.write_text(text.replace("ci_job", "agent"))
    with pytest.raises(AgentConfigError) as info:
        load_agents(directory, tmp_path)
    assert str(info.value) == (f"{path}:6:11: ci_access.projects[0].rules[0].roles: applies to access_as ci_job or "
                               "ci_user only (with agent, kasd binds nothing: RBAC is the operator's)")


def test_a_pattern_re2_refuses_is_a_load_error_at_the_refused_fragment() -> None:
    import pytest

    from kasd.authz.agentconfig import AgentConfigError, parse_agent_config
    from kasd.authz.rules import compile_rules

    text = (
        "ci_access:\n"
        "  projects:\n"
        "    - id: acme/web\n"
        "      rules:\n"
        "        - if: $CI_COMMIT_REF_NAME =~ /^v(?=1)/\n"
    )
    entry = parse_agent_config(text, "config.yaml").config.ci_access.projects[0]
    with pytest.raises(AgentConfigError) as info:
        compile_rules(entry.rules, "ci_access.projects[0].rules")
    # the value starts at column 15; '(?=' is the expression's column 27
    assert str(info.value).startswith("config.yaml:5:41: ci_access.projects[0].rules[0].if: invalid regex: "
                                      "invalid perl operator: (?= (RE2 has no lookahead)"), str(info.value)


def test_an_agents_rules_hold_a_bounded_amount_of_regular_expression(tmp_path: Path) -> None:
    """Rules run on kasd's event loop and RE2 builds each pattern's DFA at its first search: 200
    distinct patterns of 605 instructions, each within the per-pattern cap, held the loop 1.6 s at
    the first job after a load. Their sum is capped per agent, across its entries."""
    def config(patterns: int) -> str:
        rules = "".join(f"        - if: '$CI_COMMIT_REF_NAME =~ /[a-z]{{600}}x{i}/'\n" for i in range(patterns))
        return ("ci_access:\n  projects:\n    - id: acme/web\n      rules:\n" + rules +
                "    - id: acme/api\n      rules:\n" + rules)

    directory = Directory.build(groups=[Group(path="acme", id=2)],
                                projects=[Project(path="acme/web", id=1), Project(path="acme/api", id=3)],
                                agents=[Agent(id=1, name="prod", config_project="acme/web")])
    path = agent_config_path(tmp_path, "acme/web", "prod")
    path.parent.mkdir(parents=True)
    path.write_text(config(8))  # 16 patterns, ~9,700 instructions: loads
    agents, _ = load_agents(directory, tmp_path)
    assert len(agents[1].rules) == 2
    path.write_text(config(9))  # 18: the second entry's rules go over
    with pytest.raises(AgentConfigError) as info:
        load_agents(directory, tmp_path)
    assert str(info.value) == (f"{path}: ci_access.projects[1].rules: the regular expressions of the agent's rules: "
                               "come to more than 10000 RE2 instructions in all (each is matched on kasd's event loop); "
                               "use fewer or simpler ones")


def test_an_agent_holds_a_bounded_number_of_rules(tmp_path: Path) -> None:
    """Each request tries its entry's rules in order on kasd's event loop: one aliased 700-character
    ``if:`` repeated ~6,000 times (a 40 KB file within its YAML budget) cost 0.13 s per refused request.
    At most 128 rules per agent, its entries together; a refused job's request tries each without
    printing it (only the deciding rule is named)."""
    cond = " || ".join(f'$CI_COMMIT_BRANCH == "b{j}"' for j in range(24))

    def config(web: int, api: int) -> str:
        return ("ci_access:\n  projects:\n"
                f"    - id: acme/web\n      rules: [&r {{if: '{cond}'}}" + ", *r" * (web - 1) + "]\n"
                "    - id: acme/api\n      rules: [" + ", ".join(["*r"] * api) + "]\n")

    directory = Directory.build(groups=[Group(path="acme", id=2)],
                                projects=[Project(path="acme/web", id=1), Project(path="acme/api", id=3)],
                                agents=[Agent(id=1, name="prod", config_project="acme/web")])
    path = agent_config_path(tmp_path, "acme/web", "prod")
    path.parent.mkdir(parents=True)
    path.write_text(config(100, 28))
    agents, _ = load_agents(directory, tmp_path)
    assert not first_match(agents[1].rules[("project", "acme/web")], {"CI_COMMIT_BRANCH": "zz"}).allowed
    path.write_text(config(100, 29))
    with pytest.raises(AgentConfigError) as info:
        load_agents(directory, tmp_path)
    assert str(info.value) == (f"{path}: ci_access.projects[1].rules: the agent's entries hold more than 128 rules in all "
                               "(a request tries them in order on kasd's event loop)")
