"""A container's filesystem, in memory: directories, regular files (bytes), modes and mtimes.

One `FileSystem` per container run: its exec sessions, its main process and anything serving
from it (port-forward listeners) share it, and a restarted container gets a fresh one, as a real
container gets a fresh writable layer. `container_tree` fills it with what a busybox-like image
shows (`/bin`, `/etc/hostname`, `/etc/passwd`, `/tmp`, `/root`, ...; nginx's default page for an
image named like nginx).

Bounded: `capacity` bytes of file data and `max_inodes` entries (each failing write or create
raises ENOSPC, `No space left on device`, as a full disk does), names up to 255 bytes and paths
up to 4096 (ENAMETOOLONG). Errors are `OSError`s with the errno and the strerror text busybox
prints (`exc.strerror`), so callers print `f"{tool}: {path}: {exc.strerror}"`.

Paths are text (UTF-8 names); `resolve` makes an absolute, normalised path from one relative to a
working directory. There are no symlinks, hard links, owners or devices, except that `/dev/null`
is a character device that reads empty and swallows writes. Not thread-safe: use it from the Trio
thread that serves the container.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
import time
from collections.abc import Iterator

import attrs

from kubesim import httpservers

DEFAULT_CAPACITY = 64 * 1024 * 1024
DEFAULT_MAX_INODES = 65_536
NAME_MAX = 255
PATH_MAX = 4096


def fs_error(code: int, path: str) -> OSError:
    """An OSError as a system call gives it (FileNotFoundError for ENOENT, ...)."""
    return OSError(code, os.strerror(code), path)


@attrs.define(eq=False)
class _Node:
    mode: int  # full st_mode: type bits and permissions
    mtime_ns: int


@attrs.define(eq=False)
class _File(_Node):
    data: bytearray = attrs.Factory(bytearray)


@attrs.define(eq=False)
class _Dir(_Node):
    children: dict[str, _Node] = attrs.Factory(dict)


@attrs.define(eq=False)
class _Device(_Node):
    """/dev/null: reads nothing, writes vanish."""


@attrs.frozen(kw_only=True)
class Stat:
    """What `stat` says of an entry."""

    mode: int  # st_mode, with the type bits (stat.S_ISDIR(...) works)
    size: int
    mtime_ns: int
    nlink: int

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def mtime(self) -> float:
        return self.mtime_ns / 1e9


@attrs.frozen(kw_only=True)
class FileSystemStatistics:
    bytes_used: int
    capacity: int
    inodes_used: int
    max_inodes: int


class FileSystem:
    """A bounded in-memory tree. All paths given are resolved against `cwd` (default "/")."""

    def __init__(self, *, capacity: int = DEFAULT_CAPACITY, max_inodes: int = DEFAULT_MAX_INODES) -> None:
        self.capacity = capacity
        self.max_inodes = max_inodes
        self._used = 0
        self._inodes = 1
        self._root = _Dir(mode=stat.S_IFDIR | 0o755, mtime_ns=time.time_ns())
        #: Directories mounted read-only (a container's /proc and /sys): changes give EROFS.
        self.read_only: tuple[str, ...] = ()

    # -- paths ---------------------------------------------------------------------------------

    @staticmethod
    def resolve(path: str, cwd: str = "/") -> str:
        """The absolute, normalised form of `path` (`..` above / stays at /)."""
        if len(path.encode()) > PATH_MAX:
            raise fs_error(errno.ENAMETOOLONG, path)
        joined = posixpath.join(cwd or "/", path)
        normal = posixpath.normpath(joined)
        if normal.startswith("//"):
            normal = "/" + normal.lstrip("/")
        return normal

    def _parts(self, path: str, cwd: str) -> list[str]:
        absolute = self.resolve(path, cwd)
        parts = [part for part in absolute.split("/") if part]
        for part in parts:
            if len(part.encode()) > NAME_MAX:
                raise fs_error(errno.ENAMETOOLONG, path)
        return parts

    def _lookup(self, path: str, cwd: str) -> _Node:
        return self._walk(self._parts(path, cwd), path)

    def _walk(self, parts: list[str], path: str) -> _Node:
        """The node at `parts` below the root (ENOTDIR/ENOENT on the way name `path`)."""
        node: _Node = self._root
        for part in parts:
            if not isinstance(node, _Dir):
                raise fs_error(errno.ENOTDIR, path)
            child = node.children.get(part)
            if child is None:
                raise fs_error(errno.ENOENT, path)
            node = child
        return node

    def _parent(self, path: str, cwd: str) -> tuple[_Dir, str]:
        """The directory that holds `path`, and its name in it (ENOENT/ENOTDIR on the way), for
        a change: EROFS under a read-only mount."""
        self._check_writable(path, cwd)
        parts = self._parts(path, cwd)
        if not parts:
            raise fs_error(errno.EEXIST, path)  # "/" itself: nothing holds it
        node = self._walk(parts[:-1], path)
        if not isinstance(node, _Dir):
            raise fs_error(errno.ENOTDIR, path)
        return node, parts[-1]

    def _check_writable(self, path: str, cwd: str) -> None:
        absolute = self.resolve(path, cwd)
        if any(absolute == top or absolute.startswith(top + "/") for top in self.read_only):
            raise fs_error(errno.EROFS, path)

    def _new_inode(self, path: str) -> None:
        if self._inodes >= self.max_inodes:
            raise fs_error(errno.ENOSPC, path)
        self._inodes += 1

    # -- queries -------------------------------------------------------------------------------

    def stat(self, path: str, cwd: str = "/") -> Stat:
        node = self._lookup(path, cwd)
        if isinstance(node, _File):
            size = len(node.data)
        elif isinstance(node, _Dir):
            size = 4096
        else:
            size = 0
        nlink = 2 + sum(isinstance(c, _Dir) for c in node.children.values()) if isinstance(node, _Dir) else 1
        return Stat(mode=node.mode, size=size, mtime_ns=node.mtime_ns, nlink=nlink)

    def exists(self, path: str, cwd: str = "/") -> bool:
        try:
            self._lookup(path, cwd)
        except OSError:
            return False
        return True

    def is_dir(self, path: str, cwd: str = "/") -> bool:
        try:
            return isinstance(self._lookup(path, cwd), _Dir)
        except OSError:
            return False

    def is_file(self, path: str, cwd: str = "/") -> bool:
        try:
            return isinstance(self._lookup(path, cwd), _File)
        except OSError:
            return False

    def listdir(self, path: str, cwd: str = "/") -> list[str]:
        """The names in a directory, sorted (ENOTDIR for a file)."""
        node = self._lookup(path, cwd)
        if not isinstance(node, _Dir):
            raise fs_error(errno.ENOTDIR, path)
        return sorted(node.children)

    def walk(self, path: str, cwd: str = "/") -> Iterator[tuple[str, Stat]]:
        """`path` and, if a directory, everything under it (parents first, names sorted)."""
        # With a stack, not recursion: a tree may be deeper than Python's recursion limit.
        pending = [self.resolve(path, cwd)]
        while pending:
            here = pending.pop()
            info = self.stat(here)
            yield here, info
            if info.is_dir:
                pending.extend(posixpath.join(here, name) for name in reversed(self.listdir(here)))

    def read_file(self, path: str, cwd: str = "/") -> bytes:
        """A whole file (EISDIR for a directory)."""
        return b"".join(self.read_chunks(path, cwd))

    def read_chunks(self, path: str, cwd: str = "/", *, chunk_size: int = 32 * 1024) -> Iterator[bytes]:
        """A file's content in pieces of at most `chunk_size` (opened now: errors raise at once)."""
        node = self._lookup(path, cwd)
        if isinstance(node, _Dir):
            raise fs_error(errno.EISDIR, path)
        if isinstance(node, _Device):
            return iter(())
        assert isinstance(node, _File)
        return self._chunks(node, chunk_size)

    @staticmethod
    def _chunks(node: _File, chunk_size: int) -> Iterator[bytes]:
        offset = 0
        # Re-reads the length each time: a file written meanwhile is read to its current end.
        while offset < len(node.data):
            chunk = bytes(node.data[offset : offset + chunk_size])
            offset += len(chunk)
            yield chunk

    def statistics(self) -> FileSystemStatistics:
        return FileSystemStatistics(bytes_used=self._used, capacity=self.capacity,
                                    inodes_used=self._inodes, max_inodes=self.max_inodes)

    # -- changes -------------------------------------------------------------------------------

    def mkdir(self, path: str, cwd: str = "/", *, mode: int = 0o755, parents: bool = False) -> None:
        """Make a directory; with `parents`, also missing ones above, and no error if it exists."""
        if parents:
            if self.is_dir(path, cwd):
                return
            self._check_writable(path, cwd)
            node: _Node = self._root
            done = "/"
            for part in self._parts(path, cwd):
                done = posixpath.join(done, part)
                if not isinstance(node, _Dir):
                    raise fs_error(errno.ENOTDIR, done)
                child = node.children.get(part)
                if child is None:
                    self._new_inode(done)
                    child = _Dir(mode=stat.S_IFDIR | (mode & 0o7777), mtime_ns=time.time_ns())
                    node.children[part] = child
                    node.mtime_ns = child.mtime_ns
                node = child
            if not isinstance(node, _Dir):
                raise fs_error(errno.EEXIST, path)
            return
        parent, name = self._parent(path, cwd)
        if name in parent.children:
            raise fs_error(errno.EEXIST, path)
        self._new_inode(path)
        parent.children[name] = _Dir(mode=stat.S_IFDIR | (mode & 0o7777), mtime_ns=time.time_ns())
        parent.mtime_ns = time.time_ns()

    def open_write(self, path: str, cwd: str = "/", *, append: bool = False,
                   mode: int = 0o644) -> FileWriter:
        """Create or truncate (or, with `append`, extend) a regular file and return its writer."""
        parent, name = self._parent(path, cwd)
        node = parent.children.get(name)
        if isinstance(node, _Dir):
            raise fs_error(errno.EISDIR, path)
        if node is None:
            self._new_inode(path)
            node = _File(mode=stat.S_IFREG | (mode & 0o7777), mtime_ns=time.time_ns())
            parent.children[name] = node
            parent.mtime_ns = node.mtime_ns
        if isinstance(node, _File) and not append:
            self._used -= len(node.data)
            node.data = bytearray()
            node.mtime_ns = time.time_ns()
        return FileWriter(self, node, path)

    def write_file(self, path: str, data: bytes, cwd: str = "/", *, append: bool = False,
                   mode: int = 0o644) -> None:
        self.open_write(path, cwd, append=append, mode=mode).write(data)

    def _grow(self, node: _Node, data: bytes, path: str) -> None:
        if not isinstance(node, _File):
            return  # /dev/null
        if self._used + len(data) > self.capacity:
            # A full disk takes what fits, then refuses, as write(2) returns a short count.
            room = max(0, self.capacity - self._used)
            node.data += data[:room]
            self._used += room
            node.mtime_ns = time.time_ns()
            raise fs_error(errno.ENOSPC, path)
        node.data += data
        self._used += len(data)
        node.mtime_ns = time.time_ns()

    def touch(self, path: str, cwd: str = "/", *, mtime_ns: int | None = None) -> None:
        """Create an empty file if missing; set the mtime (now by default)."""
        self._check_writable(path, cwd)
        try:
            node = self._lookup(path, cwd)
        except FileNotFoundError:
            self.open_write(path, cwd)
            node = self._lookup(path, cwd)
        node.mtime_ns = time.time_ns() if mtime_ns is None else mtime_ns

    def chmod(self, path: str, mode: int, cwd: str = "/") -> None:
        self._check_writable(path, cwd)
        node = self._lookup(path, cwd)
        node.mode = stat.S_IFMT(node.mode) | (mode & 0o7777)

    def remove(self, path: str, cwd: str = "/", *, recursive: bool = False) -> None:
        """Remove a file, or a directory: an empty one, or any with `recursive` (rm -r)."""
        parent, name = self._parent(path, cwd)
        node = parent.children.get(name)
        if node is None:
            raise fs_error(errno.ENOENT, path)
        if isinstance(node, _Dir) and node.children and not recursive:
            raise fs_error(errno.ENOTEMPTY, path)
        del parent.children[name]
        parent.mtime_ns = time.time_ns()
        self._forget(node)

    def _forget(self, node: _Node) -> None:
        pending = [node]  # a stack, not recursion: a tree may be deeper than the recursion limit
        while pending:
            node = pending.pop()
            self._inodes -= 1
            if isinstance(node, _File):
                self._used -= len(node.data)
            elif isinstance(node, _Dir):
                pending.extend(node.children.values())

    def rename(self, source: str, target: str, cwd: str = "/") -> None:
        """Move an entry (over an existing file or empty directory, as rename(2) does)."""
        src_parent, src_name = self._parent(source, cwd)
        node = src_parent.children.get(src_name)
        if node is None:
            raise fs_error(errno.ENOENT, source)
        src_abs, dst_abs = self.resolve(source, cwd), self.resolve(target, cwd)
        if isinstance(node, _Dir) and (dst_abs + "/").startswith(src_abs + "/") and dst_abs != src_abs:
            raise fs_error(errno.EINVAL, target)
        dst_parent, dst_name = self._parent(target, cwd)
        existing = dst_parent.children.get(dst_name)
        if existing is node:
            return
        if existing is not None:
            if isinstance(existing, _Dir) and not isinstance(node, _Dir):
                raise fs_error(errno.EISDIR, target)
            if isinstance(node, _Dir) and not isinstance(existing, _Dir):
                raise fs_error(errno.ENOTDIR, target)
            if isinstance(existing, _Dir) and existing.children:
                raise fs_error(errno.ENOTEMPTY, target)
            self._forget(existing)
        del src_parent.children[src_name]
        dst_parent.children[dst_name] = node
        src_parent.mtime_ns = dst_parent.mtime_ns = time.time_ns()

    def add_device_null(self) -> None:
        self.mkdir("/dev", parents=True)
        parent, name = self._parent("/dev/null", "/")
        if name not in parent.children:
            self._new_inode("/dev/null")
            parent.children[name] = _Device(mode=stat.S_IFCHR | 0o666, mtime_ns=time.time_ns())


class FileWriter:
    """An open regular file being written: each `write` appends, within the capacity."""

    def __init__(self, fs: FileSystem, node: _Node, path: str) -> None:
        self._fs = fs
        self._node = node
        self.path = path

    def write(self, data: bytes) -> None:
        """Append `data`; OSError(ENOSPC) once the filesystem is full (what fitted is kept)."""
        if data:
            self._fs._grow(self._node, data, self.path)


# -- what an image brings -----------------------------------------------------------------------

_PASSWD = """root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
"""

_GROUP = """root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
wheel:x:10:root
mail:x:12:
www-data:x:33:
users:x:100:
nogroup:x:65534:
"""

def container_tree(fs: FileSystem, *, image: str = "", hostname: str = "localhost",
                   namespace: str = "default", pod_ip: str = "", commands: tuple[str, ...] = ()) -> FileSystem:
    """Fill `fs` with a busybox-like root: what `ls /` shows in a small image, and the files the
    kubelet mounts (`/etc/hostname`, `/etc/hosts`, `/etc/resolv.conf`). Returns `fs`."""
    for directory in ("/bin", "/dev", "/etc", "/home", "/proc", "/root", "/sys", "/tmp", "/usr/bin",
                      "/usr/sbin", "/usr/share", "/var/log", "/var/run", "/var/spool/mail", "/var/www"):
        fs.mkdir(directory, parents=True)
    fs.chmod("/tmp", 0o1777)
    fs.chmod("/root", 0o700)
    fs.add_device_null()
    fs.read_only = ("/proc", "/sys")
    for name in commands:
        if name.isidentifier() or name.replace("-", "_").isidentifier():
            fs.write_file(f"/bin/{name}", b"", mode=0o755)
    fs.write_file("/etc/hostname", f"{hostname}\n".encode())
    fs.write_file("/etc/passwd", _PASSWD.encode())
    fs.write_file("/etc/group", _GROUP.encode())
    hosts = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    if pod_ip:
        hosts += f"{pod_ip}\t{hostname}\n"
    fs.write_file("/etc/hosts", hosts.encode())
    fs.write_file("/etc/resolv.conf", (
        f"search {namespace}.svc.cluster.local svc.cluster.local cluster.local\n"
        "nameserver 10.96.0.10\noptions ndots:5\n").encode())
    if httpservers.is_nginx_image(image):
        fs.mkdir(httpservers.NGINX_ROOT, parents=True)
        fs.write_file(f"{httpservers.NGINX_ROOT}/index.html", httpservers.NGINX_INDEX)
        fs.write_file(f"{httpservers.NGINX_ROOT}/50x.html", httpservers.NGINX_50X)
        fs.mkdir("/etc/nginx/conf.d", parents=True)
    return fs
