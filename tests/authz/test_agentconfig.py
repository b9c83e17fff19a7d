"""Agent config.yaml files: GitLab's schema read whole, every mistake named by file:line:column and
key path, unknown keys kept out and warned of once."""

from __future__ import annotations

from pathlib import Path

import pytest

from kasd.authz.agentconfig import (
    AccessAs,
    AgentConfigError,
    ImpersonateConfig,
    Mark,
    agent_config_path,
    load_agent_config,
    parse_agent_config,
)

pytestmark = pytest.mark.timeout(10)

SRC = "/repos/acme/infra/.gitlab/agents/prod/config.yaml"

FULL = """\
gitops:
  manifest_projects: [{id: acme/manifests}]
observability: {logging: {level: debug}}
remote_development: {enabled: true}
ci_access:
  projects:
    - id: acme/web/shop
      default_namespace: shop
      access_as:
        ci_job: {}
      environments: [production, "review/*"]
      protected_branches_only: true
      resource_management: {enabled: true}
      rules:
        - if: '$CI_COMMIT_BRANCH == "main"'
          namespace: shop-$CI_ENVIRONMENT_SLUG
          when: always
          on_overflow: truncate
        - when: never
  groups:
    - id: acme
      access_as:
        impersonate:
          username: deployer
          uid: "1000"
          groups: [deployers, auditors]
          extra:
            - key: example.com/team
              val: [platform, web]
    - id: acme/data
      access_as: {ci_user: {}}
  instance:
    access_as: {agent: {}}
    environments: [sandbox]
user_access:
  access_as: {user: {}}
  projects: [{id: acme/infra}]
  groups: [{id: acme/web}]
"""


def test_the_whole_schema() -> None:
    loaded = parse_agent_config(FULL, SRC)
    assert loaded.warnings == ()  # gitops, observability, remote_development are GitLab's: no warning
    ci = loaded.config.ci_access
    (shop,) = ci.projects
    assert (shop.kind, shop.id, shop.default_namespace) == ("project", "acme/web/shop", "shop")
    assert shop.access_as == AccessAs(mode="ci_job")
    assert shop.environments == ("production", "review/*")
    assert shop.protected_branches_only and shop.resource_management
    first, second = shop.rules
    assert first.if_text == '$CI_COMMIT_BRANCH == "main"'
    assert first.if_mark == Mark(file=SRC, line=15, column=15) and first.if_style == "'"
    assert (first.namespace, first.when, first.on_overflow) == ("shop-$CI_ENVIRONMENT_SLUG", "always", "truncate")
    assert (second.if_text, second.if_mark, second.when, second.on_overflow) == (None, None, "never", "fail")
    acme, data = ci.groups
    assert acme.access_as == AccessAs(mode="impersonate", impersonate=ImpersonateConfig(
        username="deployer", uid="1000", groups=("deployers", "auditors"),
        extra=(("example.com/team", ("platform", "web")),)))
    assert acme.environments == () and not acme.protected_branches_only and acme.rules == ()
    assert data.access_as.mode == "ci_user"
    assert ci.instance is not None and ci.instance.environments == ("sandbox",) and ci.instance.id is None
    user_access = loaded.config.user_access
    assert user_access is not None
    assert (user_access.access_as, user_access.projects, user_access.groups) == ("user", ("acme/infra",), ("acme/web",))


@pytest.mark.parametrize(("text", "mode"), [
    ("ci_access: {projects: [{id: a/b}]}", "agent"),
    ("ci_access: {projects: [{id: a/b, access_as: {}}]}", "agent"),
    ("ci_access: {projects: [{id: a/b, access_as: {agent: {}}}]}", "agent"),
    ("ci_access: {projects: [{id: a/b, access_as: {agent: }}]}", "agent"),
    ("ci_access: {projects: [{id: a/b, access_as: {ci_job: {}}}]}", "ci_job"),
])
def test_access_as_defaults_to_agent(text: str, mode: str) -> None:
    assert parse_agent_config(text, SRC).config.ci_access.projects[0].access_as.mode == mode


@pytest.mark.parametrize("text", ["", "# nothing\n", "ci_access:\n", "ci_access: {projects: }"])
def test_empty_is_the_default_configuration(text: str) -> None:
    loaded = parse_agent_config(text, SRC)
    assert loaded.config.ci_access.projects == () and loaded.config.ci_access.instance is None
    assert loaded.config.user_access is None and loaded.warnings == ()


@pytest.mark.parametrize(("text", "message"), [
    ("ci_access:\n  projects:\n    - id: 42\n",
     "3:11: ci_access.projects[0].id: must be a string, got int 42"),
    ("ci_access:\n  projects:\n    - default_namespace: x\n",
     "3:7: ci_access.projects[0].id: missing"),
    ("ci_access:\n  projects:\n    - id: a/b\n    - id: A/B\n",
     "4:7: ci_access.projects[1].id: 'A/B' is already ci_access.projects[0] (entries are never merged)"),
    ("ci_access:\n  groups:\n    - id: ../etc\n",
     "3:11: ci_access.groups[0].id: '../etc' is not a path"),
    ("ci_access:\n  projects:\n    - id: a/b\n      access_as:\n        agent: {}\n        ci_job: {}\n",
     "6:9: ci_access.projects[0].access_as.ci_job: access_as takes exactly one of agent, impersonate, ci_job, "
     "ci_user; agent is given too"),
    ("ci_access:\n  projects:\n    - id: a/b\n      access_as:\n        root: {}\n",
     "5:9: ci_access.projects[0].access_as.root: unknown key (expected one of: agent, impersonate, ci_job, ci_user)"),
    ("ci_access:\n  projects:\n    - id: a/b\n      access_as: ci_job\n",
     "4:18: ci_access.projects[0].access_as: must be a mapping, got str 'ci_job'"),
    ("ci_access:\n  groups:\n    - id: a\n      access_as:\n        impersonate: {groups: [x]}\n",
     "5:22: ci_access.groups[0].access_as.impersonate.username: missing (impersonation needs a username)"),
    ("ci_access:\n  groups:\n    - id: a\n      access_as:\n        impersonate: {username: u, group: [x]}\n",
     "5:36: ci_access.groups[0].access_as.impersonate.group: unknown key (expected one of: username, uid, groups, extra)"),
    ("ci_access:\n  groups:\n    - id: a\n      access_as:\n        impersonate: {username: u, extra: {k: [v]}}\n",
     "5:43: ci_access.groups[0].access_as.impersonate.extra: must be a list of {key, val} mappings, got a mapping"),
    ("ci_access:\n  groups:\n    - id: a\n      access_as:\n        impersonate:\n          username: u\n"
     "          extra: [{key: k, val: [1]}]\n",
     "7:34: ci_access.groups[0].access_as.impersonate.extra[0].val[0]: must be a string, got int 1"),
    ("ci_access:\n  projects:\n    - id: a/b\n      environments: production\n",
     "4:21: ci_access.projects[0].environments: must be a list of strings, got str 'production'"),
    ("ci_access:\n  projects:\n    - id: a/b\n      protected_branches_only: 'yes'\n",
     "4:32: ci_access.projects[0].protected_branches_only: must be true or false, got str 'yes'"),
    ("ci_access:\n  projects:\n    - id: a/b\n      resource_management: {enabled: 1}\n",
     "4:38: ci_access.projects[0].resource_management.enabled: must be true or false, got int 1"),
    ("ci_access:\n  projects:\n    - id: a/b\n      default_namespace: Prod_NS\n",
     "4:26: ci_access.projects[0].default_namespace: 'Prod_NS' is not a Kubernetes namespace name"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - if: 42\n",
     "5:15: ci_access.projects[0].rules[0].if: must be a string, got int 42"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - when: sometimes\n",
     "5:17: ci_access.projects[0].rules[0].when: must be one of always, never, got 'sometimes'"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - on_overflow: wrap\n",
     "5:24: ci_access.projects[0].rules[0].on_overflow: must be one of fail, truncate, got 'wrap'"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - iff: x\n",
     "5:11: ci_access.projects[0].rules[0].iff: unknown key (expected one of: if, namespace, when, on_overflow, "
     "roles)"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - {namespace: n, roles: []}\n",
     "5:33: ci_access.projects[0].rules[0].roles: must list 1 to 16 roles (leave it out for admin)"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - {namespace: n, roles: [Binding/x]}\n",
     "5:34: ci_access.projects[0].rules[0].roles[0]: 'Binding' is not a kind of role (write <name> or "
     "ClusterRole/<name> for a ClusterRole, Role/<name> for a Role in the managed namespace)"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - {namespace: n, roles: ['x%2F..', Role/]}\n",
     "5:34: ci_access.projects[0].rules[0].roles[0]: 'x%2F..' is not a role name (a letter or digit, then "
     "letters, digits, ':', '.', '_' and '-')"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - {namespace: n, roles: [Role/]}\n",
     "5:34: ci_access.projects[0].rules[0].roles[0]: 'Role/' names no role"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - {namespace: n, roles: [edit, edit]}\n",
     "5:40: ci_access.projects[0].rules[0].roles[1]: 'edit' is already ci_access.projects[0].rules[0].roles[0]"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - {roles: [edit]}\n",
     "5:12: ci_access.projects[0].rules[0].roles: needs namespace: (the roles are granted in the namespace the "
     "rule resolves to)"),
    ("ci_access:\n  projects:\n    - id: a/b\n    - id: a/c\n      id: a/d\n",
     "5:7: ci_access.projects[1].id: appears twice in one mapping"),
    ("user_access:\n  projects: [{id: a/b}]\n",
     "2:3: user_access.access_as: missing"),
    ("user_access:\n  access_as: {ci_job: {}}\n",
     "2:15: user_access.access_as.ci_job: unknown key (expected one of: agent, user)"),
    ("user_access:\n  access_as: {}\n",
     "2:14: user_access.access_as: must be {agent: {}} or {user: {}}"),
    ("- just\n- a list\n", "1:1: (top level): must be a mapping, got a list"),
    ("ci_access: [unclosed\n", "2:1: not valid YAML: expected ',' or ']'"),
    ("ci_access:\n  projects:\n\t- id: a\n", "3:1: not valid YAML"),
])
def test_mistakes_name_file_line_column_and_key(text: str, message: str) -> None:
    with pytest.raises(AgentConfigError) as info:
        parse_agent_config(text, SRC)
    assert str(info.value).startswith(f"{SRC}:{message}"), str(info.value)


def test_unknown_keys_are_ignored_and_warned_of_once_in_file_order() -> None:
    text = """\
ci_access:
  projects:
    - id: a/b
      colour: blue
      access_as: {ci_job: {verbose: true}}
    - id: a/c
      colour: red
  bogus: 1
shiny_new_feature: {}
gitops: {}
flux: {}
"""
    loaded = parse_agent_config(text, SRC)
    assert loaded.warnings == (
        f"{SRC}:4:7: ci_access.projects[0].colour: unknown key, ignored (known here: id, default_namespace, "
        "access_as, environments, protected_branches_only, resource_management, rules)",
        f"{SRC}:5:28: ci_access.projects[0].access_as.ci_job.verbose: unknown key, ignored (this mapping takes no keys)",
        f"{SRC}:7:7: ci_access.projects[1].colour: unknown key, ignored (known here: id, default_namespace, "
        "access_as, environments, protected_branches_only, resource_management, rules)",
        f"{SRC}:8:3: ci_access.bogus: unknown key, ignored (known here: projects, groups, instance)",
        f"{SRC}:9:1: shiny_new_feature: unknown key, ignored (known here: ci_access, user_access, gitops, "
        "observability, cilium, starboard, container_scanning, remote_development, flux)",
    ), loaded.warnings
    # the entries themselves are as if the unknown keys were not there
    assert [p.id for p in loaded.config.ci_access.projects] == ["a/b", "a/c"]


def test_a_yaml_alias_bomb_is_refused_not_walked() -> None:
    # 300 entries × one aliased list of 1,000 names: 300,000 values from a 10 KB file
    head = "x: &e [" + ", ".join(["n"] * 1000) + "]\nci_access:\n  projects:\n"
    text = head + "".join(f"    - id: a/p{i}\n      environments: *e\n" for i in range(300))
    with pytest.raises(AgentConfigError, match=r"ci_access\.projects\[\d+\]\.environments.*: the file makes more than "
                                               r"100000 YAML values"):
        parse_agent_config(text, SRC)
    small = head + "    - id: a/p\n      environments: *e\n"
    assert len(parse_agent_config(small, SRC).config.ci_access.projects[0].environments) == 1000


def test_files_are_found_under_the_config_root(tmp_path: Path) -> None:
    path = agent_config_path(tmp_path, "acme/infra", "prod")
    assert path == tmp_path / "acme" / "infra" / ".gitlab" / "agents" / "prod" / "config.yaml"
    missing = load_agent_config(tmp_path, "acme/infra", "prod")
    assert missing.config.ci_access.projects == () and missing.config.user_access is None
    assert missing.warnings == (f"{path}: no such file: the agent has the default configuration (only CI/CD jobs "
                                "of its config project acme/infra may use it)",)
    path.parent.mkdir(parents=True)
    path.write_text("ci_access:\n  projects:\n    - id: acme/web\n      access_as: {ci_job: {}}\n")
    loaded = load_agent_config(tmp_path, "acme/infra", "prod")
    assert loaded.config.source == str(path) and loaded.config.ci_access.projects[0].access_as.mode == "ci_job"
    path.write_text("ci_access:\n  projects:\n    - id: [acme]\n")
    with pytest.raises(AgentConfigError, match=rf"^{path}:3:11: ci_access\.projects\[0\]\.id: must be a string"):
        load_agent_config(tmp_path, "acme/infra", "prod")
    path.write_bytes(b"ci_access: \xff\n")
    with pytest.raises(AgentConfigError, match="not UTF-8"):
        load_agent_config(tmp_path, "acme/infra", "prod")


@pytest.mark.parametrize(("project", "name"), [("../etc", "prod"), ("acme/infra", "../../x"), ("acme/infra", "Prod"),
                                               ("/abs", "prod"), ("acme/infra", "")])
def test_paths_cannot_step_outside_the_root(tmp_path: Path, project: str, name: str) -> None:
    with pytest.raises(AgentConfigError):
        agent_config_path(tmp_path, project, name)


def test_each_ci_access_entry_is_kept_as_written_without_its_id() -> None:
    """GitLab's ``allowed_agents`` answers the entry as written (``configuration``): every key,
    unknown ones too, with YAML's types; an alias bomb under a key kasd does not read is bounded
    by the same node budget."""
    ci = parse_agent_config(FULL, SRC).config.ci_access
    assert ci.projects[0].written == {
        "default_namespace": "shop", "access_as": {"ci_job": {}}, "environments": ["production", "review/*"],
        "protected_branches_only": True, "resource_management": {"enabled": True},
        "rules": [{"if": '$CI_COMMIT_BRANCH == "main"', "namespace": "shop-$CI_ENVIRONMENT_SLUG", "when": "always",
                   "on_overflow": "truncate"}, {"when": "never"}],
    }
    assert ci.groups[0].written["access_as"]["impersonate"]["uid"] == "1000"  # a string stays a string
    assert ci.instance is not None and ci.instance.written == {"access_as": {"agent": {}}, "environments": ["sandbox"]}
    odd = parse_agent_config("ci_access:\n  projects:\n    - id: a/b\n      future_key: {n: 0x10, f: .inf, z: ~}\n", SRC)
    assert odd.config.ci_access.projects[0].written == {"future_key": {"n": 16, "f": ".inf", "z": None}}
    head = "x: &e [" + ", ".join(["n"] * 1000) + "]\nci_access:\n  projects:\n"
    bomb = head + "".join(f"    - id: a/p{i}\n      future_key: *e\n" for i in range(300))
    with pytest.raises(AgentConfigError, match=r"future_key.*: the file makes more than 100000 YAML values"):
        parse_agent_config(bomb, SRC)
