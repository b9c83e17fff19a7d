"""systemd's sd_notify, and an atomically written JSON ready file (a test and script hook)."""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("daemonstatus")


def sd_notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``READY=1``) to ``$NOTIFY_SOCKET``; False when not under systemd."""
    address = (environ if environ is not None else os.environ).get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("sd_notify failed socket=%r error=%s", address, exc)
        return False
    return True


def write_ready_file(path: Path, addresses: Mapping[str, str]) -> None:
    """Atomically write ``{"name": "host:port", ...}`` so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(dict(addresses)) + "\n")
    tmp.replace(path)
