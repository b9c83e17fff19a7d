"""bench/environments.py stays runnable: the objects it makes carry GitLab's labels in the mix its
help describes, and its /proc figures read. The figures themselves belong in docs/benchmarks.md."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import environments


def test_an_environments_objects_carry_gitlabs_labels_in_the_documented_mix() -> None:
    objects = environments.env_objects("env-07", 200)
    assert len(objects) == 200
    assert Counter(body["kind"] for _, body in objects) == {"Deployment": 10, "Service": 10, "ConfigMap": 180}
    assert all(body["metadata"]["labels"] == {"app.gitlab.com/project_id": "1",
                                              "app.gitlab.com/environment_slug": "env-07"} for _, body in objects)
    assert all(path.startswith("/api") and "/namespaces/env-07/" in path for path, _ in objects)


def test_process_figures_read_proc() -> None:
    me = environments.ProcessFigures(os.getpid())
    assert me.rss_mib() > 1 and me.cpu() > 0
