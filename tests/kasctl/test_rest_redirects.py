"""kasctl's REST calls never carry the job token across a redirect: a REST API that answers 30x
pointing at another port gets an error naming where it pointed, and the other port sees nothing.
Two real loopback HTTP servers that record what they receive; kasctl's commands in process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kasctl.__main__ import main

pytestmark = pytest.mark.timeout(30)

TOKEN = "glcbt-s3cret-job-token"


class Recorder(ThreadingHTTPServer):
    """Records each request's method, path and headers; answers ``status`` with a Location of
    ``redirect_to`` (when set), else 200 ``{}``."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.status = 200
        self.redirect_to = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def _any(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        self.server.seen.append((self.command, self.path, dict(self.headers.items())))
        self.send_response(self.server.status)
        if self.server.redirect_to:
            self.send_header("Location", self.server.redirect_to)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_HEAD = _any

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[tuple[Recorder, Recorder]]:
    api, elsewhere = Recorder(), Recorder()
    threads = [threading.Thread(target=s.serve_forever, args=(0.02,), daemon=True) for s in (api, elsewhere)]
    for thread in threads:
        thread.start()
    try:
        yield api, elsewhere
    finally:
        for server in (api, elsewhere):
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_port_is_an_error_and_the_token_stays_home(
        servers: tuple[Recorder, Recorder], capsys: pytest.CaptureFixture[str], status: int) -> None:
    api, elsewhere = servers
    api.status = status
    api.redirect_to = f"{elsewhere.url}/collect?token=x#frag"
    kubeconfig = main(["kubeconfig", "--job-token", TOKEN, "--api-url", api.url, "--server", "https://kas:8154"])
    _, err_kubeconfig = capsys.readouterr()
    stop = main(["env", "stop", "--job-token", TOKEN, "--api-url", api.url, "--project", "group/app",
                 "--environment", "review/x"])
    _, err_stop = capsys.readouterr()
    assert [method for method, _, _ in api.seen] == ["GET", "POST"]
    assert api.seen[0][2]["Job-Token"] == TOKEN  # it did go where it was sent
    assert elsewhere.seen == []  # and nowhere else
    for code, err in ((kubeconfig, err_kubeconfig), (stop, err_stop)):
        assert code == 1 and err.count("\n") == 1, err
        assert f"answered {status} redirecting to '{elsewhere.url}/collect'" in err
        assert "kasctl follows no redirect" in err and TOKEN not in err and "token=x" not in err


def test_a_relative_redirect_on_the_same_port_is_refused_too(
        servers: tuple[Recorder, Recorder], capsys: pytest.CaptureFixture[str]) -> None:
    api, _ = servers
    api.status, api.redirect_to = 302, "/api/v4/elsewhere"
    assert main(["kubeconfig", "--job-token", TOKEN, "--api-url", api.url, "--server", "https://kas:8154"]) == 1
    assert f"redirecting to '{api.url}/api/v4/elsewhere'" in capsys.readouterr().err
    assert len(api.seen) == 1
