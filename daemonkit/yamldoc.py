"""The one way both daemons read a YAML document: bounded, and never quoting it in an error.

Every YAML file kasd and agentd read (their own configuration through ``settings``, an agent's
``config.yaml``, an environment template) goes through ``compose`` or ``load`` here, with one
``Budget``:

- at most ``max_bytes`` of UTF-8 (``read_text`` reads no more than that);
- at most ``max_nodes`` nodes and ``max_chars`` characters of scalars *with every alias expanded*:
  an alias costs the whole subtree it names, so a "billion laughs" document of a few hundred bytes
  is refused after the budget, not after 10⁹ nodes, and every later walk of the tree (checks,
  construction, rendering) is bounded by the same numbers;
- at most ``max_depth`` levels of nesting (PyYAML composes recursively);
- no alias inside the node it names (a cycle would make every walk endless);
- and, within ``time_limit(seconds)`` (a context the caller opens around a whole load, in the
  thread that reads), no longer than that: checked between nodes, so a slow document ends the
  thread's work instead of outliving the caller's timeout.

``YamlError`` says where (line, column) and what, in words of its own: PyYAML's messages are cut
to a short excerpt and never include the snippet of the file PyYAML's ``str()`` adds. ``describe``
names a value by its type and size, never its content: a file that is one scalar (a token, a
private key reached by mistake) never lands in a log.

LibYAML's parser is used when PyYAML has it (events in C, composed here in Python so that the
budget sees every node); the pure-Python parser otherwise.
"""

from __future__ import annotations

import contextvars
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = [
    "DEFAULT_BUDGET",
    "Budget",
    "YamlError",
    "compose",
    "construct",
    "describe",
    "excerpt",
    "load",
    "read_text",
    "time_limit",
]


@attrs.frozen(kw_only=True)
class Budget:
    """What one document may cost."""

    max_bytes: int = 1024 * 1024
    #: nodes, every alias counted as the subtree it names
    max_nodes: int = 100_000
    #: characters of scalars, aliases expanded likewise
    max_chars: int = 4 * 1024 * 1024
    max_depth: int = 64


DEFAULT_BUDGET = Budget()


class YamlError(ValueError):
    """The document is unusable: ``problem`` at ``line``:``column`` (1-based; None when unknown).
    ``str()`` is ``line L, column C: problem``; ``at(source)`` is ``source:L:C: problem``."""

    def __init__(self, problem: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.line = line
        self.column = column

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}: {self.problem}" if self.line is not None else self.problem

    def at(self, source: str) -> str:
        where = f"{source}:{self.line}:{self.column}" if self.line is not None else source
        return f"{where}: {self.problem}"


_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("daemonkit.yamldoc.deadline", default=None)


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Every ``compose`` in this context (this thread) fails once ``seconds`` have passed."""
    token = _deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


# --------------------------------------------------------------------------- words about content


def excerpt(text: str, limit: int = 40) -> str:
    """``repr`` of at most ``limit`` characters of ``text``, saying how long the rest is. For values
    that are plainly not secrets (a key name, a kind, a namespace); a whole value never."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"


def describe(node_or_value: object) -> str:
    """A YAML node or a loaded value by its type and size, never its content (``a string of 12
    characters``, ``a mapping``); true/false/null are shown, being no one's secret."""
    value = node_or_value
    if isinstance(value, (MappingNode, dict)):
        return "a mapping"
    if isinstance(value, (SequenceNode, list)):
        return "a list"
    if isinstance(value, ScalarNode):
        if not value.tag.startswith("tag:yaml.org,2002:"):
            return "a value with a tag of its own"
        kind = value.tag.rsplit(":", 1)[-1]
        if kind == "null":
            return "null"
        if kind == "bool":
            return str(value.value).lower()
        if kind == "str":
            return f"a string of {_chars(len(value.value))}"
        return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} of {_chars(len(value.value))}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"a string of {_chars(len(value))}"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _chars(n: int) -> str:
    return "1 character" if n == 1 else f"{n} characters"


_QUOTED = re.compile(r"'([^']{0,16})[^']*'")


def _problem(exc: yaml.YAMLError) -> YamlError:
    """PyYAML's words, without the file: its quoted names (an alias, a tag) cut short, the whole
    cut to a line, and no snippet."""
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or type(exc).__name__
    problem = str(problem).replace("tag:yaml.org,2002:", "!!")
    problem = _QUOTED.sub(lambda m: repr(m.group(1) + ("…" if len(m.group(0)) - 2 > 16 else "")), str(problem))
    if len(problem) > 120:
        problem = problem[:120] + "…"
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is None:
        return YamlError(f"not valid YAML: {problem}")
    return YamlError(f"not valid YAML: {problem}", mark.line + 1, mark.column + 1)


# --------------------------------------------------------------------------- the composer


class _Budgeted(Composer):  # type: ignore[misc]
    """PyYAML's composer, counting what each node costs with its aliases expanded."""

    def _start_budget(self, budget: Budget) -> None:
        self.budget = budget
        self.deadline = _deadline.get()
        self.nodes = 0
        self.chars = 0
        self.depth = 0
        #: anchor → (nodes, chars) of the subtree it names, once composed
        self.sizes: dict[str, tuple[int, int]] = {}

    def _refuse(self, problem: str, mark: Any) -> YamlError:
        return YamlError(problem, mark.line + 1, mark.column + 1) if mark is not None else YamlError(problem)

    def _spend(self, nodes: int, chars: int, mark: Any) -> None:
        self.nodes += nodes
        self.chars += chars
        if self.nodes > self.budget.max_nodes:
            raise self._refuse(f"more than {self.budget.max_nodes} YAML nodes once aliases are expanded "
                               "(an alias repeating a large subtree?)", mark)
        if self.chars > self.budget.max_chars:
            raise self._refuse(f"more than {self.budget.max_chars} characters of values once aliases are "
                               "expanded (an alias repeating a long value?)", mark)

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise self._refuse("reading took too long (the time limit of one configuration load)", event.start_mark)
        if isinstance(event, AliasEvent):
            if event.anchor in self.anchors:
                size = self.sizes.get(event.anchor)
                if size is None:
                    raise self._refuse("an alias inside the node its anchor names (a cycle)", event.start_mark)
                self._spend(*size, event.start_mark)
            return super().compose_node(parent, index)
        self.depth += 1
        if self.depth > self.budget.max_depth:
            raise self._refuse(f"nested deeper than {self.budget.max_depth} levels", event.start_mark)
        nodes, chars = self.nodes, self.chars
        self._spend(1, 0, event.start_mark)
        node: Node = super().compose_node(parent, index)
        if isinstance(node, ScalarNode):
            self._spend(0, len(node.value), event.start_mark)
        self.depth -= 1
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self.sizes[anchor] = (self.nodes - nodes, self.chars - chars)
        return node


# LibYAML's parser when PyYAML has it (its events in C: the scanning is the slow part), else PyYAML's
# own; either through PyYAML's public loader class (parser, safe constructor, resolver), whose
# composer ``_Budgeted`` replaces by coming first.
_SafeLoader: Any = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


class _Loader(_Budgeted, _SafeLoader):  # type: ignore[misc]
    def __init__(self, text: str, budget: Budget) -> None:
        _SafeLoader.__init__(self, text)
        _Budgeted.__init__(self)
        self._start_budget(budget)


def compose(text: str, budget: Budget = DEFAULT_BUDGET) -> Node | None:
    """The node tree of the one document in ``text`` (None when empty), within ``budget``; ``YamlError``."""
    if len(text) > budget.max_bytes:  # characters ≤ bytes: a cheap first check
        raise YamlError(f"larger than {budget.max_bytes} bytes")
    loader = _Loader(text, budget)
    try:
        return loader.get_single_node()
    except yaml.YAMLError as exc:
        raise _problem(exc) from None
    finally:
        loader.dispose()


def construct(node: Node | None) -> Any:
    """The Python value of a composed document (PyYAML's safe types only); ``YamlError``."""
    if node is None:
        return None
    try:
        return SafeConstructor().construct_document(node)
    except yaml.YAMLError as exc:
        raise _problem(exc) from None
    except (ValueError, OverflowError, TypeError) as exc:  # e.g. an integer past Python's digit limit
        mark = node.start_mark
        raise YamlError(f"a value that cannot be read ({type(exc).__name__})", mark.line + 1, mark.column + 1) from None


def load(text: str, budget: Budget = DEFAULT_BUDGET) -> Any:
    """``construct(compose(text))``."""
    return construct(compose(text, budget))


def read_text(path: Path, budget: Budget = DEFAULT_BUDGET) -> str:
    """The UTF-8 text of ``path``, reading at most ``budget.max_bytes`` + 1 bytes; ``OSError`` as
    ``open`` raises it, ``YamlError`` for a file too large or not UTF-8."""
    with path.open("rb") as f:
        data = f.read(budget.max_bytes + 1)
    return decode(data, budget)


def decode(data: bytes, budget: Budget = DEFAULT_BUDGET) -> str:
    """``data`` as UTF-8 within ``budget.max_bytes``; ``YamlError`` otherwise."""
    if len(data) > budget.max_bytes:
        raise YamlError(f"larger than {budget.max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlError(f"not UTF-8 text (byte {exc.start})") from None
