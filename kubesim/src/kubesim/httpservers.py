"""The web servers a simulated container runs: nginx's default server and busybox `httpd`.

Both speak HTTP/1.1 over a `trio.abc.HalfCloseableStream` (a `netsim` connection) with h11, and
serve files from a `Files` source: the container's filesystem when kubesim has one, else a small
fixed tree (`StaticFiles`) — nginx's two default pages, so the image's welcome page is always there.

- `serve_nginx`: what `nginx:latest` answers with its default configuration (root
  `/usr/share/nginx/html`, `index.html`, keep-alive, `client_max_body_size 1m`). Response heads
  carry nginx's headers in nginx's order (`Server: nginx/1.27.3`, `Date`, `Content-Type`,
  `Content-Length`, `Last-Modified`, `Connection: keep-alive`, `ETag: "<mtime hex>-<size hex>"`,
  `Accept-Ranges: bytes`); errors are nginx's built-in pages (ngx_http_special_response.c). A
  request body of any size is read and dropped (a body over 1 MiB gets 413 and the connection is
  closed, as nginx does), so the next request on the connection is parsed where it starts.
- `serve_httpd`: busybox httpd (networking/httpd.c): one request per connection
  (`Connection: close`), GET and HEAD, `index.html` for a directory, `302` to `dir/` for a
  directory without its slash, busybox's HTML error pages.
"""

from __future__ import annotations

import email.utils
import posixpath
import stat as stat_module
from collections.abc import Iterator, Mapping
from typing import Protocol
from urllib.parse import unquote

import attrs
import h11
import trio

NGINX_VERSION = "1.27.3"
NGINX_ROOT = "/usr/share/nginx/html"
#: nginx's client_max_body_size default.
NGINX_MAX_BODY = 1024 * 1024
#: A request head (line and headers) may not be larger (nginx: large_client_header_buffers 4 8k).
MAX_HEAD = 32 * 1024
#: nginx's keepalive_timeout default: an idle keep-alive connection is closed after it.
KEEPALIVE_SECONDS = 65.0
#: How long a connection is drained after a response that closes it (nginx's lingering_time).
LINGER_SECONDS = 5.0
READ_CHUNK = 64 * 1024

#: nginx's /usr/share/nginx/html/index.html in the official image (615 bytes).
NGINX_INDEX = b"""<!DOCTYPE html>
<html>
<head>
<title>Welcome to nginx!</title>
<style>
html { color-scheme: light dark; }
body { width: 35em; margin: 0 auto;
font-family: Tahoma, Verdana, Arial, sans-serif; }
</style>
</head>
<body>
<h1>Welcome to nginx!</h1>
<p>If you see this page, the nginx web server is successfully installed and
working. Further configuration is required.</p>

<p>For online documentation and support please refer to
<a href="http://nginx.org/">nginx.org</a>.<br/>
Commercial support is available at
<a href="http://nginx.com/">nginx.com</a>.</p>

<p><em>Thank you for using nginx.</em></p>
</body>
</html>
"""
NGINX_50X = (b"<!DOCTYPE html>\n<html>\n<head>\n<title>Error</title>\n</head>\n<body>\n"
             b"<h1>An error occurred.</h1>\n</body>\n</html>\n")

#: File types by extension, as nginx's mime.types and busybox's table give the common ones.
MIME_TYPES = {
    "html": "text/html", "htm": "text/html", "css": "text/css", "txt": "text/plain",
    "js": "application/javascript", "json": "application/json", "xml": "text/xml",
    "png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif",
    "svg": "image/svg+xml", "ico": "image/x-icon", "pdf": "application/pdf",
}


# -- where files come from -----------------------------------------------------------------------


class FileStat(Protocol):
    @property
    def is_dir(self) -> bool: ...
    @property
    def is_file(self) -> bool: ...
    @property
    def size(self) -> int: ...
    @property
    def mtime(self) -> float: ...


class Files(Protocol):
    """What a server reads files through: the part of `kubesim.fs.FileSystem` it needs.

    Both raise `OSError` (FileNotFoundError, NotADirectoryError, …) for a path that is not there.
    """

    def stat(self, path: str, cwd: str = "/") -> FileStat: ...

    def read_chunks(self, path: str, cwd: str = "/", *, chunk_size: int = 32 * 1024) -> Iterator[bytes]: ...


@attrs.frozen
class _StaticStat:
    mode: int
    size: int
    mtime: float

    @property
    def is_dir(self) -> bool:
        return stat_module.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat_module.S_ISREG(self.mode)


@attrs.frozen
class StaticFiles:
    """A fixed tree of files (absolute path → bytes); directories are their paths' parents."""

    files: Mapping[str, bytes]
    mtime: float = 1732636500.0  # when the nginx image's pages were built (Tue, 26 Nov 2024)

    def stat(self, path: str, cwd: str = "/") -> FileStat:
        path = posixpath.normpath(posixpath.join(cwd, path))
        if path in self.files:
            return _StaticStat(stat_module.S_IFREG | 0o644, len(self.files[path]), self.mtime)
        prefix = path.rstrip("/") + "/"
        if path == "/" or any(name.startswith(prefix) for name in self.files):
            return _StaticStat(stat_module.S_IFDIR | 0o755, 4096, self.mtime)
        raise FileNotFoundError(2, "No such file or directory")

    def read_chunks(self, path: str, cwd: str = "/", *, chunk_size: int = 32 * 1024) -> Iterator[bytes]:
        if not self.stat(path, cwd).is_file:
            raise IsADirectoryError(21, "Is a directory")
        data = self.files[posixpath.normpath(posixpath.join(cwd, path))]
        return iter([data[i:i + chunk_size] for i in range(0, len(data), chunk_size)])


NGINX_IMAGE_FILES = StaticFiles({f"{NGINX_ROOT}/index.html": NGINX_INDEX, f"{NGINX_ROOT}/50x.html": NGINX_50X})


# -- HTTP plumbing -------------------------------------------------------------------------------


class _Closed(Exception):
    """The client went away (EOF or a reset) before a whole request arrived."""


async def _next_event(stream: trio.abc.HalfCloseableStream, conn: h11.Connection) -> h11.Event:
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive_some(READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise _Closed from exc
            conn.receive_data(bytes(data))
            continue
        assert not isinstance(event, type)  # PAUSED only comes after a request; we never ask then
        return event


async def _send(stream: trio.abc.HalfCloseableStream, conn: h11.Connection, *events: h11.Event) -> None:
    for event in events:
        data = conn.send(event)
        if data:
            await stream.send_all(data)


def _http_date(timestamp: float | None = None) -> str:
    return email.utils.formatdate(timestamp, usegmt=True)


def _mime_type(path: str) -> str | None:
    _, _, extension = posixpath.basename(path).rpartition(".")
    return MIME_TYPES.get(extension.lower()) if "." in posixpath.basename(path) else None


def _target_path(target: bytes) -> str | None:
    """The decoded path of a request target, or None when it is not an absolute path."""
    path = target.split(b"?", 1)[0].split(b"#", 1)[0].decode("latin-1")
    if not path.startswith("/"):
        return None
    return unquote(path)


async def _linger(stream: trio.abc.HalfCloseableStream) -> None:
    """Read and drop what the client still sends for a while, so our response reaches it."""
    with trio.move_on_after(LINGER_SECONDS):
        try:
            await stream.send_eof()
            while await stream.receive_some(READ_CHUNK):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


# -- nginx ---------------------------------------------------------------------------------------


def _nginx_error_page(status: int, reason: str) -> bytes:
    return (f"<html>\r\n<head><title>{status} {reason}</title></head>\r\n<body>\r\n"
            f"<center><h1>{status} {reason}</h1></center>\r\n"
            f"<hr><center>nginx/{NGINX_VERSION}</center>\r\n</body>\r\n</html>\r\n").encode()


_NGINX_REASONS = {200: "OK", 301: "Moved Permanently", 400: "Bad Request", 403: "Forbidden",
                  404: "Not Found", 405: "Not Allowed", 413: "Request Entity Too Large",
                  500: "Internal Server Error"}


async def serve_nginx(stream: trio.abc.HalfCloseableStream, files: Files = NGINX_IMAGE_FILES,
                      *, root: str = NGINX_ROOT) -> None:
    """nginx's default server on one connection, until the client closes it or a response must."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    while True:
        try:
            with trio.move_on_after(KEEPALIVE_SECONDS) as idle:
                request = await _next_event(stream, conn)
            if idle.cancelled_caught:
                return  # keepalive_timeout: nginx closes the idle connection
        except _Closed:
            return
        except h11.RemoteProtocolError:
            await _nginx_respond_error(stream, conn, 400, close=True)
            return
        if not isinstance(request, h11.Request):
            return  # ConnectionClosed: the client is done
        # The body: nginx refuses a declared length over client_max_body_size before reading it.
        length = _content_length(request)
        if length is not None and length > NGINX_MAX_BODY:
            await _nginx_respond_error(stream, conn, 413, close=True)
            return
        try:
            received = 0
            while True:
                event = await _next_event(stream, conn)
                if isinstance(event, h11.Data):
                    received += len(event.data)
                    if received > NGINX_MAX_BODY:
                        await _nginx_respond_error(stream, conn, 413, close=True)
                        return
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    return  # ConnectionClosed mid-body
        except _Closed:
            return
        except h11.RemoteProtocolError:
            await _nginx_respond_error(stream, conn, 400, close=True)
            return
        await _nginx_answer(stream, conn, request, files, root)
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            await _linger(stream)
            return
        try:
            conn.start_next_cycle()
        except h11.LocalProtocolError:
            return


def _content_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)
    return None


def _host(request: h11.Request) -> str:
    for name, value in request.headers:
        if name == b"host":
            return value.decode("latin-1")
    return "localhost"


async def _nginx_answer(stream: trio.abc.HalfCloseableStream, conn: h11.Connection,
                        request: h11.Request, files: Files, root: str) -> None:
    path = _target_path(request.target)
    if path is None:
        await _nginx_respond_error(stream, conn, 400, close=True)
        return
    if request.method not in (b"GET", b"HEAD"):
        await _nginx_respond_error(stream, conn, 405)
        return
    local = posixpath.normpath(root + path)
    if not (local == root or local.startswith(root + "/")):
        await _nginx_respond_error(stream, conn, 400, close=True)  # ../ above the root
        return
    try:
        info = files.stat(local)
        if info.is_dir:
            if not path.endswith("/"):
                await _nginx_redirect(stream, conn, request, path + "/")
                return
            local = posixpath.join(local, "index.html")
            info = files.stat(local)
        if not info.is_file:
            raise FileNotFoundError(2, "No such file or directory")
        chunks = files.read_chunks(local)
    except PermissionError:
        await _nginx_respond_error(stream, conn, 403)
        return
    except OSError:
        # An index.html missing under an existing directory is 403 in nginx (no autoindex).
        await _nginx_respond_error(stream, conn, 403 if local.endswith("/index.html") and path.endswith("/")
                                   else 404)
        return
    headers = [("Server", f"nginx/{NGINX_VERSION}"), ("Date", _http_date()),
               ("Content-Type", _mime_type(local) or "application/octet-stream"),
               ("Content-Length", str(info.size)), ("Last-Modified", _http_date(info.mtime)),
               ("Connection", "keep-alive"), ("ETag", f'"{int(info.mtime):x}-{info.size:x}"'),
               ("Accept-Ranges", "bytes")]
    await _send(stream, conn, h11.Response(status_code=200, headers=headers, reason=b"OK"))
    if request.method != b"HEAD":
        for chunk in chunks:
            await _send(stream, conn, h11.Data(data=chunk))
    await _send(stream, conn, h11.EndOfMessage())


async def _nginx_redirect(stream: trio.abc.HalfCloseableStream, conn: h11.Connection,
                          request: h11.Request, location: str) -> None:
    body = _nginx_error_page(301, _NGINX_REASONS[301])
    headers = [("Server", f"nginx/{NGINX_VERSION}"), ("Date", _http_date()), ("Content-Type", "text/html"),
               ("Content-Length", str(len(body))), ("Location", f"http://{_host(request)}{location}"),
               ("Connection", "keep-alive")]
    await _send(stream, conn, h11.Response(status_code=301, headers=headers, reason=b"Moved Permanently"))
    if request.method != b"HEAD":
        await _send(stream, conn, h11.Data(data=body))
    await _send(stream, conn, h11.EndOfMessage())


async def _nginx_respond_error(stream: trio.abc.HalfCloseableStream, conn: h11.Connection, status: int,
                               *, close: bool = False) -> None:
    reason = _NGINX_REASONS[status]
    body = _nginx_error_page(status, reason)
    headers = [("Server", f"nginx/{NGINX_VERSION}"), ("Date", _http_date()), ("Content-Type", "text/html"),
               ("Content-Length", str(len(body))), ("Connection", "close" if close else "keep-alive")]
    try:
        if conn.our_state is not h11.SEND_RESPONSE:
            # The head could not be parsed: h11 has no request to answer, so write the bytes ourselves.
            head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
            await stream.send_all(head.encode() + body)
        else:
            await _send(stream, conn, h11.Response(status_code=status, headers=headers, reason=reason.encode()),
                        h11.Data(data=body), h11.EndOfMessage())
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return
    if close:
        await _linger(stream)


# -- busybox httpd -------------------------------------------------------------------------------


_HTTPD_RESPONSES = {
    302: ("Found", ""), 400: ("Bad Request", "Unsupported method"), 403: ("Forbidden", ""),
    404: ("Not Found", "The requested URL was not found"),
    501: ("Not Implemented", "The requested method is not recognized"),
}


async def serve_httpd(stream: trio.abc.HalfCloseableStream, files: Files, home: str) -> None:
    """One busybox httpd connection: one request, its answer, then the connection closes."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    try:
        with trio.move_on_after(60) as idle:  # busybox: HEADER_READ_TIMEOUT
            request = await _next_event(stream, conn)
        if idle.cancelled_caught or not isinstance(request, h11.Request):
            return
    except _Closed:
        return
    except h11.RemoteProtocolError:
        await _httpd_send(stream, 400)
        await _linger(stream)
        return
    path = _target_path(request.target)
    if request.method not in (b"GET", b"HEAD") or path is None:
        await _httpd_send(stream, 501 if path is not None else 400)
    else:
        await _httpd_file(stream, request, files, home, path)
    await _linger(stream)


async def _httpd_send(stream: trio.abc.HalfCloseableStream, status: int, *, headers: str = "") -> None:
    reason, info = _HTTPD_RESPONSES[status]
    head = (f"HTTP/1.1 {status} {reason}\r\nDate: {_http_date()}\r\nConnection: close\r\n"
            f"Content-type: text/html\r\n{headers}\r\n")
    body = (f"<HTML><HEAD><TITLE>{status} {reason}</TITLE></HEAD>\n<BODY><H1>{status} {reason}</H1>\n"
            f"{info}\n</BODY></HTML>\n")
    try:
        await stream.send_all((head + body).encode())
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _httpd_file(stream: trio.abc.HalfCloseableStream, request: h11.Request, files: Files,
                      home: str, path: str) -> None:
    local = posixpath.normpath(posixpath.join(home, path.lstrip("/")))
    if not (local == home.rstrip("/") or local.startswith(home.rstrip("/") + "/") or home == "/"):
        await _httpd_send(stream, 400)
        return
    try:
        info = files.stat(local)
        if info.is_dir:
            if not path.endswith("/"):
                await _httpd_send(stream, 302, headers=f"Location: {path}/\r\n")
                return
            local = posixpath.join(local, "index.html")
            info = files.stat(local)
        if not info.is_file:
            raise FileNotFoundError(2, "No such file or directory")
        chunks = files.read_chunks(local)
    except OSError:
        await _httpd_send(stream, 404)
        return
    mime = _mime_type(local)
    head = (f"HTTP/1.1 200 OK\r\nDate: {_http_date()}\r\nConnection: close\r\n"
            + (f"Content-type: {mime}\r\n" if mime else "")
            + f"Accept-Ranges: bytes\r\nLast-Modified: {_http_date(info.mtime)}\r\n"
            f"ETag: \"{int(info.mtime):x}-{info.size:x}\"\r\nContent-Length: {info.size}\r\n\r\n")
    try:
        await stream.send_all(head.encode())
        if request.method != b"HEAD":
            for chunk in chunks:
                await stream.send_all(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def is_nginx_image(image: str) -> bool:
    """An image named like nginx: `nginx`, `nginx:1.27`, `docker.io/library/nginx@sha256:…`,
    `nginxinc/nginx-unprivileged`, `bitnami/nginx`."""
    repository = image.rsplit("@", 1)[0]
    last = repository.rsplit("/", 1)[-1]
    name = last.split(":", 1)[0]
    return name == "nginx" or name.startswith("nginx-")
