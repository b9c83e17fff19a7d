#!/usr/bin/env python3
"""Run ``python -m MODULE ARGS…`` with a cProfile switched on and off by SIGUSR2 (for the benches).

    python bench/profiled.py -m kasd --config …

The first SIGUSR2 starts a profile, the next one stops it and writes it to
``$BENCH_PROFILE_DIR/<module>-<pid>-<n>.prof`` (``pstats`` format), and so on. Only the modules named in
``$BENCH_PROFILE_MODULES`` (comma-separated; default ``kasd,agentd``) get the handler; anything else
runs as it would under ``python -m``. ``bench/e2e.py --profile`` uses it to count the Python calls per
request in each daemon over one load and nothing else (start-up and shutdown stay outside).
"""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys
from pathlib import Path
from types import FrameType


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        raise SystemExit("usage: profiled.py -m MODULE [ARGS…]")
    module = sys.argv[2]
    sys.argv = [sys.argv[0], *sys.argv[3:]]
    wanted = os.environ.get("BENCH_PROFILE_MODULES", "kasd,agentd").split(",")
    directory = os.environ.get("BENCH_PROFILE_DIR")
    if directory and module in wanted:
        state: dict[str, object] = {"profile": None, "count": 0}

        def toggle(signum: int, frame: FrameType | None) -> None:
            profile = state["profile"]
            if profile is None:
                profile = cProfile.Profile()
                state["profile"] = profile
                profile.enable()
                return
            assert isinstance(profile, cProfile.Profile)
            profile.disable()
            state["profile"] = None
            count = state["count"] = int(str(state["count"])) + 1
            profile.dump_stats(Path(directory) / f"{module}-{os.getpid()}-{count}.prof")

        signal.signal(signal.SIGUSR2, toggle)
    sys.path[0] = os.getcwd()  # as `python -m` has it, not this script's folder
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
