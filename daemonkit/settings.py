"""The one settings loader of both daemons: file < environment < flags, into frozen attrs classes.

A daemon declares each setting once, as a field of an attrs class made with ``setting()``: its key
in the YAML file (the attribute name unless ``key=`` says otherwise), its environment variable and
flag if it has them, its help text, and ``parse``, the check that turns a raw value (YAML data, or
the text of a variable or flag) into the field's value or raises ``Problem``. A field whose type is
another such class (or a tuple of them, or one of them or None) is a mapping (a list) in the file.

``SettingsLoader`` derives the rest from those declarations: the argparse parser (``--help`` names
each flag's variable and default), the environment variables it reads, the layering, and errors that
blame the exact key, variable or flag a bad value came from. cattrs walks the file's structure (so
an error knows its path, ``access[0].agents[1]``), and the daemon's ``Blame`` words the message.
"""

from __future__ import annotations

import argparse
import ssl
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, Literal, NoReturn, Protocol, TypeVar

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, override

from daemonkit import yamldoc

T = TypeVar("T")

_META = "daemonkit.setting"
#: file key of a setting that has none (environment or flag only): no YAML key can be spelled so
_NO_FILE_KEY = "\0"


class SettingsError(Exception):
    """The settings are unusable; the message names the key, variable or flag and the problem."""


class UsageError(SettingsError):
    """The command line itself is wrong (unknown flag, a flag without its value): argparse's words,
    shown after the usage line."""


class Problem(ValueError):
    """What ``parse`` raises: ``text`` says what is wrong with the value; ``at`` names a part of it
    (``".cert"``, ``"[2]"``) when the problem is there; ``whole`` says ``text`` needs no blame."""

    def __init__(self, text: str, *, at: str = "", whole: bool = False) -> None:
        super().__init__(text)
        self.text = text
        self.at = at
        self.whole = whole


def ca_bundle(path: Path, *, at: str = "") -> Path:
    """``path`` once its CA bundle loads (now, so a wrong file is a configuration error naming it
    rather than an ``ssl.SSLError`` once the daemon runs); ``Problem`` saying what is wrong."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=str(path))
    except FileNotFoundError:
        raise Problem(f"CA file {path} does not exist", at=at) from None
    except ssl.SSLError:
        raise Problem(f"CA file {path} holds no PEM certificate", at=at) from None
    except OSError as exc:
        raise Problem(f"cannot read CA file {path}: {exc.strerror or exc}", at=at) from None
    return path


@attrs.frozen
class Source:
    """Where a value came from: ``kind`` is ``file``, ``env``, ``flag`` or ``default``; ``name`` is
    the file's path, the variable or the flag."""

    kind: str
    name: str = ""

    @property
    def rank(self) -> int:
        """file 0 < environment 1 < flags 2 (a default is -1)."""
        return {"file": 0, "env": 1, "flag": 2}.get(self.kind, -1)

    @property
    def is_override(self) -> bool:
        return self.kind in ("env", "flag")


DEFAULT = Source("default")


@attrs.frozen
class HostPort:
    """An address to listen on; port 0 picks a free port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


#: a flag takes one value, is repeated (a list), or takes none (sets True)
FlagAction = Literal["store", "append", "store_true"]


@attrs.frozen(kw_only=True)
class SettingMeta:
    """What ``setting()`` records on a field."""

    parse: Callable[[Any], Any] | None
    key: str | None
    in_file: bool
    env: str | None
    env_split: str | None
    flag: str | None
    flag_action: FlagAction
    metavar: str | None
    help: str
    show_default: str | None
    missing: str


def setting(
    default: Any = attrs.NOTHING,
    *,
    parse: Callable[[Any], Any] | None = None,
    key: str | None = None,
    in_file: bool = True,
    env: str | None = None,
    env_split: str | None = None,
    flag: str | None = None,
    flag_action: FlagAction = "store",
    metavar: str | None = None,
    help: str = "",
    show_default: str | None = None,
    factory: Callable[[], Any] | None = None,
    missing: str = "missing",
    repr: bool = True,
) -> Any:
    """An attrs field that is a setting (see the module docstring). ``missing`` is the problem
    reported when a setting without a default is absent everywhere."""
    meta = SettingMeta(
        parse=parse, key=key, in_file=in_file, env=env, env_split=env_split, flag=flag,
        flag_action=flag_action, metavar=metavar, help=help, show_default=show_default, missing=missing,
    )
    if factory is not None:
        return attrs.field(factory=factory, metadata={_META: meta}, repr=repr)
    return attrs.field(default=default, metadata={_META: meta}, repr=repr)


def _meta(field: attrs.Attribute[Any]) -> SettingMeta | None:
    meta = field.metadata.get(_META)
    return meta if isinstance(meta, SettingMeta) else None


def file_key(field: attrs.Attribute[Any]) -> str:
    """The field's key in the file (``_NO_FILE_KEY…`` for a setting the file may not hold)."""
    meta = _meta(field)
    if meta is None:
        return field.name
    if not meta.in_file:
        return _NO_FILE_KEY + field.name
    return meta.key or field.name


def shown_key(field: attrs.Attribute[Any]) -> str:
    meta = _meta(field)
    return (meta.key if meta is not None else None) or field.name


def file_keys(cls: type) -> list[str]:
    """The keys a file may give ``cls``, in declaration order."""
    return [file_key(f) for f in attrs.fields(cls) if not file_key(f).startswith(_NO_FILE_KEY)]


class Blame(Protocol):
    """How one daemon words its errors (kasd and agentd had their own before they shared this loader,
    and their operators' messages stay as they were)."""

    def where(self, key: str, source: Source, in_file: bool) -> str:
        """The prefix naming where the bad value at ``key`` came from."""

    def missing(self, where: str, problem: str) -> str: ...

    def unknown_keys(self, key: str, unknown: Sequence[str], known: Sequence[str], config: Path | None) -> str: ...

    def unreadable(self, config: Path, named_by: str, reason: str) -> str: ...

    def not_yaml(self, config: Path, error: yamldoc.YamlError) -> str: ...

    def not_a_mapping(self, config: Path, document: object) -> str | None:
        """The message for a file whose top level is not a mapping (None: the usual per-key one)."""


# --------------------------------------------------------------------------- structuring


def _is_attrs_class(tp: Any) -> bool:
    return isinstance(tp, type) and attrs.has(tp)


def _tuple_of_classes(tp: Any) -> bool:
    args = typing.get_args(tp)
    return typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis and _is_attrs_class(args[0])


_describe = yamldoc.describe  # (its type and size: never the value, which may be a secret)


def _converter() -> cattrs.Converter:
    converter = cattrs.Converter(detailed_validation=True, forbid_extra_keys=True)

    def parse_hook(parse: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
        def hook(value: Any, _type: Any) -> Any:
            return parse(value)

        return hook

    def class_hook(cls: type) -> Callable[[Any, Any], Any]:
        overrides: dict[str, Any] = {}
        for field in attrs.fields(cls):
            meta = _meta(field)
            rename = file_key(field)
            if meta is not None and meta.parse is not None:
                overrides[field.name] = override(rename=rename, struct_hook=parse_hook(meta.parse))
            elif rename != field.name:
                overrides[field.name] = override(rename=rename)
        structure: Callable[[Any, Any], Any] = make_dict_structure_fn(
            cls, converter, _cattrs_forbid_extra_keys=True, **overrides
        )

        def hook(value: Any, tp: Any) -> Any:
            if value is None:
                value = {}
            if not isinstance(value, Mapping):
                raise Problem(f"must be a mapping, got {_describe(value)}")
            return structure(value, tp)

        return hook

    def tuple_hook(tp: Any) -> Callable[[Any, Any], Any]:
        item_type = typing.get_args(tp)[0]

        def hook(value: Any, _tp: Any) -> tuple[Any, ...]:
            if value is None:
                return ()
            if not isinstance(value, list):
                raise Problem(f"must be a list, got {_describe(value)}")
            items, errors = [], []
            for index, item in enumerate(value):
                try:
                    items.append(converter.structure(item, item_type))
                except Exception as exc:
                    exc.__notes__ = [*getattr(exc, "__notes__", []), IterableValidationNote(f"@ index {index}", index, item_type)]
                    errors.append(exc)
            if errors:
                raise IterableValidationError(f"While structuring {tp!r}", errors, tp)
            return tuple(items)

        return hook

    converter.register_structure_hook_factory(_is_attrs_class, class_hook)
    converter.register_structure_hook_factory(_tuple_of_classes, tuple_hook)
    return converter


@attrs.frozen
class _Failure:
    key: str
    error: BaseException
    #: the class and field the error is in, when it is one field's
    cls: type | None = None
    field: attrs.Attribute[Any] | None = None


def _first_failure(error: BaseException, key: str = "", cls: type | None = None) -> _Failure:
    """The first leaf error of cattrs' error tree, with the file key path it happened at."""
    if isinstance(error, ClassValidationError | IterableValidationError):
        inner_cls = error.cl if isinstance(error, ClassValidationError) else cls
        # an unknown key first (a misspelt key also reads as a missing one), then in field order
        extra = [e for e in error.exceptions if isinstance(e, ForbiddenExtraKeysError)]
        sub = extra[0] if extra else error.exceptions[0]
        sub_key, field = key, None
        for note in getattr(sub, "__notes__", []):
            if isinstance(note, AttributeValidationNote) and isinstance(inner_cls, type) and attrs.has(inner_cls):
                field = attrs.fields_dict(inner_cls).get(note.name)
                name = shown_key(field) if field is not None else note.name
                sub_key = f"{key}.{name}" if key else name
            elif isinstance(note, IterableValidationNote):
                sub_key = f"{key}[{note.index}]"
        if isinstance(sub, ClassValidationError | IterableValidationError):
            return _first_failure(sub, sub_key, inner_cls)
        return _Failure(sub_key, sub, inner_cls, field)
    return _Failure(key, error, cls)


# --------------------------------------------------------------------------- the loader


@attrs.frozen
class _Leaf:
    """A setting that an environment variable or a flag can set."""

    path: tuple[str, ...]  # file keys from the top (the last may be a _NO_FILE_KEY one)
    field: attrs.Attribute[Any]
    meta: SettingMeta

    @property
    def key(self) -> str:
        return ".".join((*self.path[:-1], shown_key(self.field)))

    @property
    def dest(self) -> str:
        return "_".join(self.path).replace(_NO_FILE_KEY, "").replace(".", "_")


def _leaves(cls: type, prefix: tuple[str, ...] = ()) -> list[_Leaf]:
    found = []
    for field in attrs.fields(attrs.resolve_types(cls)):
        meta = _meta(field)
        path = (*prefix, file_key(field))
        if meta is not None and (meta.env or meta.flag):
            found.append(_Leaf(path, field, meta))
        elif (meta is None or meta.parse is None) and _is_attrs_class(field.type):
            found.extend(_leaves(field.type, path))
    return found


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


@attrs.frozen(kw_only=True)
class Loaded(Generic[T]):
    """The settings, and where each key's value came from (for the checks across settings)."""

    value: T
    #: the file's document with the environment's and the flags' values put in
    document: Mapping[str, Any]
    sources: Mapping[str, Source]
    config: Path | None
    blame: Blame

    def source(self, key: str) -> Source:
        return self.sources.get(key, Source("file", str(self.config)) if self.config is not None else DEFAULT)

    def where(self, key: str, *, in_file: bool = True) -> str:
        return self.blame.where(key, self.source(key), in_file)


class SettingsLoader(Generic[T]):
    """Loads ``cls`` from ``--config FILE`` (or ``config_env``) < environment < flags."""

    def __init__(
        self,
        cls: type[T],
        *,
        prog: str,
        description: str,
        epilog: str,
        config_env: str,
        blame: Blame,
        version: str,
        config_help: str = "YAML configuration file",
        prepare: Callable[[dict[str, Any], dict[str, Source]], None] | None = None,
    ) -> None:
        self.cls = cls
        self.prog = prog
        self.description = description
        self.epilog = epilog
        self.config_env = config_env
        self.config_help = config_help
        self.blame = blame
        self.version = version
        self.prepare = prepare
        self.leaves = _leaves(cls)
        self.converter = _converter()

    def parser(self) -> argparse.ArgumentParser:
        """The command line, generated from the declarations: each flag's help names its variable and
        its default."""
        parser = _ArgumentParser(
            prog=self.prog, description=self.description, epilog=self.epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument("--config", metavar="PATH", help=f"{self.config_help} (env: {self.config_env})")
        for leaf in self.leaves:
            meta = leaf.meta
            if meta.flag is None:
                continue
            notes = []
            if meta.env:
                notes.append(f"env: {meta.env}" + (f", {meta.env_split!r}-separated" if meta.env_split else ""))
            default = meta.show_default
            if default is None and leaf.field.default is not attrs.NOTHING and not isinstance(leaf.field.default, attrs.Factory):  # type: ignore[arg-type]
                shown = leaf.field.default
                default = None if shown in (None, (), "") else (f"{shown:g}" if isinstance(shown, float) else str(shown))
            if default:  # show_default="" hides it
                notes.append(f"default: {default}")
            text = meta.help + (f" ({'; '.join(notes)})" if notes else "")
            if meta.flag_action == "store_true":
                parser.add_argument(meta.flag, dest=leaf.dest, action="store_true", default=None, help=text)
            else:
                parser.add_argument(meta.flag, dest=leaf.dest, action=meta.flag_action, metavar=meta.metavar, help=text)
        parser.add_argument("--version", action="version", version=f"%(prog)s {self.version}")
        return parser

    def load(self, argv: Sequence[str], environ: Mapping[str, str]) -> Loaded[T]:
        """Flags (``argv`` without the program name) over ``environ`` over the file over defaults."""
        args = self.parser().parse_args(list(argv))
        config: Path | None = None
        document: dict[str, Any] = {}
        if args.config or environ.get(self.config_env):
            config = Path(args.config or environ[self.config_env])
            named_by = "--config" if args.config else self.config_env
            document = self._read(config, named_by)
        sources: dict[str, Source] = {}
        for leaf in self.leaves:
            value: Any = None
            if leaf.meta.env and environ.get(leaf.meta.env):
                value = environ[leaf.meta.env]
                if leaf.meta.env_split:
                    value = value.split(leaf.meta.env_split)
                sources[leaf.key] = Source("env", leaf.meta.env)
            if leaf.meta.flag and getattr(args, leaf.dest) is not None:
                value = getattr(args, leaf.dest)
                sources[leaf.key] = Source("flag", leaf.meta.flag)
            if leaf.key in sources:
                _put(document, leaf.path, value)
        if self.prepare is not None:
            self.prepare(document, sources)
        return self.structure(document, sources, config)

    def structure(self, document: Mapping[str, Any], sources: Mapping[str, Source], config: Path | None) -> Loaded[T]:
        """``document`` (the file with the environment and flags put in) into ``cls``; ``sources``
        says which keys came from a variable or a flag, ``config`` is the file the rest came from."""
        try:
            value = self.converter.structure(document, self.cls)
        except Exception as exc:
            blamed = Loaded(value=None, document=document, sources=sources, config=config, blame=self.blame)
            raise SettingsError(self._message(_first_failure(exc), blamed)) from None
        return Loaded(value=value, document=document, sources=sources, config=config, blame=self.blame)

    def _read(self, config: Path, named_by: str) -> dict[str, Any]:
        # The one bounded YAML reader (daemonkit.yamldoc): bytes, nodes with aliases expanded, depth.
        try:
            document = yamldoc.load(yamldoc.read_text(config))
        except OSError as exc:
            raise SettingsError(self.blame.unreadable(config, named_by, str(exc.strerror or exc))) from None
        except yamldoc.YamlError as exc:
            raise SettingsError(self.blame.not_yaml(config, exc)) from None
        if document is None:
            return {}
        if not isinstance(document, dict):
            message = self.blame.not_a_mapping(config, document)
            if message is None:
                where = self.blame.where("(top level)", Source("file", str(config)), True)
                message = f"{where}: must be a mapping, got {_describe(document)}"
            raise SettingsError(message)
        return document

    def _message(self, failure: _Failure, loaded: Loaded[Any]) -> str:
        error = failure.error
        if isinstance(error, ForbiddenExtraKeysError):
            known = file_keys(error.cl)
            unknown = sorted(str(k) for k in error.extra_fields)
            return self.blame.unknown_keys(failure.key, unknown, known, loaded.config)
        in_file = failure.field is None or not file_key(failure.field).startswith(_NO_FILE_KEY)
        if isinstance(error, KeyError) and failure.field is not None:
            meta = _meta(failure.field)
            return self.blame.missing(loaded.where(failure.key), meta.missing if meta else "missing")
        if isinstance(error, Problem):
            if error.whole:
                return error.text
            # the source is the setting's (failure.key), the place within it is error.at
            where = self.blame.where(failure.key + error.at, loaded.source(failure.key), in_file)
            return f"{where}: {error.text}"
        return f"{loaded.where(failure.key, in_file=in_file)}: {error}"


_SHARED: list[cattrs.Converter] = []


def structure(value: Any, tp: Any) -> Any:
    """``value`` (YAML data) into ``tp`` as the loader structures a file, for a setting whose ``parse``
    structures its part of the file itself and then checks across it (no two list items with one
    name): the errors it raises keep their path (``services[1].url``) in the loader's message."""
    if not _SHARED:
        _SHARED.append(_converter())
    return _SHARED[0].structure(value, tp)


def _put(document: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Set ``value`` at ``path``, making the mappings on the way (one that is not a mapping stays, and
    the structuring reports it)."""
    here: Any = document
    for part in path[:-1]:
        if here.get(part) is None:
            here[part] = {}
        here = here[part]
        if not isinstance(here, dict):
            return
    here[path[-1]] = value


__all__ = [
    "DEFAULT",
    "Blame",
    "HostPort",
    "Loaded",
    "Problem",
    "SettingsError",
    "SettingsLoader",
    "Source",
    "UsageError",
    "setting",
    "structure",
]
