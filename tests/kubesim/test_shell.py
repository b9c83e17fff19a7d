"""The built-in commands and the small sh, over in-memory streams."""

from __future__ import annotations

import re

import pytest
import trio
import trio.testing

from kubesim.shell import (
    CapturedIO,
    LineDiscipline,
    ShellSyntaxError,
    Terminal,
    is_command,
    parse_script,
    run_command,
)

pytestmark = pytest.mark.timeout(10)

ENV = {"PATH": "/usr/bin:/bin", "HOSTNAME": "web-0", "X": "a  b", "EMPTY": ""}


async def run(argv: list[str], stdin: bytes = b"", *, tty: bool = False) -> tuple[int, str, str]:
    io = CapturedIO(stdin=stdin, tty=tty)
    status = await run_command(argv, io, ENV)
    return status, io.stdout.decode(), io.stderr.decode()


async def sh(script: str, stdin: bytes = b"") -> tuple[int, str, str]:
    return await run(["sh", "-c", script], stdin)


# -- commands ------------------------------------------------------------------------------------


async def test_echo() -> None:
    assert await run(["echo", "hello", "world"]) == (0, "hello world\n", "")
    assert await run(["echo", "-n", "no newline"]) == (0, "no newline", "")
    assert await run(["echo"]) == (0, "\n", "")
    assert await run(["/bin/echo", "-e", r"a\tb\c", "ignored"]) == (0, "a\tb", "")
    assert await run(["echo", "-x"]) == (0, "-x\n", "")


async def test_cat_copies_stdin_until_eof() -> None:
    assert await run(["cat"], b"one\ntwo") == (0, "one\ntwo", "")
    assert await run(["cat", "-"], b"") == (0, "", "")


async def test_cat_of_a_missing_file() -> None:
    assert await run(["cat", "/etc/passwd-nope"]) == (
        1,
        "",
        "cat: can't open '/etc/passwd-nope': No such file or directory\n",
    )
    assert await run(["cat", "/etc/hostname", "/dev/null"]) == (0, "web-0\n", "")


async def test_env_prints_the_container_env() -> None:
    status, out, _ = await run(["env"])
    assert status == 0
    assert out == "PATH=/usr/bin:/bin\nHOSTNAME=web-0\nX=a  b\nEMPTY=\n"
    assert await run(["env", "-i", "A=1", "env"]) == (0, "A=1\n", "")
    assert await run(["printenv", "HOSTNAME"]) == (0, "web-0\n", "")


async def test_date_looks_like_busybox() -> None:
    status, out, _ = await run(["date"])
    assert status == 0
    assert re.fullmatch(r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d UTC \d{4}\n", out)
    status, out, _ = await run(["date", "+%Y-%m-%dT%H:%M:%S.%N"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}\n", out)
    assert (await run(["date", "--bogus"]))[0] == 1


async def test_sleep_takes_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    start = trio.current_time()
    assert await run(["sleep", "1.5"]) == (0, "", "")
    assert await run(["sleep", "1m"]) == (0, "", "")
    assert trio.current_time() - start == pytest.approx(61.5)
    assert await run(["sleep", "soon"]) == (1, "", "sleep: invalid number 'soon'\n")


async def test_sleep_is_cancellable(autojump_clock: trio.testing.MockClock) -> None:
    with trio.move_on_after(5) as scope:
        await run(["sleep", "infinity"])
    assert scope.cancelled_caught


async def test_true_false_exit() -> None:
    assert await run(["true"]) == (0, "", "")
    assert await run(["false"]) == (1, "", "")
    assert await run(["exit", "42"]) == (42, "", "")
    assert await run(["exit", "256"]) == (0, "", "")


async def test_unknown_command() -> None:
    assert await run(["frobnicate", "x"]) == (127, "", "sh: frobnicate: not found\n")
    assert not is_command("frobnicate")
    assert is_command("/bin/sh") and is_command("/usr/bin/env") and not is_command("/opt/sh")


# -- sh -c -------------------------------------------------------------------------------------


async def test_sequences_and_conditionals() -> None:
    assert await sh("echo a; echo b") == (0, "a\nb\n", "")
    assert await sh("true && echo yes || echo no") == (0, "yes\n", "")
    assert await sh("false && echo yes || echo no") == (0, "no\n", "")
    assert await sh("false; echo $?; ! false; echo $?") == (0, "1\n0\n", "")
    assert await sh("echo one\necho two\n") == (0, "one\ntwo\n", "")


async def test_exit_status_and_exit() -> None:
    assert await sh("false") == (1, "", "")
    assert await sh("exit 7; echo never") == (7, "", "")
    assert await sh("true && exit 3") == (3, "", "")
    assert await sh("false; exit") == (1, "", "")
    assert await sh("set -e; echo a; false; echo b") == (1, "a\n", "")


async def test_quoting_and_expansion() -> None:
    assert await sh("echo \"$HOSTNAME\" '$HOSTNAME' ${HOSTNAME}x \\$HOSTNAME") == (
        0,
        "web-0 $HOSTNAME web-0x $HOSTNAME\n",
        "",
    )
    # Unquoted expansions are split into fields; quoted ones are kept whole.
    assert await run(["sh", "-c", 'printf "[%s]" $X "$X" $EMPTY "$EMPTY"']) == (
        0,
        "[a][b][a  b][]",
        "",
    )
    assert await sh('Y="1 2"; echo "$Y" $Y; export Z=3; env | cat') == (
        0,
        "1 2 1 2\nPATH=/usr/bin:/bin\nHOSTNAME=web-0\nX=a  b\nEMPTY=\nZ=3\n",
        "",
    )
    assert await sh("A=1 env | cat") == (0, "PATH=/usr/bin:/bin\nHOSTNAME=web-0\nX=a  b\nEMPTY=\nA=1\n", "")
    assert await run(["sh", "-c", "echo $0:$1:$#", "me", "first"]) == (0, "me:first:1\n", "")


async def test_redirects() -> None:
    assert await sh("echo out; echo err >&2; echo err2 1>&2") == (0, "out\n", "err\nerr2\n")
    assert await sh("cat missing 2>&1") == (1, "cat: can't open 'missing': No such file or directory\n", "")
    assert await sh("echo gone >/dev/null; cat missing 2>/dev/null; echo $?") == (0, "1\n", "")
    # A container's /sys is mounted read-only (its /tmp is writable now: see test_files.py).
    assert await sh("echo x > /sys/file") == (1, "", "sh: can't create /sys/file: Read-only file system\n")


async def test_pipelines_and_substitution() -> None:
    assert await sh("echo hi | cat | cat") == (0, "hi\n", "")
    assert await sh("echo before $(echo inner; echo two) after") == (0, "before inner two after\n", "")
    assert await sh("echo `echo tick`") == (0, "tick\n", "")
    assert await sh("cat | cat", b"piped\n") == (0, "piped\n", "")


async def test_read_and_stdin() -> None:
    assert await sh("read a b; echo [$b] [$a]; cat", b"x y z\nrest") == (0, "[y z] [x]\nrest", "")


async def test_test_builtin() -> None:
    assert await sh('[ "$HOSTNAME" = web-0 ] && echo same') == (0, "same\n", "")
    assert await sh("test 2 -gt 10 || echo smaller; [ -z \"$EMPTY\" ] && echo empty") == (
        0,
        "smaller\nempty\n",
        "",
    )


async def test_background_jobs(autojump_clock: trio.testing.MockClock) -> None:
    assert await sh("(echo)") == (2, "", 'sh: syntax error: unexpected "("\n')
    start = trio.current_time()
    assert await sh("sleep 5 & echo started; wait; echo done") == (0, "started\ndone\n", "")
    assert trio.current_time() - start == pytest.approx(5)


async def test_unknown_command_in_script() -> None:
    assert await sh("nope; echo $?") == (0, "127\n", "sh: nope: not found\n")
    assert await sh("nope") == (127, "", "sh: nope: not found\n")


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("echo 'open", "unterminated quoted string"),
        ("; echo", 'unexpected ";"'),
        ("echo a &&", "unexpected end of file"),
        ("if true; then echo; fi", "not supported"),
    ],
)
async def test_syntax_errors(script: str, message: str) -> None:
    status, out, err = await sh(script)
    assert (status, out) == (2, "")
    assert err.startswith("sh: ") and message in err


def test_parse_reports_incomplete_input() -> None:
    with pytest.raises(ShellSyntaxError) as info:
        parse_script('echo "still open')
    assert info.value.incomplete


# -- interactive sh ----------------------------------------------------------------------------


async def test_interactive_sh_without_tty_runs_lines_silently() -> None:
    stdin = b"echo one\nX=2; echo $X\necho 'multi\nline'\nexit 4\necho never\n"
    assert await run(["sh"], stdin) == (4, "one\n2\nmulti\nline\n", "")
    assert await run(["sh"], b"false") == (1, "", "")


async def test_interactive_sh_prompts_on_a_tty() -> None:
    status, out, err = await run(["sh"], b"echo hi\n", tty=True)
    assert (status, out) == (0, "hi\n")
    assert err == "/ # / # "


async def test_interactive_commands_share_stdin() -> None:
    assert await run(["sh"], b"read v\nremaining line\necho got $v\n") == (0, "got remaining line\n", "")


# -- terminal ----------------------------------------------------------------------------------


def test_line_discipline_cooks_input() -> None:
    tty = LineDiscipline()
    typed = tty.feed(b"ech\x7fho hi\r")
    assert typed.reads == (b"echo hi\n",)
    assert typed.echo == b"ech\b \bho hi\r\n"
    assert tty.feed(b"partial\x04").reads == (b"partial",)
    assert not tty.feed(b"").eof
    # ^D on an empty line is an EOF for one read; typing goes on after it.
    after = tty.feed(b"\x04more\r")
    assert after.eof and after.reads == (b"", b"more\n")
    interrupted = tty.feed(b"abc\x03de\r")
    assert interrupted.interrupt and interrupted.echo == b"abc^C\r\nde\r\n"
    assert interrupted.reads == (b"de\n",)
    assert tty.feed(b"x\x15\r").reads == (b"\n",)
    assert tty.feed(b"\x1b[A").echo == b"^[[A"
    assert LineDiscipline.output(b"a\nb\n") == b"a\r\nb\r\n"


def test_line_discipline_is_bounded_and_quit_is_no_input() -> None:
    """A client typing without end used to grow the line without bound; n_tty keeps 4095 bytes
    and rings the bell for the rest, the line's end still taken. ^\\ is SIGQUIT's key: echoed and
    flushing the line, never part of it (it was, so `sh` ran "\\x1cecho")."""
    tty = LineDiscipline()
    typed = tty.feed(b"y" * 5000)
    assert typed.echo == b"y" * 4095 + b"\a" * 905
    assert tty.feed(b"\r").reads == (b"y" * 4095 + b"\n",)
    quit_then_line = tty.feed(b"junk\x1cecho q\r")
    assert quit_then_line.echo == b"junk^\\echo q\r\n"
    assert quit_then_line.reads == (b"echo q\n",)


async def test_terminal_runs_a_shell() -> None:
    raw = CapturedIO(stdin=b"echo $HOSTNAME >&2\rexit 9\r", tty=True)
    terminal = Terminal(raw)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(terminal.pump_input)
        status = await run_command(["sh"], terminal, ENV)
    assert status == 9
    out = bytes(raw.stdout)
    # Echo, the prompt and stderr all reach the one terminal; \n becomes \r\n.
    assert b"web-0\r\n" in out and b"echo $HOSTNAME >&2\r\n" in out and b"/ # " in out
    assert raw.stderr == b""


async def test_terminal_eof_ends_one_read_only() -> None:
    raw = CapturedIO(stdin=b"cat\rtyped\r\x04echo after\r\x04", tty=True)
    terminal = Terminal(raw)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(terminal.pump_input)
        status = await run_command(["sh"], terminal, ENV)
    assert status == 0
    # cat ended at the first ^D; the shell went on to the next command and ended at the second.
    out = bytes(raw.stdout).replace(b"/ # ", b"")
    assert out == b"cat\r\ntyped\r\necho after\r\ntyped\r\nafter\r\n"


async def test_terminal_interrupt(autojump_clock: trio.testing.MockClock) -> None:
    send, receive = trio.open_memory_channel[bytes](1)

    class Keyboard(CapturedIO):
        async def read_stdin(self) -> bytes:
            try:
                return await receive.receive()
            except trio.EndOfChannel:
                return b""

    raw = Keyboard(tty=True)
    with trio.CancelScope() as scope:
        terminal = Terminal(raw, on_interrupt=scope.cancel)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(terminal.pump_input)
            nursery.start_soon(run_command, ["sleep", "1000"], terminal, ENV)
            await trio.sleep(1)
            await send.send(b"\x03")
    assert scope.cancelled_caught
    assert bytes(raw.stdout) == b"^C\r\n"
    assert trio.current_time() < 10


async def test_text_tools() -> None:
    assert await sh("yes | head -n 3") == (0, "y\ny\ny\n", "")
    assert await sh("seq 5 | tail -n 2; seq 2 2 7; seq 3 -1 1") == (0, "4\n5\n2\n4\n6\n3\n2\n1\n", "")
    assert await sh('printf "b\\na\\nc\\na\\n" | sort -u | wc -l') == (0, "3\n", "")
    assert await sh("printf '10\\n9\\n' | sort -n | head -1") == (0, "9\n", "")
    assert await sh("env | grep -c HOST; echo abc | grep -q x; echo $?") == (0, "1\n1\n", "")
    assert await sh("printf 'x1\\ny\\nX2\\n' | grep -vi y; echo hi | grep 'h\\|q'") == (0, "x1\nX2\nhi\n", "")
    assert await sh("echo hello world | wc") == (0, "      1       2      12\n", "")
    assert await sh("grep x nofile") == (2, "", "grep: nofile: No such file or directory\n")
