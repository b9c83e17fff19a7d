"""`kasctl demo` as a user runs it: every command it prints works, with every kubectl found, and
Ctrl-C stops it cleanly even with the printed `kubectl get pods -w` still open."""

from __future__ import annotations

import os
import re
import shlex
import signal
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import KUBECTL_CAP, LineReader
from tests.forkrun import run_module

REPO = Path(__file__).resolve().parents[2]
MANIFEST = "examples/manifests/hello.yaml"

#: every command the guide prints, in order; a new one must be added here (and exercised below)
PRINTED = [
    "kubectl get pods -A",
    "kubectl get pods -w",
    "kubectl scale deploy/hello --replicas=3",
    "kubectl logs -f deploy/hello",
    "kubectl exec -it deploy/hello -- sh",
    "kubectl port-forward deploy/hello 8080:80",
    "kubectl cp README.md {pod}:/tmp/README.md",
    "kubectl cp {pod}:/tmp/README.md /tmp/README.copy",
    f"kubectl apply -f {MANIFEST}",
    f"kubectl delete -f {MANIFEST}",
    "kubectl --kubeconfig {job} auth whoami",  # in the CI block, run as a whole below
    "kubectl --kubeconfig {job} create deployment web --image=nginx",
]


def _commands(guide: list[str]) -> list[str]:
    """The kubectl commands in the guide, comments included ("in another terminal: kubectl …")."""
    return [match.group().strip() for line in guide for match in re.finditer(r"\bkubectl\s[^#;]*", line)]


@pytest.mark.timeout(150)
def test_every_printed_command_works_and_ctrl_c_stops_cleanly(tmp_path: Path, kubectl_bin: str) -> None:
    # Started from the repository root, as scripts/demo.sh does.
    demo = LineReader([sys.executable, "-m", "kasctl", "demo", "--dir", str(tmp_path / "demo")], cwd=REPO)
    watch: LineReader | None = None
    try:
        demo.wait_for("Press Ctrl-C", timeout=60)
        guide = list(demo.seen)
        export = next(line for line in guide if line.strip().startswith("export KUBECONFIG="))
        env = {**os.environ, "KUBECONFIG": export.strip().removeprefix("export KUBECONFIG=").split()[0]}
        commands = _commands(guide)
        pod = next(word for line in guide for word in line.split() if word.startswith("hello-")).split(":")[0]
        job = tmp_path / "demo" / "job.kubeconfig"
        printed = [command.format(pod=pod, job=job) for command in PRINTED]
        assert commands == printed, guide

        def args(printed: str) -> list[str]:
            words = shlex.split(printed)
            assert words[0] == "kubectl"
            return [kubectl_bin, *words[1:]]

        def run(printed: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.run(args(printed), input=stdin, capture_output=True, text=True,
                                  timeout=KUBECTL_CAP, env=env, cwd=REPO)  # fmt: skip

        get_all, get_watch, scale, logs, exec_sh, forward, copy_in, copy_out, apply, delete, _whoami, _create = printed

        # The CI block, as a user pastes it into a shell: an allowed job's kubeconfig and whoami, a
        # Deployment in the namespace kasd made for it, the environment stopped, the job ended;
        # then a refused job's kubeconfig: none, one line saying why, exit 1 (the block's last line).
        start = next(i for i, line in enumerate(guide) if line.startswith("CI jobs:"))
        block = [line.strip() for line in guide[start + 2:] if line.startswith("  ")][:9]
        script = "set -e\n" + "\n".join(block).replace("\\\n", " ").replace(
            "kubectl --kubeconfig", f"{kubectl_bin} --kubeconfig")
        ci = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)}, cwd=REPO)
        assert ci.returncode == 1, (script, ci.stderr)
        assert ci.stderr.endswith("kasctl kubeconfig: no agent allows project group/other (GET /api/v4/job/"
                                  "allowed_agents answered an empty list): an agent's config file lets a project's "
                                  "jobs in with a ci_access entry (docs/authorization.md)\n"), ci.stderr
        job_config = yaml.safe_load(job.read_text())
        assert [c["name"] for c in job_config["contexts"]] == ["group/demo:demo"]
        assert job_config["contexts"][0]["context"]["namespace"].startswith("review-review-feat-x-")
        assert "gitlab:ci_job:7" in ci.stdout and "gitlab:project_env:3:review-feat-x-" in ci.stdout, ci.stdout
        assert "deployment.apps/web created" in ci.stdout, ci.stdout
        namespace = job_config["contexts"][0]["context"]["namespace"]
        assert f"deleted  Namespace {namespace}" in ci.stdout, ci.stdout
        assert "apiVersion" not in ci.stdout, ci.stdout  # no kubeconfig for the refused job
        # the job ended: its kubeconfig (its token) is refused from then on, saying why
        assert "job 7 of group/app is finished" in ci.stdout, ci.stdout
        ended = run(_whoami)
        assert ended.returncode != 0 and "job 7 is finished" in ended.stderr, ended.stderr

        # The environments block: the dashboard answers, and the printed kasctl lines show the demo's
        # production environment (what the demo applied with the job's kubeconfig) until it is Healthy.
        start = next(i for i, line in enumerate(guide) if line.startswith("Environments:"))
        block = [line.strip() for line in guide[start:] if line.startswith("  ")][:7]
        dashboard = re.search(r"https://\S+/-/dashboard/", block[0])
        assert dashboard is not None, block
        context = ssl.create_default_context(cafile=str(tmp_path / "demo" / "ca.pem"))
        with urllib.request.urlopen(dashboard.group(), timeout=10, context=context) as response:
            assert response.status == 200 and b"<html" in response.read()
        script = "set -e\n" + "\n".join(block[1:])
        envs = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=150,
                              env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)}, cwd=REPO)
        assert envs.returncode == 0, (script, envs.stdout, envs.stderr)
        assert re.search(r"^production\s+production\s+available\s", envs.stdout, re.M), envs.stdout
        assert re.search(r"^Deployment default/hello\s+Healthy$", envs.stdout, re.M), envs.stdout
        assert re.search(r"^production \(group/demo\): Healthy$", envs.stdout, re.M), envs.stdout
        # kasctl agents: the demo's agentd pod, where the Downward API would say it runs
        assert re.search(r"^1 \(demo\)\s+agentd-demo-0\s+gitlab-agent\s+sim-node-0\s", envs.stdout, re.M), envs.stdout
        # kasctl notify --wait: delivered to agentd, which has no handler for the type
        assert re.search(r"^[0-9a-f]{32} delivered outcome=ignored ", envs.stdout, re.M), envs.stdout
        # the cluster report: kubesim's version
        assert '"gitVersion":"v1.32.0"' in envs.stdout, envs.stdout

        listed = run(get_all)
        assert listed.returncode == 0, listed.stderr
        rows = [line.split() for line in listed.stdout.splitlines()[1:]]
        assert len(rows) == 2 and all(row[1].startswith("hello-") and row[3] == "Running" for row in rows), rows

        watch = LineReader(args(get_watch), env=env)
        pods = {watch.wait_for("hello-").split()[0]}
        scaled = run(scale)
        assert scaled.returncode == 0 and "deployment.apps/hello scaled" in scaled.stdout, scaled.stderr
        while len(pods) < 3:  # the watch shows the third pod appear
            pods.add(watch.wait_for("hello-").split()[0])

        follow = LineReader(args(logs), env=env)
        try:
            follow.wait_for("kubesim: ready")
            assert follow.proc.poll() is None  # still following
        finally:
            follow.stop()

        shell = run(exec_sh, stdin="echo $GREETING\nexit 3\n")
        assert shell.returncode == 3, shell.stderr
        assert shell.stdout.strip() == "hello from the demo"

        # The test asks for any free local port rather than the printed 8080; kubectl says which.
        forwarding = LineReader([*args(forward.replace("8080:80", ":80")), "--address", "127.0.0.1"], env=env)
        try:
            port = int(re.search(r"Forwarding from 127\.0\.0\.1:(\d+) -> 80",
                                 forwarding.wait_for("Forwarding from 127.0.0.1")).group(1))
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
                assert response.status == 200 and response.headers["Server"].startswith("nginx/")
                assert b"<title>Welcome to nginx!</title>" in response.read()
        finally:
            forwarding.stop()

        copied = run(copy_in)
        assert copied.returncode == 0, copied.stderr
        back = tmp_path / "README.copy"
        fetched = run(copy_out.replace("/tmp/README.copy", str(back)))
        assert fetched.returncode == 0, fetched.stderr
        assert back.read_bytes() == (REPO / "README.md").read_bytes()

        applied = run(apply)
        assert applied.returncode == 0, applied.stderr
        # the manifest says 2 replicas again; its ConfigMap is as the demo seeded it
        assert "deployment.apps/hello configured" in applied.stdout and "configmap/hello unchanged" in applied.stdout

        deleted = run(delete)
        assert deleted.returncode == 0, deleted.stderr
        assert 'deployment.apps "hello" deleted' in deleted.stdout and 'configmap "hello" deleted' in deleted.stdout

        for line in guide:
            url = re.search(r"http://\S+/(metrics|readiness)", line)
            if url:
                with urllib.request.urlopen(url.group(), timeout=10) as response:
                    assert response.status == 200, line

        # Ctrl-C while the printed watch is still open: every daemon drains and exits 0, none is killed.
        assert watch.proc.poll() is None
        demo.proc.send_signal(signal.SIGINT)
        stopped = demo.wait_for("stopped:", timeout=60)
        assert stopped == "stopped: agentd exit 0, kasd exit 0, kubesim exit 0"
        assert demo.proc.wait(10) == 0
    finally:
        if watch is not None:
            watch.stop()
        if demo.proc.poll() is None:
            demo.proc.send_signal(signal.SIGINT)  # the demo stops its daemons itself
            try:
                demo.proc.wait(60)
            except subprocess.TimeoutExpired:
                demo.stop()


# Without an optional piece the demo stops at once with one line that says what to install. The
# missing package is hidden by a None entry in sys.modules, which makes its import fail.
_HIDE_AND_RUN = "import sys; sys.modules[sys.argv[1]] = None; from kasctl.__main__ import main; sys.exit(main(sys.argv[2:]))"


@pytest.mark.parametrize(("hidden", "advice"), [
    ("trustme", "kasctl demo: the demo needs the trustme package: pip install 'kasd[demo]'"),
    ("kubesim", "kasctl demo: the demo's cluster is kubesim, which is not installed: pip install -e ./kubesim"),
])  # fmt: skip
def test_demo_without_an_optional_package_says_what_to_install(tmp_path: Path, hidden: str, advice: str) -> None:
    result = subprocess.run([sys.executable, "-c", _HIDE_AND_RUN, hidden, "demo", "--dir", str(tmp_path / "demo")],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines() == [advice]


@pytest.mark.timeout(120)
def test_smoke_runs_one_get_and_does_not_ask_for_ctrl_c_and_runs_again_in_its_directory(tmp_path: Path) -> None:
    for _run in ("first", "again, in the directory the first left"):
        result = subprocess.run([sys.executable, "-m", "kasctl", "demo", "--smoke", "--dir", str(tmp_path / "demo")],
                                capture_output=True, text=True, timeout=80, cwd=REPO)  # fmt: skip
        assert result.returncode == 0, (_run, result.stderr)
        assert "Ctrl-C" not in result.stdout
        assert "NAMESPACE" in result.stdout and "hello-" in result.stdout
        assert result.stdout.rstrip().splitlines()[-1] == "stopped: agentd exit 0, kasd exit 0, kubesim exit 0"


def test_the_demo_never_empties_a_directory_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    result = run_module("kasctl", "demo", "--smoke", "--dir", str(tmp_path), timeout=30, cwd=REPO)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"kasctl demo: {tmp_path} exists and was not made by kasctl demo (it has no .kasctl-demo); "
        "choose another --dir, or remove it"]
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the demo's daemons: each in a session of its own)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(90)
def test_closing_the_terminal_stops_every_daemon_the_demo_started(tmp_path: Path) -> None:
    demo = LineReader([sys.executable, "-m", "kasctl", "demo", "--dir", str(tmp_path / "demo")], cwd=REPO)
    daemons: list[int] = []
    try:
        demo.wait_for("Press Ctrl-C", timeout=60)
        daemons = _children(demo.proc.pid)
        assert len(daemons) == 3, daemons  # kubesim, kasd, agentd
        demo.proc.send_signal(signal.SIGHUP)
        demo.proc.wait(60)
        assert [pid for pid in daemons if _alive(pid)] == []
    finally:
        for pid in daemons:  # orphans the demo left (before the fix): ours to end, by pid
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if demo.proc.poll() is None:
            demo.stop()


@pytest.mark.timeout(60)
def test_ctrl_c_while_starting_says_one_line_and_stops_what_had_started(tmp_path: Path) -> None:
    demo = LineReader([sys.executable, "-m", "kasctl", "demo", "--dir", str(tmp_path / "demo")], cwd=REPO)
    try:
        demo.wait_for("starting ", timeout=30)  # the guide comes seconds later, once all three are up
        demo.proc.send_signal(signal.SIGINT)
        assert demo.proc.wait(30) == 130
        assert demo.proc.stderr is not None
        assert demo.proc.stderr.read().splitlines() == [
            "kasctl demo: interrupted while starting; stopped what had started"]
    finally:
        if demo.proc.poll() is None:
            demo.stop()


@pytest.mark.timeout(120)
def test_the_demo_with_three_replicas_answers_through_each(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "kasctl", "demo", "--replicas", "3", "--smoke",
                             "--dir", str(tmp_path / "demo")],
                            capture_output=True, text=True, timeout=110, cwd=REPO)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "redis-server, 3 kasd replicas and 2 agentd" in result.stdout
    for context in ("group/demo:demo ", "group/demo:demo@kasd-2", "group/demo:demo@kasd-3"):
        assert f"kubectl --context {context}" in result.stdout
    assert result.stdout.count("NAMESPACE") == 3  # `get pods -A` through each replica in turn
    assert result.stdout.rstrip().splitlines()[-1] == (
        "stopped: agentd-1 exit 0, agentd-2 exit 0, kasd-1 exit 0, kasd-2 exit 0, kasd-3 exit 0, "
        "kubesim exit 0, redis exit 0")


def test_replicas_must_be_a_small_positive_number(tmp_path: Path) -> None:
    result = run_module("kasctl", "demo", "--replicas", "0", "--dir", str(tmp_path), timeout=30, cwd=REPO)
    assert result.returncode == 2
    assert "--replicas: must be between 1 and 16, got 0" in result.stderr
