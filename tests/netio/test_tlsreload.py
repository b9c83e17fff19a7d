"""netio.tlsreload: certificates read again from their files without a restart. Handshakes run
in memory (two ``ssl.SSLObject`` over BIOs), the clock is a number the test moves."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import pytest
import trustme

from netio.tlsreload import ReloadingContext, TLSFiles, TLSLoadError

pytestmark = pytest.mark.timeout(10)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Conn:
    """A client and a server TLS object joined by memory BIOs."""

    def __init__(self, server: ssl.SSLContext, client: ssl.SSLContext, *, cert: trustme.LeafCert | None = None) -> None:
        self.c_in, self.c_out, self.s_in, self.s_out = (ssl.MemoryBIO() for _ in range(4))
        self.server = server.wrap_bio(self.s_in, self.s_out, server_side=True)
        self.client = client.wrap_bio(self.c_in, self.c_out, server_hostname="kasd.test")
        done = {"client": False, "server": False}
        for _ in range(10):
            for name, obj in (("client", self.client), ("server", self.server)):
                if not done[name]:
                    try:
                        obj.do_handshake()
                        done[name] = True
                    except ssl.SSLWantReadError:
                        pass
                self._move()
            if all(done.values()):
                return
        raise AssertionError("handshake did not finish")

    def _move(self) -> None:
        self.s_in.write(self.c_out.read())
        self.c_in.write(self.s_out.read())

    def echo(self, data: bytes) -> bytes:
        self.client.write(data)
        self._move()
        got = self.server.read(1024)
        self.server.write(got)
        self._move()
        return self.client.read(1024)

    @property
    def serial(self) -> int:
        der = self.client.getpeercert(binary_form=True)
        assert der is not None
        from cryptography import x509

        return x509.load_der_x509_certificate(der).serial_number


def _write(leaf: trustme.LeafCert, cert: Path, key: Path) -> int:
    leaf.private_key_pem.write_to_path(str(key))
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    from cryptography import x509

    return x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()).serial_number


@pytest.fixture
def pki(tmp_path: Path) -> tuple[trustme.CA, Path, Path, ssl.SSLContext]:
    ca = trustme.CA()
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return ca, tmp_path / "tls.crt", tmp_path / "tls.key", client


def test_changed_files_serve_the_next_handshake_and_connections_in_flight_keep_theirs(pki, caplog) -> None:
    ca, cert, key, client = pki
    first = _write(ca.issue_cert("kasd.test"), cert, key)
    clock = Clock()
    tls = ReloadingContext(TLSFiles(server=True, cert=cert, key=key), name="listeners.agent", clock=clock)
    tls.set_alpn_protocols(["h2"])  # what the listener asked of the context carries over to new ones
    client.set_alpn_protocols(["h2"])
    old = Conn(tls, client)
    assert old.serial == first

    caplog.set_level(logging.INFO, logger="netio.tls")
    second = _write(ca.issue_cert("kasd.test"), cert, key)
    assert Conn(tls, client).serial == first  # not looked at before check_interval
    clock.now += 10
    new = Conn(tls, client)
    assert new.serial == second != first
    assert new.client.selected_alpn_protocol() == "h2"
    assert old.echo(b"still here") == b"still here"  # the connection in flight is untouched
    assert f"serial={second:x}" in caplog.text and "PRIVATE" not in caplog.text
    assert tls.loads == 2


def test_a_pair_that_does_not_load_is_refused_and_the_old_certificate_stays(pki, caplog) -> None:
    ca, cert, key, client = pki
    first = _write(ca.issue_cert("kasd.test"), cert, key)
    tls = ReloadingContext(TLSFiles(server=True, cert=cert, key=key), name="listeners.agent", check_interval=0)
    other = ca.issue_cert("kasd.test")
    other.cert_chain_pems[0].write_to_path(str(cert))  # half written: the new certificate, the old key
    assert tls.reload() is False
    assert "does not belong to the certificate" in caplog.text and "keep the previous certificate" in caplog.text
    assert Conn(tls, client).serial == first
    cert.write_bytes(b"-----BEGIN CERT")  # truncated
    assert tls.reload() is False
    assert "no PEM certificate" in caplog.text
    assert Conn(tls, client).serial == first
    second = _write(other, cert, key)  # the writer finished: loaded at the next look
    assert tls.reload() is True
    assert Conn(tls, client).serial == second


def test_the_first_load_names_the_problem(pki) -> None:
    ca, cert, key, _ = pki
    _write(ca.issue_cert("kasd.test"), cert, key)
    ca.issue_cert("other").private_key_pem.write_to_path(str(key))
    with pytest.raises(TLSLoadError, match="does not belong"):
        ReloadingContext(TLSFiles(server=True, cert=cert, key=key), name="x")


def test_a_client_bundle_is_read_again_for_the_next_dial(pki, tmp_path: Path) -> None:
    """agentd's kas_ca_file: kasd's certificate moves to a new CA; the bundle follows it."""
    old_ca, cert, key, _ = pki
    new_ca = trustme.CA()
    bundle = tmp_path / "ca.pem"
    old_ca.cert_pem.write_to_path(str(bundle))
    client = ReloadingContext(TLSFiles(server=False, ca=bundle), name="kas_ca_file", check_interval=0)
    assert len(client.current.get_ca_certs()) == 1  # the bundle alone, never the system's CAs too
    _write(new_ca.issue_cert("kasd.test"), cert, key)
    server = ReloadingContext(TLSFiles(server=True, cert=cert, key=key), name="agent")
    with pytest.raises(ssl.SSLCertVerificationError):
        Conn(server, client)
    bundle.write_bytes(old_ca.cert_pem.bytes() + new_ca.cert_pem.bytes())
    client.reload()
    assert Conn(server, client).echo(b"ok") == b"ok"


def test_mutual_tls_needs_a_client_certificate_signed_by_the_client_ca(pki, tmp_path: Path) -> None:
    ca, cert, key, _ = pki
    _write(ca.issue_cert("kasd.test"), cert, key)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server = ReloadingContext(TLSFiles(server=True, cert=cert, key=key, ca=tmp_path / "ca.pem"), name="private")
    anonymous = ReloadingContext(TLSFiles(server=False, ca=tmp_path / "ca.pem"), name="peers")
    with pytest.raises(ssl.SSLError):
        Conn(server, anonymous).echo(b"x")
    peer = ReloadingContext(TLSFiles(server=False, ca=tmp_path / "ca.pem", cert=cert, key=key), name="peers")
    assert Conn(server, peer).echo(b"ok") == b"ok"
