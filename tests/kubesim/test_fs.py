"""The in-memory container filesystem (kubesim.fs): tree operations, errors as errno, bounds."""

from __future__ import annotations

import errno

import pytest

from kubesim.fs import FileSystem, container_tree


def test_files_and_directories() -> None:
    fs = FileSystem()
    fs.mkdir("/a/b/c", parents=True)
    fs.write_file("c/f.txt", b"hello", cwd="/a/b")
    fs.write_file("/a/b/c/f.txt", b" world", append=True)
    assert fs.read_file("/a/b/../b/c/f.txt") == b"hello world"
    assert fs.listdir("/a/b/c") == ["f.txt"]
    assert fs.stat("/a/b/c/f.txt").size == 11 and fs.stat("/a/b/c/f.txt").is_file
    assert fs.is_dir("/a") and not fs.is_file("/a")
    assert [path for path, _ in fs.walk("/a")] == ["/a", "/a/b", "/a/b/c", "/a/b/c/f.txt"]
    fs.rename("/a/b/c/f.txt", "/a/g")
    assert fs.read_file("/a/g") == b"hello world" and not fs.exists("/a/b/c/f.txt")
    with pytest.raises(OSError) as info:
        fs.remove("/a")
    assert info.value.errno == errno.ENOTEMPTY
    fs.remove("/a", recursive=True)
    assert not fs.exists("/a")
    assert fs.statistics().bytes_used == 0


@pytest.mark.parametrize(("call", "code", "text"), [
    (lambda fs: fs.read_file("/nope"), errno.ENOENT, "No such file or directory"),
    (lambda fs: fs.read_file("/etc"), errno.EISDIR, "Is a directory"),
    (lambda fs: fs.listdir("/etc/passwd"), errno.ENOTDIR, "Not a directory"),
    (lambda fs: fs.mkdir("/etc"), errno.EEXIST, "File exists"),
    (lambda fs: fs.write_file("/nope/x", b""), errno.ENOENT, "No such file or directory"),
    (lambda fs: fs.write_file("/x" * 3000, b""), errno.ENAMETOOLONG, "File name too long"),
    (lambda fs: fs.write_file("/" + "n" * 256, b""), errno.ENAMETOOLONG, "File name too long"),
])
def test_errors_are_errnos_with_busybox_text(call, code: int, text: str) -> None:  # type: ignore[no-untyped-def]
    fs = container_tree(FileSystem())
    with pytest.raises(OSError) as info:
        call(fs)
    assert info.value.errno == code and info.value.strerror == text


def test_capacity_is_enforced_and_freed() -> None:
    fs = FileSystem(capacity=1000)
    writer = fs.open_write("/big")
    writer.write(b"x" * 600)
    with pytest.raises(OSError) as info:
        writer.write(b"y" * 600)
    assert info.value.errno == errno.ENOSPC and info.value.strerror == "No space left on device"
    assert fs.stat("/big").size == 1000  # what fitted was written
    fs.write_file("/big", b"")  # truncation frees the space
    fs.write_file("/other", b"z" * 1000)
    assert fs.statistics().bytes_used == 1000


def test_inode_limit() -> None:
    fs = FileSystem(max_inodes=3)
    fs.mkdir("/a")
    fs.write_file("/b", b"")
    with pytest.raises(OSError) as info:
        fs.mkdir("/c")
    assert info.value.errno == errno.ENOSPC
    fs.remove("/b")
    fs.mkdir("/c")


def test_image_tree() -> None:
    fs = container_tree(FileSystem(), image="docker.io/library/nginx:1.27", hostname="web-1",
                        namespace="shop", pod_ip="10.244.0.7", commands=("sh", "ls"))
    assert fs.read_file("/etc/hostname") == b"web-1\n"
    assert b"10.244.0.7\tweb-1" in fs.read_file("/etc/hosts")
    assert b"search shop.svc.cluster.local" in fs.read_file("/etc/resolv.conf")
    assert fs.read_file("/etc/passwd").startswith(b"root:x:0:0:root:/root:/bin/sh\n")
    assert b"Welcome to nginx!" in fs.read_file("/usr/share/nginx/html/index.html")
    assert fs.stat("/bin/sh").mode & 0o111 and oct(fs.stat("/tmp").mode & 0o7777) == "0o1777"
    assert fs.read_file("/dev/null") == b""
    fs.write_file("/dev/null", b"gone")
    assert fs.statistics().bytes_used == len(fs.read_file("/usr/share/nginx/html/index.html")) + sum(
        fs.stat(path).size for path, info in fs.walk("/") if info.is_file
        and path != "/usr/share/nginx/html/index.html")
    assert not container_tree(FileSystem(), image="busybox").exists("/usr/share/nginx")
