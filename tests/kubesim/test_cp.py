"""`kubectl cp` both ways and Ctrl-C in `kubectl exec -it … sh`, with real kubectl (every version
found) against kubesim: cp runs `test -d`, `tar -xmf - -C DIR` and `tar cf - PATH` in the pod over
the WebSocket exec; exec -it is driven through a pty, as a user's terminal drives it."""

from __future__ import annotations

import filecmp
import os
import pty
from pathlib import Path

import pytest
import trio

from tests.kubesim.kubectl_harness import NamespacedKubectl, ServerThread

pytestmark = [pytest.mark.timeout(60), pytest.mark.routes]

_COUNTER = iter(range(10_000))


K = NamespacedKubectl


@pytest.fixture
async def k(kube_server: ServerThread, kubectl_bin: str) -> K:
    namespace = f"cp-{next(_COUNTER)}"
    await trio.to_thread.run_sync(kube_server.make_namespace, namespace)
    client = K(kubectl_bin, kube_server, namespace)
    await client("run", "box", "--image=busybox")
    await client("wait", "--for=condition=Ready", "pod/box", "--timeout=10s")
    return client


def _tree(root: Path) -> None:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "emptydir").mkdir()
    (root / "a.txt").write_text("hello\n")
    (root / "empty").write_bytes(b"")
    (root / "sub" / "big.bin").write_bytes(os.urandom(2 * 1024 * 1024))
    (root / "sub" / "deeper" / "n.txt").write_text("nested\n" * 100)


def _same_tree(left: Path, right: Path) -> None:
    def files(root: Path) -> list[str]:
        return sorted(str(p.relative_to(root)) + ("/" if p.is_dir() else "") for p in root.rglob("*"))

    assert files(left) == files(right)
    for path in left.rglob("*"):
        if path.is_file():
            assert filecmp.cmp(path, right / path.relative_to(left), shallow=False), path


async def test_cp_a_directory_in_and_out(k: K, tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    _tree(source)
    await k("cp", str(source), "box:/tmp/dest")
    listing = (await k("exec", "box", "--", "ls", "-l", "/tmp/dest")).stdout
    names = [line.split()[-1] for line in listing.splitlines()[1:]]
    assert names == ["a.txt", "empty", "emptydir", "sub"]
    assert listing.splitlines()[2].startswith("-rw-r--r--    1 root     root             0 ")
    assert (await k("exec", "box", "--", "cat", "/tmp/dest/sub/deeper/n.txt")).stdout == "nested\n" * 100

    back = tmp_path / "back"
    await k("cp", "box:/tmp/dest", str(back))
    _same_tree(source, back)
    # Into an existing directory, cp puts the source under its own name.
    await k("cp", str(source), "box:/root")
    again = tmp_path / "again"
    await k("cp", "box:/root/src", str(again))
    _same_tree(source, again)


async def test_cp_a_single_file_both_ways(k: K, tmp_path: Path) -> None:
    data = os.urandom(100_000)
    (tmp_path / "one.bin").write_bytes(data)
    await k("cp", str(tmp_path / "one.bin"), "box:/tmp/copy.bin")
    await k("cp", str(tmp_path / "one.bin"), "box:/tmp")  # a directory: /tmp/one.bin
    await k("exec", "box", "--", "sh", "-c", "test -f /tmp/copy.bin && test -f /tmp/one.bin")
    await k("cp", "box:/tmp/copy.bin", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == data
    await k("cp", "box:/etc/hostname", str(tmp_path / "hostname"))
    assert (tmp_path / "hostname").read_text() == "box\n"


async def test_cp_errors(k: K, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    into_missing = await k("cp", str(tmp_path / "f"), "box:/nope/dir/f", check=False)
    assert into_missing.returncode != 0
    assert "tar: can't change directory to '/nope/dir': No such file or directory" in into_missing.stderr
    assert "command terminated with exit code 1" in into_missing.stderr
    # busybox tar reports the missing path, still ends the archive, then exits 1; kubectl (its
    # cp.go) prints tar's stderr on its stdout, and finishes on the archive's end, usually before
    # the exit status arrives: against a real cluster it then exits 0 as well.
    from_missing = await k("cp", "box:/tmp/nope", str(tmp_path / "out"), check=False)
    assert "tar: /tmp/nope: No such file or directory\n" in from_missing.stdout
    assert not (tmp_path / "out").exists()


# -- Ctrl-C through a pty -----------------------------------------------------------------------


class _Pty:
    """kubectl on a pty: what the test types goes to its stdin; its terminal output is read here."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.output = b""

    async def read_until(self, text: bytes) -> None:
        with trio.fail_after(10):
            while text not in self.output:
                await trio.lowlevel.wait_readable(self.master)
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the other side closed
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"{text!r} never came; got {self.output!r}")
                self.output += chunk

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)


async def test_ctrl_c_interrupts_the_foreground_command_in_exec_it_sh(k: K) -> None:
    master, slave = pty.openpty()
    try:
        os.set_blocking(master, False)
        process = await trio.lowlevel.open_process(
            [k.binary, "-n", k.namespace, "exec", "-it", "box", "--", "sh"],
            stdin=slave, stdout=slave, stderr=slave, env=k.server.env(), start_new_session=True)
        os.close(slave)
        slave = -1
        term = _Pty(master)
        try:
            await term.read_until(b"/ # ")
            for command in (b"sleep 100", b"cat", b"sleep 100 | cat"):
                term.output = b""
                term.type(command + b"\r")
                await term.read_until(command + b"\r\n")
                term.type(b"\x03")
                await term.read_until(b"^C\r\n/ # ")
                term.type(b"echo status=$?\r")
                await term.read_until(b"status=130\r\n/ # ")
            term.type(b"\x04")  # ^D at an empty prompt: the shell, and kubectl, end
            with trio.fail_after(10):
                assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


async def test_main_process_and_exec_share_the_filesystem(k: K) -> None:
    await k("run", "writer", "--image=busybox", "--", "sh", "-c", "echo from-main > /tmp/m; sleep 3600")
    await k("wait", "--for=condition=Ready", "pod/writer", "--timeout=10s")
    with trio.fail_after(10):
        while True:  # polling kubectl, bounded: the main process may not have written yet
            result = await k("exec", "writer", "--", "cat", "/tmp/m", check=False)
            if result.returncode == 0:
                break
            await trio.sleep(0.05)
    assert result.stdout == "from-main\n"
    # Each pod (and container) has its own.
    assert (await k("exec", "box", "--", "ls", "/tmp")).stdout == ""


async def test_a_hostile_archive_through_exec_is_refused(k: K) -> None:
    """`kubectl exec -i … tar x` fed a member whose size is negative (GNU base-256): tar dies
    with busybox's message, and kubesim goes on serving (it used to loop, eating memory)."""
    import tarfile

    header = bytearray(tarfile.TarInfo("f").tobuf(tarfile.GNU_FORMAT))
    header[124:136] = b"\xff" * 12
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    archive = bytes(header) + b"x" * 512 + b"\0" * 1024
    result = await k("exec", "-i", "box", "--", "tar", "xf", "-", "-C", "/tmp", stdin=archive, check=False)
    assert result.returncode == 1
    assert "tar: corrupted octal value in tar header" in result.stderr
    assert (await k("exec", "box", "--", "echo", "alive")).stdout == "alive\n"
