"""The ``agentd`` process for real: sd_notify, the ready file, a request through, SIGTERM → exit 0."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio
import trustme

from kubesim.server import open_kubesim
from tests.agentd.harness import AGENT_TOKEN, SIM_TOKEN, FakeKasd, exchange, head, start_fake_kasd
from tests.agentd.test_tunnels import http_get, write_kubeconfig
from tests.daemons import running_daemon
from tests.trusted import TRUSTED
from wire.h2carrier import server_ssl_context

pytestmark = pytest.mark.timeout(20)


async def test_agentd_process_serves_and_drains_on_sigterm(nursery: trio.Nursery, tmp_path: Path) -> None:
    async with open_kubesim(objects=TRUSTED, token=SIM_TOKEN) as sim:
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        kasd = await start_fake_kasd(nursery)
        (tmp_path / "token").write_text(AGENT_TOKEN)
        sockdir = tempfile.mkdtemp(prefix="agentd-notify-")  # short: unix socket paths are limited
        notify = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        await notify.bind(os.path.join(sockdir, "notify"))
        log_path = tmp_path / "agentd.log"
        env = {**os.environ, "NOTIFY_SOCKET": os.path.join(sockdir, "notify"), "POD_NAME": "agentd-proc"}
        with log_path.open("wb") as log_file:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "agentd", "--kas-address", kasd.url, "--token-file", str(tmp_path / "token"),
                 "--kubeconfig", str(tmp_path / "kubeconfig"), "--connections", "1",
                 "--health-address", "127.0.0.1:0", "--ready-file", str(tmp_path / "ready.json"),
                 "--agent-id", "42", "--log-level", "debug"],
                env=env, stdout=subprocess.DEVNULL, stderr=log_file)
        try:
            with trio.fail_after(15):
                await _drive(process, notify, kasd, tmp_path)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            notify.close()
            shutil.rmtree(sockdir, ignore_errors=True)
        log = log_path.read_text()
        assert "request method=GET path=/api/v1/namespaces status=200" in log
        assert "agentd stopped" in log
        assert AGENT_TOKEN not in log and SIM_TOKEN not in log


async def _drive(process: trio.Process, notify: trio.socket.SocketType, kasd: FakeKasd, tmp_path: Path) -> None:
    assert await notify.recv(4096) == b"READY=1"
    assert await notify.recv(4096) == b"STATUS=connected to kasd"
    health = json.loads((tmp_path / "ready.json").read_text())["health"]
    host, port = health.rsplit(":", 1)
    assert await http_get((host, int(port)), "/readiness") == (200, "ok\n")
    session = await kasd.session(0)
    assert session.peer_metadata["agent_id"] == "42"
    assert session.peer_metadata["pod_name"] == "agentd-proc"
    response, body = await exchange(session, head("GET", "/api/v1/namespaces"))
    assert response.status == 200 and b"NamespaceList" in body
    process.send_signal(signal.SIGTERM)
    assert await notify.recv(4096) == b"STOPPING=1"
    assert await process.wait() == 0


async def test_sighup_reads_kas_ca_file_again_for_the_next_dial(nursery: trio.Nursery, tmp_path: Path) -> None:
    """kasd's certificate is now of a CA agentd's kas_ca_file does not hold, and agentd looks at the
    file on SIGHUP only (--kas-ca-reload-interval 0): its dials fail until the new bundle is written
    and the process gets a real SIGHUP; then the tunnel comes up, with no restart."""
    old, new = trustme.CA(), trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    new.issue_cert("127.0.0.1").configure_cert(server)
    kasd = await start_fake_kasd(nursery, server_ssl_context(server))
    bundle = tmp_path / "kas-ca.pem"
    old.cert_pem.write_to_path(str(bundle))
    (tmp_path / "token").write_text(AGENT_TOKEN)
    write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1")
    args = ["--kas-address", kasd.url, "--token-file", str(tmp_path / "token"), "--kubeconfig",
            str(tmp_path / "kubeconfig"), "--connections", "1", "--health-address", "127.0.0.1:0",
            "--kas-ca-file", str(bundle), "--kas-ca-reload-interval", "0", "--api-check-interval", "0",
            "--discovery-interval", "0"]
    with trio.fail_after(15):
        async with running_daemon("agentd", args) as log:
            await log.until("dial failed")  # kasd's certificate is not trusted yet
            assert kasd.sessions == []
            (tmp_path / "kas-ca.new").write_bytes(old.cert_pem.bytes() + new.cert_pem.bytes())
            os.replace(tmp_path / "kas-ca.new", bundle)
            log.process.send_signal(signal.SIGHUP)
            await log.until("TLS CA bundle reloaded name=kas_ca_file")
            await kasd.session(0)  # the next dial verified kasd by the new bundle
    assert "CERTIFICATE_VERIFY_FAILED" in log.text.split("TLS CA bundle reloaded")[0]
