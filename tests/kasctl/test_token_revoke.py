"""``kasctl token revoke`` as a CI job and an operator run it, against the demo stack: the job ends,
and its tokens are refused from then on, on the REST API and through kubectl."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kasctl.__main__ import main
from kasctl.kubeconfig import KubeconfigError
from kasctl.restclient import rest_call
from kasctl.stack import AGENT_ID, CONFIG_PROJECT, Stack, find_kubectl
from tests.forkrun import run_module

pytestmark = pytest.mark.timeout(120)


def _kasctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("kasctl", *args, timeout=60, env={"PATH": os.environ.get("PATH", ""), **(env or {})})


def _env(stack: Stack, token: str) -> dict[str, str]:
    return {"CI_JOB_TOKEN": token, "KASCTL_API_URL": stack.api_url, "KASCTL_PROXY_URL": stack.proxy_url,
            "KASCTL_CA_FILE": str(stack.ca_file)}


def test_a_job_ends_itself_and_its_token_is_refused_everywhere(stack: Stack, tmp_path: Path) -> None:
    token = stack.auth.job_token(CONFIG_PROJECT, job_id=501, user="demo")
    made = _kasctl("kubeconfig", env=_env(stack, token))
    assert made.returncode == 0, made.stderr
    kubeconfig = tmp_path / "job.kubeconfig"
    kubeconfig.write_text(made.stdout)

    ended = _kasctl("token", "revoke", env=_env(stack, token))
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout.startswith(f"job 501 of {CONFIG_PROJECT} is finished: kasd refuses its tokens (until ")

    again = _kasctl("kubeconfig", env=_env(stack, token))
    assert again.returncode == 1
    assert "kasd refused (401): 401 Unauthorized: bad token: CI job token revoked: job 501 is finished" in again.stderr
    kubectl = find_kubectl()
    assert kubectl is not None
    got = subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "get", "pods"], capture_output=True, text=True,
                         timeout=60)
    assert got.returncode != 0 and "You must be logged in to the server" in got.stderr, got.stderr
    # (kubectl shows no Status message for a 401; the proxy port's Status names the reason)
    request = urllib.request.Request(f"{stack.proxy_url}/api/v1/pods",
                                     headers={"Authorization": f"Bearer ci:{AGENT_ID}:{token}"})
    context = ssl.create_default_context(cafile=str(stack.ca_file))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30, context=context)
    status = json.loads(refused.value.read())
    assert (refused.value.code, status["kind"], status["reason"]) == (401, "Status", "Unauthorized")
    assert "CI job token revoked: job 501 is finished" in status["message"]
    # ending it twice: the token is already dead, and kasd says so
    twice = _kasctl("token", "revoke", env=_env(stack, token))
    assert twice.returncode == 1 and "job 501 is finished" in twice.stderr and token not in twice.stderr


def test_the_operator_ends_a_job_by_its_id_with_the_signing_key(stack: Stack) -> None:
    leaked = stack.auth.job_token(CONFIG_PROJECT, job_id=502, user="demo")
    assert _kasctl("kubeconfig", env=_env(stack, leaked)).returncode == 0
    ended = _kasctl("token", "revoke", "--project", CONFIG_PROJECT, "--job-id", "502", "--key",
                    str(stack.auth.keys.private), "--api-url", stack.api_url, "--certificate-authority",
                    str(stack.ca_file))
    assert ended.returncode == 0, ended.stderr
    refused = _kasctl("kubeconfig", env=_env(stack, leaked))
    assert refused.returncode == 1 and "job 502 is finished" in refused.stderr


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--job-token", "x.y.z", "--job-id", "5", "--project", "group/app"], {},
         "give either --job-token (the job itself) or --project and --job-id (the operator), not both"),
        (["--job-id", "5"], {}, "--project and --job-id go together: the job to end, by its id"),
        ([], {"CI_JOB_TOKEN": "not-a-jwt"}, "the job token is not a kasd CI job token (it names no job_id)"),
        ([], {}, "missing --job-token: pass it or set CI_JOB_TOKEN"),
        (["--project", "group/app", "--job-id", "5"], {}, "no signing key: give --key FILE or set KASCTL_SIGNING_KEY_FILE"),
    ],
)
def test_a_wrong_command_line_is_one_line_exit_2(args: list[str], env: dict[str, str], message: str,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("CI_JOB_TOKEN", "KASCTL_SIGNING_KEY_FILE", "KASCTL_CA_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["token", "revoke", "--api-url", "https://127.0.0.1:1", *args]) == 2
    assert capsys.readouterr() == ("", f"kasctl token revoke: {message}\n")


@pytest.mark.parametrize(("job_id", "why"), [
    ("007", "the id '007' has a leading zero"),
    ("9223372036854775808", "the id 9223372036854775808 is out of range 1-9223372036854775807"),
    ("\u00b2", "the id '\u00b2' is not a number (ASCII digits 0-9 only)"),
])
def test_the_job_id_is_read_as_kasd_reads_one(job_id: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    """wire.ids: ``007`` (read as 7) and 2^63 (a token kasd then refused) were taken."""
    with pytest.raises(SystemExit) as exited:
        main(["token", "revoke", "--api-url", "https://127.0.0.1:1", "--project", "group/app", "--job-id", job_id])
    assert exited.value.code == 2
    assert f"argument --job-id: must be a positive whole number of at most 19 digits ({why})" in capsys.readouterr().err


@pytest.fixture
def redirecting() -> Iterator[tuple[str, list[str]]]:
    """A server that redirects every request to a second one, which records the Job-Tokens it gets."""
    received: list[str] = []

    class Target(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            received.append(self.headers.get("Job-Token", ""))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    target = ThreadingHTTPServer(("127.0.0.1", 0), Target)

    class Redirect(Target):
        def do_PUT(self) -> None:
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{target.server_port}/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

    front = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (target, front)]
    for thread in threads:
        thread.start()
    try:
        yield f"http://127.0.0.1:{front.server_port}", received
    finally:
        for server in (front, target):
            server.shutdown()
            server.server_close()


def test_the_job_token_is_never_sent_across_a_redirect(redirecting: tuple[str, list[str]]) -> None:
    url, received = redirecting
    with pytest.raises(KubeconfigError, match=r"answered 307 redirecting to 'http://127\.0\.0\.1:\d+/elsewhere': kasctl "
                                              "follows no redirect"):
        rest_call(url, "/api/v4/jobs/7", "secret-job-token", None, method="PUT", body={})
    assert received == []
