"""daemonkit's settings loader on a small declaration: file < environment < flags, the parser and
its help generated from the declarations, and errors that blame the exact key, variable or flag."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from daemonkit import yamldoc
from daemonkit.settings import Problem, SettingsError, SettingsLoader, Source, UsageError, setting

pytestmark = pytest.mark.timeout(10)


def _port(value: Any) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise Problem(f"must be a port number, got {value!r}")
    return value


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Problem("must be a list of names")
    return tuple(value)


@attrs.frozen(kw_only=True)
class Listener:
    port: int = setting(8080, parse=_port, env="DEMO_PORT", flag="--port", metavar="PORT", help="where to listen")


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise Problem("must be a string")
    return value


@attrs.frozen(kw_only=True)
class Item:
    name: str = setting(parse=_string)


@attrs.frozen(kw_only=True)
class Settings:
    listener: Listener = Listener()
    items: tuple[Item, ...] = ()
    names: tuple[str, ...] = setting(
        (), key="name", parse=_names, env="DEMO_NAMES", env_split=",", flag="--name", flag_action="append",
        metavar="NAME", help="a name; repeatable",
    )
    secret_file: str = setting("", parse=str, in_file=False, env="DEMO_SECRET_FILE", help="file only from env")


class _Blame:
    def where(self, key: str, source: Source, in_file: bool) -> str:
        return f"{source.kind}:{source.name}:{key}"

    def missing(self, where: str, problem: str) -> str:
        return f"{where}: {problem}"

    def unknown_keys(self, key: str, unknown: Sequence[str], known: Sequence[str], config: Path | None) -> str:
        return f"{key or '(top)'}: unknown {', '.join(unknown)}; known {', '.join(known)}"

    def unreadable(self, config: Path, named_by: str, reason: str) -> str:
        return f"{named_by}: unreadable"

    def not_yaml(self, config: Path, error: yamldoc.YamlError) -> str:
        return f"not yaml: {error}"

    def not_a_mapping(self, config: Path, document: object) -> str | None:
        return None


LOADER = SettingsLoader(
    Settings, prog="demo", description="a demo", epilog="", config_env="DEMO_CONFIG", blame=_Blame(), version="1"
)


def _file(tmp_path: Path, doc: object) -> str:
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(doc))
    return str(tmp_path / "demo.yaml")


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    config = _file(tmp_path, {"listener": {"port": 1}, "name": ["a"], "items": [{"name": "x"}]})
    loaded = LOADER.load(["--config", config], {})
    assert loaded.value == Settings(listener=Listener(port=1), names=("a",), items=(Item(name="x"),))
    loaded = LOADER.load([], {"DEMO_CONFIG": config, "DEMO_PORT": "2", "DEMO_NAMES": "b,c"})
    assert (loaded.value.listener.port, loaded.value.names) == (2, ("b", "c"))
    assert loaded.source("listener.port") == Source("env", "DEMO_PORT")
    assert loaded.source("items") == Source("file", config)
    loaded = LOADER.load(["--port", "3", "--name", "d", "--name", "e"], {"DEMO_CONFIG": config, "DEMO_PORT": "2"})
    assert (loaded.value.listener.port, loaded.value.names) == (3, ("d", "e"))
    assert loaded.source("listener.port") == Source("flag", "--port")


def test_errors_blame_the_key_variable_or_flag(tmp_path: Path) -> None:
    config = _file(tmp_path, {"listener": {"port": "x"}})
    with pytest.raises(SettingsError, match=rf"^file:{config}:listener.port: must be a port number, got 'x'$"):
        LOADER.load(["--config", config], {})
    with pytest.raises(SettingsError, match=r"^env:DEMO_PORT:listener.port: must be a port number"):
        LOADER.load([], {"DEMO_PORT": "99999"})
    with pytest.raises(SettingsError, match=r"^flag:--port:listener.port: must be a port number"):
        LOADER.load(["--port", "-1"], {"DEMO_PORT": "1"})
    config = _file(tmp_path, {"items": [{"name": "a"}, {"name": 5}]})
    with pytest.raises(SettingsError, match=r":items\[1\].name: must be a string$"):
        LOADER.load(["--config", config], {})
    config = _file(tmp_path, {"items": [{}]})
    with pytest.raises(SettingsError, match=r":items\[0\].name: missing$"):
        LOADER.load(["--config", config], {})


def test_unknown_keys_come_first_and_environment_only_settings_are_not_file_keys(tmp_path: Path) -> None:
    config = _file(tmp_path, {"listener": {"prot": 1}, "items": [{}]})
    with pytest.raises(SettingsError, match=r"^listener: unknown prot; known port$"):
        LOADER.load(["--config", config], {})
    config = _file(tmp_path, {"secret_file": "x"})
    with pytest.raises(SettingsError, match=r"^\(top\): unknown secret_file; known listener, items, name$"):
        LOADER.load(["--config", config], {})
    assert LOADER.load([], {"DEMO_SECRET_FILE": "/s"}).value.secret_file == "/s"


def test_help_names_each_flags_variable_and_default() -> None:
    text = LOADER.parser().format_help()
    assert "--port PORT" in text and "where to listen (env: DEMO_PORT; default: 8080)" in text
    assert "(env: DEMO_NAMES, ','-separated)" in text
    assert "--config PATH" in text and "(env: DEMO_CONFIG)" in text
    assert "DEMO_SECRET_FILE" not in text  # no flag, so not a command-line option


def test_a_wrong_command_line_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unrecognized arguments: --bogus"):
        LOADER.load(["--bogus"], {})


def test_the_file_is_read_within_the_yaml_budget_and_never_quoted(tmp_path: Path) -> None:
    """The daemons' own config files go through the same bounded reader as an agent's config.yaml:
    an alias bomb is refused at once, and a file that is one scalar (a config flag pointed at a
    token file) is described, not quoted."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)))
    with pytest.raises(SettingsError, match=r"^not yaml: line \d+, column \d+: more than 100000 YAML nodes"):
        LOADER.load(["--config", str(bomb)], {})
    token = tmp_path / "token"
    token.write_text("glpat-s3cr3tZq9xWv7Tb2\n")
    with pytest.raises(SettingsError) as info:
        LOADER.load(["--config", str(token)], {})
    assert "must be a mapping, got a string of 22 characters" in str(info.value)
    assert "s3cr3t" not in str(info.value)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (yamldoc.DEFAULT_BUDGET.max_bytes + 1))
    with pytest.raises(SettingsError, match="larger than"):
        LOADER.load(["--config", str(big)], {})
