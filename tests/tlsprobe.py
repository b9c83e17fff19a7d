"""What a kubelet probe or a Prometheus scrape over HTTPS sees: one GET on a new TLS connection,
the answer and the serial of the certificate served (for the health ports' optional TLS)."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import attrs
import trio
import trustme
from cryptography import x509


@attrs.frozen
class Probe:
    status: int
    body: bytes
    #: the serial of the certificate the server presented on this connection
    serial: int


async def https_get(port: int, path: str, ca_file: Path, host: str = "127.0.0.1") -> Probe:
    context = ssl.create_default_context(cafile=str(ca_file))
    stream = trio.SSLStream(await trio.open_tcp_stream(host, port), context, server_hostname=host)
    try:
        await stream.do_handshake()
        der = stream.getpeercert(binary_form=True)
        await stream.send_all(f"GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n".encode())
        data = b""
        try:
            while chunk := await stream.receive_some(65536):
                data += chunk
        except trio.BrokenResourceError:
            pass  # (the server may close without a TLS close_notify)
    finally:
        await trio.aclose_forcefully(stream)
    assert der is not None
    head, _, body = data.partition(b"\r\n\r\n")
    return Probe(int(head.split(b" ", 2)[1]), body, x509.load_der_x509_certificate(der).serial_number)


async def plain_get(port: int, path: str) -> bytes:
    """What a plain-HTTP GET gets back (b"" or not HTTP when the port serves HTTPS only)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        data = b""
        try:
            while chunk := await stream.receive_some(65536):
                data += chunk
        except trio.BrokenResourceError:
            pass
        return data
    finally:
        await trio.aclose_forcefully(stream)


class ServerFiles:
    """A CA and a server certificate for 127.0.0.1 in ``cert``/``key``; ``rotate()`` writes a new one
    over them as whole files (as a Secret's mount does) and returns its serial."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = trustme.CA()
        self.ca_file = directory / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.cert = directory / "tls.crt"
        self.key = directory / "tls.key"
        self.serial = self.rotate()

    def rotate(self) -> int:
        leaf = self.ca.issue_cert("127.0.0.1")
        for path, blob in ((self.key, leaf.private_key_pem), (self.cert, leaf.cert_chain_pems[0])):
            blob.write_to_path(str(path.with_suffix(".new")))
            os.replace(path.with_suffix(".new"), path)
        self.serial = x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()).serial_number
        return self.serial
