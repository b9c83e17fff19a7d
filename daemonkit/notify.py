"""systemd's sd_notify, and an atomically written JSON ready file (a test and script hook)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("daemonkit")


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


def ready_file_problem(path: Path) -> str | None:
    """Why ``write_ready_file(path, …)`` cannot work, or None. Daemons check it with the rest of
    their configuration: better to refuse to start than to find out once listening."""
    parent = path.parent
    if path.is_dir():
        return f"{path} is a directory"
    if not parent.exists():
        return f"directory {parent} does not exist"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"directory {parent} is not writable"
    return None


def write_ready_file(path: Path, addresses: Mapping[str, str]) -> bool:
    """Atomically write ``{"name": "host:port", ...}`` so a reader never sees half a file.

    A failure (say the directory went away after the configuration was checked) is logged and
    returns False: a hook for tests and scripts is no reason to bring a serving daemon down.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(dict(addresses)) + "\n")
        tmp.replace(path)
    except OSError as exc:
        log.error("cannot write ready file path=%s error=%s", path, exc.strerror or exc)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return False
    return True
