"""Receptive mode in-process on 127.0.0.1: a real agentd listening, kasd's real dialer dialling it
(the sessions go to a fake kasd's handler), and strangers refused at the hello."""

from __future__ import annotations

import base64
import json
import os
import ssl
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from joserfc.jwk import OKPKey

from agentd.kubeapi import KubeTarget
from agentd.receptive import MAX_PENDING, MAX_PENDING_PER_SOURCE
from daemonkit.settings import HostPort
from kasd.config.directory import AgentEntry
from kasd.config.receptive import ReceptiveEntry
from kasd.receptive import ReceptiveCredentials, ReceptiveDialer, only_the_dialled_agent
from netio.tlsreload import ReloadingContext, reload_all
from tests.agentd.harness import AGENT_TOKEN, FakeKasd, agent_config, running_agent
from wire.carrier import TunnelRejectedError
from wire.receptive import MAX_HELLO, MTLS_CREDENTIAL, hello, mint_token

pytestmark = pytest.mark.timeout(20)
AGENT_ID = 7


@attrs.frozen
class Principal:
    id: int


class Keys:
    def __init__(self, tmp_path: Path) -> None:
        self.ca = trustme.CA()
        self.ca_file = tmp_path / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.listener = tmp_path / "listener.pem"
        self.ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(self.listener))
        self.client = tmp_path / "client.pem"
        self.ca.issue_cert("kasd.internal").private_key_and_cert_chain_pem.write_to_path(str(self.client))
        key = ed25519.Ed25519PrivateKey.generate()
        self.private = tmp_path / "jwt.key"
        self.private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
        self.public = tmp_path / "jwt.pub"
        self.public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                              serialization.PublicFormat.SubjectPublicKeyInfo))
        self.jwk = OKPKey.import_key(self.private.read_bytes())


def _agentd_config(tmp_path: Path, keys: Keys, auth: str) -> Any:
    by = {"receptive_jwt_file": keys.public} if auth == "jwt" else \
        {"receptive_ca_cert_file": keys.ca_file, "receptive_client_name": "kasd.internal"}
    return agent_config(tmp_path, "http://127.0.0.1:1/tunnel", kas_addresses=(), connections=2,
                        agent_id=str(AGENT_ID), receptive_listen_address=HostPort("127.0.0.1", 0),
                        receptive_cert_file=keys.listener, receptive_key_file=keys.listener, **by)


class Kasd(FakeKasd):
    async def authenticate(self, token: str, headers: dict[str, str]) -> Any:
        return Principal(AGENT_ID) if token == AGENT_TOKEN else None


async def _tunnels_up(manager: Any, count: int) -> None:
    """Until agentd counts ``count`` tunnels up (its own end of each session: kasd's may be up first)."""
    while manager.tunnels_up != count:
        await manager.wait_tunnels_changed()


def _dialer(kasd: Kasd, keys: Keys, address: str, auth: str, stop: trio.Event) -> ReceptiveDialer:
    by: dict[str, Any] = {"private_key_file": keys.private} if auth == "jwt" else \
        {"client_cert_file": keys.client, "client_key_file": keys.client}
    entry = ReceptiveEntry(url=f"grpcs://{address}", ca_cert_file=keys.ca_file, **by)
    agent = AgentEntry(id=AGENT_ID, name="recept", config_project="group/p", token_sha256="0" * 64, receptive=entry)
    return ReceptiveDialer([agent], sessions=kasd.handler, authenticate=kasd.authenticate, membership=None, stop=stop,
                           handshake_timeout=5.0)


@pytest.mark.parametrize("auth", ["jwt", "mtls"])
async def test_kasd_dials_in_and_dials_again_when_the_session_ends(nursery: trio.Nursery, tmp_path: Path,
                                                                   auth: str) -> None:
    keys = Keys(tmp_path)
    kasd = Kasd()
    async with running_agent(nursery, _agentd_config(tmp_path, keys, auth),
                             KubeTarget(scheme="http", host="127.0.0.1", port=1)) as running:
        assert running.receptive is not None
        stop = trio.Event()
        dialer = _dialer(kasd, keys, running.receptive.bound, auth, stop)
        nursery.start_soon(dialer.run)
        with trio.fail_after(10):
            first = await kasd.session(0)
            # (kasd's end of the session is up; agentd counts its tunnel once its own end is)
            await _tunnels_up(running.manager, 1)
            await first.aclose()  # the session is lost (the dialling replica died, say)
            await kasd.session(1)  # ... and kasd dials again; agentd takes it
            await _tunnels_up(running.manager, 1)
        assert kasd.tokens == []  # (the fake's token list: only its own authenticate would fill it)
        assert running.receptive.refused == 0
        stop.set()


@pytest.mark.parametrize("auth", ["jwt", "mtls"])
async def test_rotated_certificates_serve_kasds_next_dial(nursery: trio.Nursery, tmp_path: Path, auth: str) -> None:
    """Every receptive file replaced by a new one (agentd's listener certificate of a new CA and,
    under mutual TLS, the CA it checks kasd's certificate by; kasd's CA bundle and client
    certificate; the JWT key pair), then what SIGHUP does on both sides: the session up meanwhile
    goes on, and kasd's next dial comes up on the new files only (kasd now trusts the new CA alone,
    agentd the new public key alone), with no restart."""
    keys = Keys(tmp_path)
    kasd = Kasd()
    async with running_agent(nursery, _agentd_config(tmp_path, keys, auth),
                             KubeTarget(scheme="http", host="127.0.0.1", port=1)) as running:
        assert running.receptive is not None
        stop = trio.Event()
        dialer = _dialer(kasd, keys, running.receptive.bound, auth, stop)
        nursery.start_soon(dialer.run)
        with trio.fail_after(10):
            first = await kasd.session(0)
            await _tunnels_up(running.manager, 1)  # (agentd's end too, before the files change)
            (tmp_path / "new").mkdir()
            new = Keys(tmp_path / "new")
            for old_path, new_path in ((keys.ca_file, new.ca_file), (keys.listener, new.listener),
                                       (keys.client, new.client), (keys.private, new.private),
                                       (keys.public, new.public)):
                os.replace(new_path, old_path)  # whole files, as a Secret's mount or cert-manager does
            reload_all([running.receptive.ssl_context])  # agentd's SIGHUP
            dialer.reload()  # kasd's
            assert kasd.events == ["up 0"] and running.manager.tunnels_up == 1  # the session up is untouched
            await first.aclose()
            await kasd.session(1)  # kasd dialled again, and the handshake verified under the new CA
            await _tunnels_up(running.manager, 1)
        assert isinstance(running.receptive.ssl_context, ReloadingContext)
        assert running.receptive.ssl_context.loads == 2
        stop.set()


def test_kasds_jwt_key_is_read_again_when_its_file_changes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """kasd signs with the key its file holds now; a file that does not load keeps the previous key
    (one ERROR line naming the file, never its bytes)."""
    keys = Keys(tmp_path)
    credentials = ReceptiveCredentials(AGENT_ID, ReceptiveEntry(url="grpcs://127.0.0.1:1", private_key_file=keys.private))
    first = credentials.key()
    assert first is not None and first.as_dict() == keys.jwk.as_dict()
    assert credentials.key() is first and credentials.key_loads == 1  # unchanged: not read again
    (tmp_path / "new").mkdir()
    rotated = Keys(tmp_path / "new")
    os.replace(rotated.private, keys.private)
    second = credentials.key()
    assert second is not None and second.as_dict() == rotated.jwk.as_dict()
    (tmp_path / "broken").write_bytes(b"-----BEGIN PRIVATE KEY-----\nhunter2\n")
    os.replace(tmp_path / "broken", keys.private)
    with caplog.at_level("INFO", logger="kasd.receptive"):
        assert credentials.key() is second
        assert credentials.key() is second  # reported once
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and str(keys.private) in errors[0] and "hunter2" not in errors[0]


async def _hello_answer(address: str, keys: Keys, line: bytes, *, client_cert: bool = False) -> bytes:
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(keys.ca_file))
    if client_cert:
        context.load_cert_chain(str(keys.client))
    stream = trio.SSLStream(await trio.open_tcp_stream(host, int(port)), context, server_hostname=host)
    await stream.do_handshake()
    await stream.send_all(line)
    answer = b""
    try:
        while chunk := await stream.receive_some(512):
            answer += chunk
    except trio.BrokenResourceError:
        pass
    await stream.aclose()
    return answer


async def test_strangers_are_refused_at_the_hello(nursery: trio.Nursery, tmp_path: Path) -> None:
    keys = Keys(tmp_path)
    other = OKPKey.generate_key("Ed25519")
    async with running_agent(nursery, _agentd_config(tmp_path, keys, "jwt"),
                             KubeTarget(scheme="http", host="127.0.0.1", port=1)) as running:
        assert running.receptive is not None
        address = running.receptive.bound
        now = time.time()  # tokens carry wall-clock times
        cases = {
            b"GET / HTTP/1.1\r\nhost: x\r\n\r\n": b"NO not a receptive hello\n",
            hello(mint_token(other, agent_id=AGENT_ID, now=now)): b"NO bad token\n",
            hello(mint_token(keys.jwk, agent_id=AGENT_ID, now=now - 3600)): b"NO token expired\n",
            hello(mint_token(keys.jwk, agent_id=AGENT_ID + 1, now=now)): b"NO token is for another agent\n",
            hello(MTLS_CREDENTIAL): b"NO this agentd authenticates kasd by JWT\n",
            hello(_unsigned(AGENT_ID, now)): b"NO bad token\n",
            b"KASR/1 " + b"x" * MAX_HELLO: b"NO hello too long\n",
        }
        with trio.fail_after(10):
            for line, refused in cases.items():
                assert await _hello_answer(address, keys, line) == refused
        assert running.receptive.refused == len(cases)
        assert running.receptive.accepted == 0
        assert running.manager.tunnels_up == 0


async def test_a_stranger_holding_handshakes_open_does_not_keep_kasd_out(nursery: trio.Nursery, tmp_path: Path) -> None:
    """Connections that never finish their handshake take at most MAX_PENDING_PER_SOURCE of the
    handshake slots from one source: kasd, from another, still gets in at once."""
    keys = Keys(tmp_path)
    kasd = Kasd()
    async with running_agent(nursery, _agentd_config(tmp_path, keys, "jwt"),
                             KubeTarget(scheme="http", host="127.0.0.1", port=1)) as running:
        assert running.receptive is not None
        running.receptive.handshake_timeout = 60  # the strangers hold their slots all through the test
        host, port = running.receptive.bound.rsplit(":", 1)
        with trio.fail_after(15):
            # 127.0.0.2: another source than kasd's 127.0.0.1 (Linux routes all of 127/8 to lo)
            stalled = [await trio.open_tcp_stream(host, int(port), local_address="127.0.0.2")
                       for _ in range(MAX_PENDING)]
            await trio.testing.wait_all_tasks_blocked()  # agentd took them all and waits on each
            assert running.receptive.refused == MAX_PENDING - MAX_PENDING_PER_SOURCE
            stop = trio.Event()
            nursery.start_soon(_dialer(kasd, keys, running.receptive.bound, "jwt", stop).run)
            await kasd.session(0)  # while the strangers still hold theirs
            await _tunnels_up(running.manager, 1)
        stop.set()
        for stream in stalled:
            await stream.aclose()


def _unsigned(agent_id: int, now: float) -> str:
    """A token with ``alg: none`` and every claim right: the algorithm alone must refuse it."""
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    claims = {"iss": "kasd", "aud": "agentd", "sub": str(agent_id), "iat": int(now), "nbf": int(now),
              "exp": int(now) + 60}
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


async def test_kasd_refuses_the_token_of_another_agent_on_the_connection_it_dialled() -> None:
    async def authenticate(token: str, headers: dict[str, str]) -> Any:
        await trio.lowlevel.checkpoint()
        return Principal(AGENT_ID + 1) if token == "other" else Principal(AGENT_ID)

    check = only_the_dialled_agent(authenticate, AGENT_ID)
    assert await check("mine", {}) == Principal(AGENT_ID)
    with pytest.raises(TunnelRejectedError) as refused:
        await check("other", {})
    assert (refused.value.status, refused.value.message) == (403, "provided agent token belongs to a different agent id")


async def test_mutual_tls_refuses_a_client_certificate_of_another_ca(nursery: trio.Nursery, tmp_path: Path) -> None:
    keys = Keys(tmp_path)
    async with running_agent(nursery, _agentd_config(tmp_path, keys, "mtls"),
                             KubeTarget(scheme="http", host="127.0.0.1", port=1)) as running:
        assert running.receptive is not None
        (tmp_path / "other").mkdir()
        stranger = Keys(tmp_path / "other")
        # the stranger's client certificate (another CA) against agentd's real certificate
        stranger.ca_file = keys.ca_file
        with trio.fail_after(10):
            with pytest.raises((trio.BrokenResourceError, ssl.SSLError)):
                answer = await _hello_answer(running.receptive.bound, stranger, hello(MTLS_CREDENTIAL),
                                             client_cert=True)
                if not answer:  # TLS 1.3: the refusal of the certificate arrives with the first read
                    raise trio.BrokenResourceError("closed")
            # without any certificate: refused too
            with pytest.raises((trio.BrokenResourceError, ssl.SSLError)):
                answer = await _hello_answer(running.receptive.bound, keys, hello(MTLS_CREDENTIAL))
                if not answer:
                    raise trio.BrokenResourceError("closed")
        assert running.receptive.accepted == 0
        assert running.manager.tunnels_up == 0



async def _tls_to(address: str, keys: Keys, *, source: str | None = None) -> trio.SSLStream[trio.SocketStream]:
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(keys.ca_file))
    stream = trio.SSLStream(await trio.open_tcp_stream(host, int(port), local_address=source), context,
                            server_hostname=host)
    await stream.do_handshake()  # (TLS 1.3: done once agentd has taken the connection into its handshake)
    return stream


async def test_strangers_holding_every_handshake_slot_do_not_keep_kasd_out(nursery: trio.Nursery,
                                                                           tmp_path: Path) -> None:
    """MAX_PENDING idle connections (strangers on several hosts, each within its per-source cap,
    renewing each as it times out) and then kasd: kasd's hello is answered, and the oldest idle
    connection is the one closed."""
    keys = Keys(tmp_path)
    async with running_agent(nursery, _agentd_config(tmp_path, keys, "jwt"),
                             KubeTarget(scheme="http", host="127.0.0.1", port=1)) as running:
        listener = running.receptive
        assert listener is not None
        with trio.fail_after(10):
            # 127.0.0.2, .3, …: other sources than kasd's 127.0.0.1 (Linux routes all of 127/8 to lo)
            idle = [await _tls_to(listener.bound, keys, source=f"127.0.0.{2 + n // MAX_PENDING_PER_SOURCE}")
                    for n in range(MAX_PENDING)]
            assert listener.pending == MAX_PENDING
            kasd = await _tls_to(listener.bound, keys)
            await kasd.send_all(hello(mint_token(keys.jwk, agent_id=AGENT_ID, now=time.time())))
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = await kasd.receive_some(1)
                assert chunk, "agentd closed kasd's connection"
                answer += chunk
            assert answer == b"OK\n"
            with pytest.raises(trio.BrokenResourceError):  # the oldest stranger was displaced
                if await idle[0].receive_some(1) == b"":
                    raise trio.BrokenResourceError("closed")
        assert listener.accepted == 1
        for stream in (*idle, kasd):
            await stream.aclose()


async def test_kasd_going_silent_after_the_hello_does_not_keep_a_slot(nursery: trio.Nursery, tmp_path: Path) -> None:
    """kasd's host vanishes (no FIN) between agentd's OK and its answer to the tunnel request, on
    every slot: each slot gives up after the handshake time, and the next replica's dial is served."""
    keys = Keys(tmp_path)
    async with running_agent(nursery, _agentd_config(tmp_path, keys, "jwt"),
                             KubeTarget(scheme="http", host="127.0.0.1", port=1)) as running:
        listener = running.receptive
        assert listener is not None
        listener.handshake_timeout = 0.5
        with trio.fail_after(10):
            silent = []
            for _ in range(2):  # one per slot (connections=2): each says its hello, then nothing ever
                stream = await _tls_to(listener.bound, keys)
                await stream.send_all(hello(mint_token(keys.jwk, agent_id=AGENT_ID, now=time.time())))
                silent.append(stream)
            kasd = Kasd()
            stop = trio.Event()
            nursery.start_soon(_dialer(kasd, keys, listener.bound, "jwt", stop).run)
            await kasd.session(0)
            stop.set()
        for stream in silent:
            await stream.aclose()


async def test_mutual_tls_refuses_another_certificate_of_kasds_ca(nursery: trio.Nursery, tmp_path: Path) -> None:
    """The CA that signs kasd's client certificate signed this agentd's own serving certificate too
    (one internal CA, as often): that certificate (held by every agentd it was issued to) is not
    kasd's, nor is one with no name, and the hello is refused; kasd's own is taken."""
    keys = Keys(tmp_path)
    keys.ca.issue_cert("KASD.internal.evil").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "near.pem"))
    async with running_agent(nursery, _agentd_config(tmp_path, keys, "mtls"),
                             KubeTarget(scheme="http", host="127.0.0.1", port=1)) as running:
        assert running.receptive is not None
        with trio.fail_after(10):
            for certificate in (keys.listener, tmp_path / "near.pem"):
                keys.client = certificate
                answer = await _hello_answer(running.receptive.bound, keys, hello(MTLS_CREDENTIAL), client_cert=True)
                assert answer == b"NO the client certificate is not kasd's\n"
        assert running.receptive.accepted == 0
