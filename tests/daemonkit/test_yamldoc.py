"""What ``daemonkit.yamldoc`` relies on in PyYAML, named so that an upgrade that breaks it says so:
only public names (``yaml.CSafeLoader`` with LibYAML, else ``yaml.SafeLoader``), and a composer that
comes first in the loader's MRO composes the parser's events (LibYAML's own C composer never runs,
or the alias budget would not see the nodes)."""

from __future__ import annotations

import pytest
import yaml

from daemonkit import yamldoc

pytestmark = pytest.mark.timeout(10)

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
)


def test_the_loader_is_pyyamls_public_safe_loader_with_the_budgeted_composer_first() -> None:
    base = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
    mro = yamldoc._Loader.__mro__
    assert base in mro and "_yaml" not in {cls.__module__.rsplit(".", 1)[-1] for cls in mro[: mro.index(base)]}
    # the budgeted composer's compose_node and get_single_node win over the parser's own
    assert yamldoc._Loader.compose_node is yamldoc._Budgeted.compose_node
    assert yamldoc._Loader.get_single_node is yaml.composer.Composer.get_single_node


def test_the_budget_sees_every_node_the_parser_yields() -> None:
    with pytest.raises(yamldoc.YamlError, match="YAML nodes once aliases are expanded"):
        yamldoc.compose(LAUGHS, yamldoc.Budget(max_nodes=10_000))
    assert yamldoc.load("a: [1, {b: c}]\nx: &n 1\ny: *n") == {"a": [1, {"b": "c"}], "x": 1, "y": 1}
