"""The commands a simulated container can run: a few busybox-like built-ins and a small `sh`.

Each command is a Trio coroutine over a `CommandIO` (stdin/stdout/stderr as async byte calls),
returning its exit status. `sh -c` understands sequences (`;`, newline, `&&`, `||`, `&`),
pipelines, quoting, `$VAR`/`${VAR}`/`$?`/`$1`, `$(...)`, assignments, the redirects `>&2`, `2>&1`,
`>/dev/null`, and the built-ins `exit`, `export`, `unset`, `set -e`, `read`, `cd`, `wait`, `test`.
Messages follow busybox (`sh: foo: not found`, status 127), as in a busybox-based image.
`Terminal` stands in for a pty when exec or attach asks for a TTY.

The package is laid out by what each part holds; a module imports only those listed before it:

- `stdio`: the streams a command sees (`CommandIO`, `CapturedIO`, `Interrupts`) and the plumbing.
- `commands`: the table of commands and `run_command`.
- `parser`: `sh`'s syntax, sans-I/O (`parse_script`, `ShellSyntaxError`).
- `interpreter`: `sh` running a parsed script, with its own built-ins.
- `builtins`, `files`: the busybox-like commands, registered in the table as they are imported.
- `terminal`: the pty stand-in (`LineDiscipline`, `Terminal`).

Beyond the standard library, trio and attrs, it imports only kubesim's `fs`, `netsim`,
`httpservers` and `tarstream`; what runs commands (`processes`, `exec_ws`, the kubelet) imports it.
"""

from kubesim.shell import builtins, files
from kubesim.shell.commands import command_names, is_command, run_command
from kubesim.shell.parser import ShellSyntaxError, parse_script
from kubesim.shell.stdio import CapturedIO, CommandIO, Interrupts
from kubesim.shell.terminal import MAX_CANON, LineDiscipline, Terminal, TerminalInput

__all__ = [
    "MAX_CANON",
    "CapturedIO",
    "CommandIO",
    "Interrupts",
    "LineDiscipline",
    "ShellSyntaxError",
    "Terminal",
    "TerminalInput",
    "builtins",
    "command_names",
    "files",
    "is_command",
    "parse_script",
    "run_command",
]
