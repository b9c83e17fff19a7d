#!/usr/bin/env python3
"""The sans-I/O work of one small proxied request, in a loop: what the mypyc build speeds up.

    python bench/hotpath.py                    # the modules as they import here
    python scripts/compiled.py                 # then, for the compiled build:
    (cd build/compiled-tree && PYTHONPATH=$PWD python bench/hotpath.py)

One cycle is what kasd and agentd do together for a small GET, minus the I/O: llhttp parses the
client's request (``http11.framing``), the mux on kasd's side opens a stream with a Kubernetes
request head as metadata, agentd's side reads the OPEN, accepts, answers with a ~300-byte body and
half-closes, kasd's side reads all of that, acknowledges the data and half-closes, and both sides
see the stream end; kasd frames the answer for the client. The figure is µs per cycle (best of
five runs, in CPU time: the machine may be busy), and says whether the modules ran compiled. A tight loop runs hot: in the daemons the
same code costs several times more (docs/benchmarks.md, "Hot and in place").
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from http11 import framing
from wire import mux

REQUEST = (
    b"GET /api/v1/namespaces/default/configmaps/bench-small HTTP/1.1\r\nHost: 127.0.0.1:8154\r\n"
    b"Authorization: Bearer 0123456789abcdef\r\nAccept: application/json\r\nUser-Agent: bench\r\n\r\n"
)
HEAD = {"v": 1, "method": "GET", "target": "/api/v1/namespaces/default/configmaps/bench-small",
        "headers": [["accept", "application/json"], ["user-agent", "bench"]], "kind": "k8s"}  # fmt: skip
BODY = b'{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"bench-small"}}' * 4


def _pair() -> tuple[mux.MuxConnection, mux.MuxConnection]:
    kasd, agentd = mux.MuxConnection(client=False), mux.MuxConnection(client=True)
    agentd.initiate()
    kasd.initiate()
    for _ in range(3):
        kasd.receive_data(agentd.data_to_send())
        agentd.receive_data(kasd.data_to_send())
    return kasd, agentd


def cycle(kasd: mux.MuxConnection, agentd: mux.MuxConnection) -> None:
    parser = framing.RequestParser(max_head=64 * 1024)
    parser.feed(REQUEST)
    parser.next_event()
    sid = kasd.open_stream(HEAD)
    kasd.end_stream(sid)
    agentd.receive_data(kasd.data_to_send())
    agentd.accept_stream(sid, {"status": 200, "headers": [["content-type", "application/json"]]})
    agentd.send_data(sid, BODY)
    agentd.end_stream(sid)
    kasd.receive_data(agentd.data_to_send())
    kasd.acknowledge_received_data(sid, len(BODY))
    agentd.receive_data(kasd.data_to_send())
    framing.encode_response_head(200, [("content-type", "application/json"), ("content-length", str(len(BODY)))])


def main() -> None:
    compiled = [m.__name__ for m in (mux, framing, mux.codec) if (m.__file__ or "").endswith(".so")]
    kasd, agentd = _pair()
    for _ in range(2000):
        cycle(kasd, agentd)
    best = float("inf")
    for _ in range(5):
        n = 5000
        started = time.process_time()
        for _ in range(n):
            cycle(kasd, agentd)
        best = min(best, (time.process_time() - started) / n)
    print(f"{'compiled (' + ', '.join(compiled) + ')' if compiled else 'interpreted'}: "
          f"{best * 1e6:.1f} µs per request cycle")  # fmt: skip


if __name__ == "__main__":
    main()
