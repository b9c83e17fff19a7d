"""The shell over a container's filesystem: cwd, file redirects, ls/mkdir/rm/cp/mv, tar; and ^C on
a terminal, which interrupts the foreground command of an interactive sh, not the sh."""

from __future__ import annotations

import io as stdio
import os
import tarfile

import pytest
import trio
import trio.testing

from kubesim import tarstream
from kubesim.fs import FileSystem, container_tree
from kubesim.shell import CapturedIO, Terminal, run_command

pytestmark = pytest.mark.timeout(10)

ENV = {"PATH": "/bin", "HOSTNAME": "pod-0", "HOME": "/root"}


@pytest.fixture
def fs() -> FileSystem:
    return container_tree(FileSystem(), hostname="pod-0")


async def sh(fs: FileSystem, script: str, stdin: bytes = b"") -> tuple[int, str, str]:
    io = CapturedIO(stdin=stdin)
    status = await run_command(["sh", "-c", script], io, ENV, fs=fs)
    return status, io.stdout.decode(), io.stderr.decode()


async def test_cwd_and_redirects(fs: FileSystem) -> None:
    assert await sh(fs, "cd /tmp && pwd && echo one > f && echo two >> f && cat f && cat < f") == (
        0, "/tmp\none\ntwo\none\ntwo\n", "")
    assert fs.read_file("/tmp/f") == b"one\ntwo\n"
    assert await sh(fs, "cd /nope") == (2, "", "sh: cd: can't cd to /nope: No such file or directory\n")
    assert await sh(fs, "echo x > /nope/f") == (1, "", "sh: can't create /nope/f: nonexistent directory\n")
    assert await sh(fs, "cat < /nope") == (1, "", "sh: can't open /nope: no such file\n")
    assert await sh(fs, "cat /tmp") == (1, "", "cat: read error: Is a directory\n")
    assert await sh(fs, "wc -l < /etc/passwd; grep -c root /etc/passwd") == (0, "9\n1\n", "")
    assert await sh(fs, "echo err 2> /tmp/e >&2; cat /tmp/e") == (0, "err\n", "")


async def test_file_commands(fs: FileSystem) -> None:
    assert await sh(fs, "mkdir -p /a/b/c && touch /a/b/c/x && cd /a && ls -1 b/c && ls") == (
        0, "x\nb\n", "")
    assert await sh(fs, "mkdir /a") == (1, "", "mkdir: can't create directory '/a': File exists\n")
    assert await sh(fs, "test -d /a && test -f /a/b/c/x && [ -e /a/b ] && ! test -f /a; echo $?") == (0, "0\n", "")
    assert await sh(fs, "test -s /a/b/c/x || echo empty") == (0, "empty\n", "")
    assert await sh(fs, "cp -r /a /copy && mv /copy/b/c/x /copy/y && ls /copy /copy/b/c") == (
        0, "/copy:\nb\ny\n\n/copy/b/c:\n", "")
    assert await sh(fs, "cp /a /z") == (1, "", "cp: omitting directory '/a'\n")
    assert await sh(fs, "cp /nope /z") == (1, "", "cp: can't stat '/nope': No such file or directory\n")
    assert await sh(fs, "rm /a") == (1, "", "rm: '/a' is a directory\n")
    assert await sh(fs, "rm /nope") == (1, "", "rm: can't remove '/nope': No such file or directory\n")
    assert await sh(fs, "rm -rf /a /nope && ls /a") == (1, "", "ls: /a: No such file or directory\n")
    fs.write_file("/tmp/data", b"12345")
    status, out, _ = await sh(fs, "ls -l /tmp")
    lines = out.splitlines()
    assert status == 0 and lines[0] == "total 4"
    assert lines[1].startswith("-rw-r--r--    1 root     root             5 ") and lines[1].endswith(" data")
    status, out, _ = await sh(fs, "ls -la /tmp")
    assert [line.split()[-1] for line in out.splitlines()[1:]] == [".", "..", "data"]
    assert out.splitlines()[1].startswith("drwxrwxrwt ")


async def test_disk_full_is_reported() -> None:
    small = container_tree(FileSystem(capacity=20_000))
    status, _, err = await sh(small, "yes > /tmp/big")
    assert (status, err) == (1, "yes: write error: No space left on device\n")
    assert small.statistics().bytes_used == 20_000


def _archive(members: dict[str, bytes | None], *, fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    buffer = stdio.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                archive.addfile(info)
            else:
                info.size = len(data)
                info.mode = 0o640
                info.mtime = 1_000_000_000
                archive.addfile(info, stdio.BytesIO(data))
    return buffer.getvalue()


async def test_tar_extract_then_create_round_trips(fs: FileSystem) -> None:
    long_name = "dest/" + "deep/" * 30 + "file.bin"
    members = {"dest": None, "dest/a.txt": b"hello\n", "dest/empty": b"", "dest/sub": None,
               "dest/sub/big.bin": os.urandom(300_000), long_name: b"long"}
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        fs.remove("/tmp", recursive=True)
        fs.mkdir("/tmp")
        status, out, err = await sh(fs, "tar -xmf - -C /tmp", _archive(members, fmt=fmt))
        assert (status, out, err) == (0, "", "")
        assert fs.read_file("/tmp/dest/sub/big.bin") == members["dest/sub/big.bin"]
        assert fs.read_file("/tmp/" + long_name) == b"long"
        assert oct(fs.stat("/tmp/dest/a.txt").mode & 0o777) == "0o640"
    status, out, err = await sh(fs, "tar xf - -C /tmp", _archive({"dest/a.txt": b"x"}))
    assert int(fs.stat("/tmp/dest/a.txt").mtime) == 1_000_000_000  # without -m, mtimes are kept

    io = CapturedIO()
    status = await run_command(["tar", "cf", "-", "/tmp/dest"], io, ENV, fs=fs)
    assert (status, io.stderr) == (0, b"tar: removing leading '/' from member names\n")
    assert len(io.stdout) % 512 == 0 and io.stdout.endswith(tarstream.END_OF_ARCHIVE)
    with tarfile.open(fileobj=stdio.BytesIO(bytes(io.stdout))) as archive:
        names = archive.getnames()
        assert "tmp/dest/" in [m.name + ("/" if m.isdir() else "") for m in archive.getmembers()]
        assert archive.extractfile("tmp/dest/sub/big.bin").read() == members["dest/sub/big.bin"]  # type: ignore[union-attr]
        assert archive.extractfile("tmp/" + long_name).read() == b"long"  # type: ignore[union-attr]
    assert "tmp/dest/empty" in names
    assert await sh(fs, "cd /tmp && tar cf /root/a.tar dest && tar tf /root/a.tar | head -n 2") == (
        0, "dest/\ndest/a.txt\n", "")


async def test_tar_errors(fs: FileSystem) -> None:
    assert await sh(fs, "tar cf - /nope") == (
        1, "\0" * 1024, "tar: /nope: No such file or directory\ntar: error exit delayed from previous errors\n")
    assert await sh(fs, "tar -xmf - -C /nope", b"") == (
        1, "", "tar: can't change directory to '/nope': No such file or directory\n")
    assert await sh(fs, "tar xf -", b"not a tar archive" * 40) == (1, "", "tar: invalid tar magic\n")
    assert await sh(fs, "tar xf -", _archive({"f": b"x" * 1000})[:700]) == (1, "", "tar: short read\n")
    assert await sh(fs, "tar cf -") == (1, "", "tar: empty archive\n")
    status, _, err = await sh(fs, "tar xf - -C /tmp", _archive({"../../etc/evil": b"x"}))
    assert (status, err) == (0, "tar: removing leading '../../' from member names\n")
    assert fs.read_file("/tmp/etc/evil") == b"x"
    small = container_tree(FileSystem(capacity=50_000))
    status, _, err = await sh(small, "tar xf - -C /tmp", _archive({"big": b"x" * 100_000}))
    assert (status, err) == (1, "tar: write error: No space left on device\n")


def _negative_size_archive() -> bytes:
    """A member whose size field is GNU base-256 for -1 (a valid checksum, so only the size lies)."""
    header = bytearray(tarfile.TarInfo("f").tobuf(tarfile.GNU_FORMAT))
    header[124:136] = b"\xff" * 12
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + b"x" * 512 + tarstream.END_OF_ARCHIVE


def _pax_archive(records: dict[str, str]) -> bytes:
    buffer = stdio.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo("f")
        info.size, info.pax_headers = 3, records
        archive.addfile(info, stdio.BytesIO(b"abc"))
    return buffer.getvalue()


async def test_tar_refuses_hostile_sizes_and_survives_odd_mtimes(fs: FileSystem) -> None:
    """A negative size (base-256's sign bit) or a pax size that is not a number is a broken
    archive: tar says so and exits 1, instead of the reader running backwards for ever (it
    looped, buffering empty events until memory ran out) or an uncaught ValueError."""
    with trio.fail_after(10):
        assert await sh(fs, "tar xf - -C /tmp", _negative_size_archive()) == (
            1, "", "tar: corrupted octal value in tar header\n")
        assert await sh(fs, "tar xf - -C /tmp", _pax_archive({"size": "-5"})) == (
            1, "", "tar: invalid pax header\n")
        assert await sh(fs, "tar xf - -C /tmp", _pax_archive({"size": "abc"})) == (
            1, "", "tar: invalid pax header\n")
        for mtime in ("nan", "1e400", "abc", "-1e300"):
            assert await sh(fs, "tar xf - -C /tmp", _pax_archive({"mtime": mtime})) == (0, "", "")
            assert fs.read_file("/tmp/f") == b"abc"
            status, out, _ = await sh(fs, "ls -l /tmp/f")
            assert status == 0 and out.endswith("/tmp/f\n")


async def test_a_tree_deeper_than_the_recursion_limit(fs: FileSystem) -> None:
    """mkdir -p takes paths up to PATH_MAX (about 2000 levels); tar c, cp -r, rm -r and the
    filesystem's walk used to recurse a Python frame per level and died of RecursionError
    (rm -r after unlinking, so the disk's accounting leaked what it removed)."""
    before = fs.statistics()
    deep = "/t/" + "a/" * 1500
    assert await sh(fs, f"mkdir -p {deep} && echo x > {deep}f") == (0, "", "")
    status, out, err = await sh(fs, "tar cf - /t | tar tf - | wc -l")
    assert (status, out.strip(), err) == (0, "1502", "tar: removing leading '/' from member names\n")
    assert len(list(fs.walk("/t"))) == 1502
    assert await sh(fs, f"cp -r /t /t2 && cat /t2/{'a/' * 1500}f") == (0, "x\n", "")
    assert await sh(fs, "rm -r /t /t2 && ls /t") == (1, "", "ls: /t: No such file or directory\n")
    assert fs.statistics() == before


@pytest.mark.parametrize("chunk", [1, 7, 512, 4096])
def test_tar_reader_under_any_chunking(chunk: int) -> None:
    data = _archive({"d": None, "d/f": b"abc" * 700, "e": b""}, fmt=tarfile.PAX_FORMAT)
    reader = tarstream.TarReader()
    events = [e for start in range(0, len(data), chunk) for e in reader.feed(data[start : start + chunk])]
    members = [e.name for e in events if isinstance(e, tarstream.Member)]
    content = b"".join(e.data for e in events if isinstance(e, tarstream.Data))
    assert members == ["d/", "d/f", "e"] and content == b"abc" * 700 and reader.ended


# -- ^C ------------------------------------------------------------------------------------------


class _Keyboard:
    """The connection side of a terminal: keys typed by the test, output collected."""

    def __init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel[bytes](16)
        self.output = bytearray()
        self.changed = trio.Event()
        self.tty = True

    async def read_stdin(self) -> bytes:
        try:
            return await self.receive.receive()
        except trio.EndOfChannel:
            return b""

    async def write_stdout(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.output += data
        self.changed.set()
        self.changed = trio.Event()

    async def write_stderr(self, data: bytes) -> None:
        await self.write_stdout(data)

    async def wait_for(self, text: bytes) -> None:
        while not self.output.endswith(text):
            await self.changed.wait()


async def test_ctrl_c_interrupts_the_foreground_command_not_the_shell(
        fs: FileSystem, autojump_clock: trio.testing.MockClock) -> None:
    keyboard = _Keyboard()
    shell_ended = []

    def base() -> None:  # what exec does when nothing else takes ^C: end the command
        shell_ended.append(True)

    terminal = Terminal(keyboard, on_interrupt=base)
    status: list[int] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(terminal.pump_input)

            async def shell() -> None:
                status.append(await run_command(["sh"], terminal, ENV, fs=fs))

            nursery.start_soon(shell)
            await keyboard.wait_for(b"/ # ")
            for command in (b"sleep 100\r", b"cat\r", b"sleep 100 | cat > /dev/null\r", b"cat | head -n 1\r"):
                await keyboard.send.send(command)
                await trio.sleep(1)  # (mock clock) the command is running now
                await keyboard.send.send(b"\x03")
                await keyboard.wait_for(b"^C\r\n/ # ")
                await keyboard.send.send(b"echo status=$?\r")
                await keyboard.wait_for(b"status=130\r\n/ # ")
            await keyboard.send.send(b"half a line\x03")
            await keyboard.wait_for(b"half a line^C\r\n/ # ")
            await keyboard.send.send(b"echo still here\r")
            await keyboard.wait_for(b"still here\r\n/ # ")
            await keyboard.send.send(b"\x04")  # ^D on an empty line: the shell ends
            await keyboard.send.aclose()  # (and then the connection)
    assert status == [0] and not shell_ended


async def test_without_a_tty_ctrl_c_is_data(fs: FileSystem) -> None:
    io = CapturedIO(stdin=b"a\x03b\n")
    assert await run_command(["cat"], io, ENV, fs=fs) == 0
    assert bytes(io.stdout) == b"a\x03b\n"


async def test_whole_input_commands_bound_stdin(fs: FileSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """sort, tail, wc and grep hold their whole input: from a file it was capped, from stdin it
    was not, so `yes | sort` grew kubesim's memory until it died."""
    from kubesim.shell import stdio

    monkeypatch.setattr(stdio, "MAX_INPUT", 64 * 1024)
    with trio.fail_after(10):
        for command in ("sort", "tail -n 1", "wc -l", "grep y"):
            status, _, err = await sh(fs, f"yes | {command}")
            assert (status, err) == (1 if command != "grep y" else 2, f"{command.split()[0]}: -: File too large\n")


async def test_a_line_without_end_is_bounded(fs: FileSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """`read` and sh reading its script from stdin took a line of any length (an endless stream
    without a newline grew memory for ever); now a line ends after `MAX_INPUT` bytes."""
    from kubesim.shell import stdio

    monkeypatch.setattr(stdio, "MAX_INPUT", 1000)
    with trio.fail_after(10):
        assert await sh(fs, "read a; read b; echo $a > /tmp/a; echo $b > /tmp/b", b"x" * 1500 + b"\n") == (0, "", "")
        assert (fs.stat("/tmp/a").size, fs.stat("/tmp/b").size) == (1001, 501)
        assert await sh(fs, "read a; read b; echo $a-$b", b"one\ntwo\n") == (0, "one-two\n", "")
