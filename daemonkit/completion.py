"""Shell completion for the three command lines (``kasd``, ``agentd``, ``kasctl``), written by shtab
from the same argparse parsers that read the command line, so a new flag or command completes
without anyone editing a script.

Each CLI offers it the way kubectl and gh do, as a command: ``PROG completion bash`` (or ``zsh``,
``fish``, ``tcsh``) prints the script; ``source <(kasctl completion bash)`` enables it for one shell.
Subcommands, flags and their fixed choices complete; a flag whose value is a file (metavar ``FILE``
or ``PATH``) completes file names, one that is a directory (``DIR``) directory names.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

import shtab

#: the shells a script is written for (shtab's, less PowerShell: these programs run on Linux)
SHELLS = ("bash", "zsh", "fish", "tcsh")
#: a value named so is a file, or a directory, on the command line of all three programs
FILE_METAVARS = frozenset({"FILE", "PATH"})
DIR_METAVARS = frozenset({"DIR"})

HELP = "print the shell completion script (source <(PROG completion bash))"


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser under it."""
    yield parser
    for action in parser._actions:  # argparse has no public walk of a parser's actions
        if isinstance(action.choices, Mapping):  # a subcommand's: its name → its parser
            for sub in action.choices.values():
                if isinstance(sub, argparse.ArgumentParser):
                    yield from _parsers(sub)


def mark_paths(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Tell shtab which values are files or directories (by their metavar), in every subcommand."""
    for each in _parsers(parser):
        for action in each._actions:
            if action.metavar in FILE_METAVARS:
                action.complete = shtab.FILE  # type: ignore[attr-defined]  # shtab's documented hook
            elif action.metavar in DIR_METAVARS:
                action.complete = shtab.DIRECTORY  # type: ignore[attr-defined]
    return parser


def _describe(command: argparse.ArgumentParser, prog: str) -> argparse.ArgumentParser:
    command.description = (
        f"Print the {prog} completion script for SHELL. Enable it for this shell with\n"
        f"  source <({prog} completion bash)\n"
        f"or for everyone (bash-completion loads it in each new shell):\n"
        f"  {prog} completion bash > /etc/bash_completion.d/{prog}\n"
        f"zsh: {prog} completion zsh > \"${{fpath[1]}}/_{prog}\"; "
        f"fish: {prog} completion fish > ~/.config/fish/completions/{prog}.fish"
    )
    command.formatter_class = argparse.RawDescriptionHelpFormatter
    command.add_argument("shell", choices=SHELLS, metavar="SHELL", help=f"one of {', '.join(SHELLS)}")
    return command


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser], prog: str) -> argparse.ArgumentParser:
    """The ``completion SHELL`` subcommand, under ``commands``."""
    return _describe(commands.add_parser("completion", help=HELP.replace("PROG", prog)), prog)


def whole_command_line(flags: Callable[[], argparse.ArgumentParser], prog: str, commands: Mapping[str, str], *,
                       with_flags: Collection[str] = ()) -> argparse.ArgumentParser:
    """A daemon's command line as completion sees it: its flags (``flags()``, the settings loader's
    parser), the commands its ``main`` reads before them (name → help; those in ``with_flags`` take
    the flags too), and ``completion``."""
    parser = flags()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, text in commands.items():
        if name in with_flags:
            sub.add_parser(name, help=text, parents=[flags()], add_help=False)
        else:
            sub.add_parser(name, help=text)
    add_command(sub, prog)
    return parser


def completion_main(parser: Callable[[], argparse.ArgumentParser], prog: str, argv: Sequence[str]) -> int:
    """``PROG completion SHELL`` of a daemon (``argv``: what follows ``completion``): the script of
    ``parser()`` on stdout; a wrong or missing SHELL is argparse's usage and exit 2."""
    shell = _describe(argparse.ArgumentParser(prog=f"{prog} completion"), prog).parse_args(list(argv)).shell
    print(script(parser(), shell), end="")
    return 0


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` (the program's whole command line) for ``shell``."""
    return shtab.complete(mark_paths(parser), shell=shell)


__all__ = ["SHELLS", "add_command", "completion_main", "mark_paths", "script", "whole_command_line"]
