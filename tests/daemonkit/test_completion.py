"""Shell completion of kasd, agentd and kasctl: each prints a bash script (``PROG completion bash``),
and a real bash that sources it completes subcommands, flags and file names, as a user's TAB would."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import agentd.__main__
import kasctl.__main__
import kasd.__main__

pytestmark = pytest.mark.timeout(30)

#: asks the completion function the shell registered for COMP_WORDS, as bash does on TAB, and
#: prints each candidate on a line of its own, then a line "--" after each question
ASK = r"""
ask() {
    COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
    local fn; fn=$(complete -p "$1" | sed -E 's/.*-F ([^ ]+).*/\1/')
    "$fn" "$1" "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}"
    printf '%s\n' "${COMPREPLY[@]}"; echo --
}
"""


def _answers(main: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str], tmp_path: Path,
             questions: list[str]) -> list[set[str]]:
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "completion.bash"
    script.write_text(capsys.readouterr().out)
    lines = "\n".join(f"ask {q}" for q in questions)
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", f"source {script}\n{ASK}\n{lines}"],
                          capture_output=True, text=True, timeout=20, check=True)
    answers: list[set[str]] = [set()]
    for line in done.stdout.splitlines():
        if line == "--":
            answers.append(set())
        elif line:
            answers[-1].add(line)
    return answers[:-1]


def test_kasctl_completes_commands_flags_and_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "key.pem").touch()
    command, flag, file, shell, nested = _answers(kasctl.__main__.main, capsys, tmp_path, [
        "kasctl to", "kasctl token ci --pro", f"kasctl token ci --key {tmp_path}/ke", "kasctl completion ''",
        "kasctl token ''",
    ])
    assert command == {"token"}
    assert {"--project", "--project-id"} <= flag and all(f.startswith("--pro") for f in flag)
    assert file == {f"{tmp_path}/key.pem"}
    assert shell == {"bash", "zsh", "fish", "tcsh"}
    assert nested == {"ci", "pat", "revoke"}


def test_kasd_completes_its_commands_and_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "kasd.yaml").touch()
    command, flag, serve_flag, file = _answers(kasd.__main__.main, capsys, tmp_path, [
        "kasd ha", "kasd --peer-", "kasd serve --shut", f"kasd --config {tmp_path}/k",
    ])
    assert command == {"hash-token"}
    assert flag == {"--peer-ca-file", "--peer-secret-file"}
    assert serve_flag == {"--shutdown-timeout"}
    assert file == {f"{tmp_path}/kasd.yaml"}


def test_agentd_completes_its_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "token").touch()
    flag, file, command = _answers(agentd.__main__.main, capsys, tmp_path, [
        "agentd --kas-", f"agentd --token-file {tmp_path}/t", "agentd comp",
    ])
    assert flag == {"--kas-address", "--kas-ca-file", "--kas-ca-reload-interval"}
    assert file == {f"{tmp_path}/token"}
    assert command == {"completion"}


def test_an_unknown_shell_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        kasd.__main__.main(["completion", "powershell"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage: kasd completion" in err and "invalid choice: 'powershell'" in err
