"""``kasctl keys generate`` and ``kasctl token ci|pat`` as a user runs them: in a subprocess, token on
stdout and nothing else, every mistake one line on stderr with exit 2, nothing written half, no key
material printed — and what they mint is what kasd verifies."""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from kasctl.tokens import parse_ttl
from kasd.authz.jobtokens import TokenInvalid, verify_job_token, verify_personal_token
from kasd.authz.keys import KeySet, load_verification_key
from tests.forkrun import run_module

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
JOB = ["--project", "group/app", "--job-id", "42", "--pipeline-id", "7", "--user", "alice", "--ref", "feat-x"]


def kasctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "KASCTL_SIGNING_KEY_FILE"}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    environment.update(env or {})
    return run_module("kasctl", *args, timeout=30, env=environment, cwd=ROOT)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("keys")
    result = kasctl("keys", "generate", "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


def _keyset(keys: Path) -> KeySet:
    return KeySet.from_pem_files([keys / "jobtoken-signing.pub.pem"])


def _no_secrets(result: subprocess.CompletedProcess[str], keys: Path | None = None) -> None:
    text = result.stdout + result.stderr
    assert "PRIVATE KEY" not in text
    if keys is not None:
        body = "".join((keys / "jobtoken-signing.pem").read_text().splitlines()[1:-1])
        assert body not in text


def _refused(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], result.stderr
    _no_secrets(result)


# ------------------------------------------------------------------ keys generate


def test_keys_generate_writes_the_pair_and_prints_only_the_kid(tmp_path: Path) -> None:
    out = tmp_path / "new" / "keys"
    result = kasctl("keys", "generate", "--out", str(out))
    assert result.returncode == 0, result.stderr
    private, public = out / "jobtoken-signing.pem", out / "jobtoken-signing.pub.pem"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert result.stdout == load_verification_key(public).kid + "\n"
    assert str(private) in result.stderr
    _no_secrets(result, out)


def test_keys_generate_never_overwrites(keys: Path) -> None:
    before = (keys / "jobtoken-signing.pem").read_bytes()
    _refused(kasctl("keys", "generate", "--out", str(keys)), "already exists")
    assert (keys / "jobtoken-signing.pem").read_bytes() == before


# ------------------------------------------------------------------ token ci


def test_token_ci_prints_a_token_kasd_verifies(keys: Path) -> None:
    result = kasctl("token", "ci", "--key", str(keys / "jobtoken-signing.pem"), *JOB, "--tag", "--protected",
                    "--environment", "review/feat-x", "--environment-tier", "development",
                    "--project-id", "1234", "--ttl", "1h")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    token = result.stdout.removesuffix("\n")
    assert "\n" not in token and token.count(".") == 2
    claims = verify_job_token(token, _keyset(keys))
    assert (claims.project, claims.project_id, claims.job_id, claims.pipeline_id, claims.user) == (
        "group/app", 1234, 42, 7, "alice")
    assert (claims.ref, claims.ref_type, claims.protected) == ("feat-x", "tag", True)
    assert (claims.environment, claims.environment_tier) == ("review/feat-x", "development")
    assert claims.stamp is not None and claims.stamp.expires_at - claims.stamp.issued_at == 3600
    _no_secrets(result, keys)


def test_token_ci_takes_the_key_from_the_environment(keys: Path) -> None:
    result = kasctl("token", "ci", *JOB, "--ttl", "15m", "--audience", "kasd-eu", "--issuer", "ci.example",
                    env={"KASCTL_SIGNING_KEY_FILE": str(keys / "jobtoken-signing.pem")})
    assert result.returncode == 0, result.stderr
    claims = verify_job_token(result.stdout.strip(), _keyset(keys), audience="kasd-eu", issuer="ci.example")
    assert (claims.ref_type, claims.protected, claims.environment) == ("branch", False, None)
    with pytest.raises(TokenInvalid, match="wrong audience"):
        verify_job_token(result.stdout.strip(), _keyset(keys), issuer="ci.example")


@pytest.mark.parametrize(("ttl", "seconds"), [("30s", 30), ("15m", 900), ("1h", 3600), ("1d", 86400)])
def test_ttl_units(keys: Path, ttl: str, seconds: int) -> None:
    result = kasctl("token", "pat", "--key", str(keys / "jobtoken-signing.pem"), "--user", "alice", "--ttl", ttl)
    assert result.returncode == 0, result.stderr
    stamp = verify_personal_token(result.stdout.strip(), _keyset(keys)).stamp
    assert stamp is not None and stamp.expires_at - stamp.issued_at == seconds


@pytest.mark.parametrize("ttl", ["1w", "0s", "0d", "1.5h", "h", "-1h", "1 h", "401d", "", "3600"])
def test_a_bad_ttl_is_refused(keys: Path, ttl: str) -> None:
    _refused(kasctl("token", "ci", "--key", str(keys / "jobtoken-signing.pem"), *JOB, "--ttl", ttl), "--ttl")


def test_parse_ttl() -> None:
    assert parse_ttl("45s") == timedelta(seconds=45)
    assert parse_ttl("400d") == timedelta(days=400)
    with pytest.raises(argparse.ArgumentTypeError, match=r"e\.g\. 30s, 15m, 1h, 1d"):
        parse_ttl("1y")


def _bad_keys(tmp_path: Path) -> dict[str, Path]:
    ed = ed25519.Ed25519PrivateKey.generate()
    blobs = {
        "encrypted": ed.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.BestAvailableEncryption(b"pw")),
        "public": ed.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo),
        "ec": ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    }
    paths = {}
    for name, blob in blobs.items():
        paths[name] = tmp_path / f"{name}.pem"
        paths[name].write_bytes(blob)
    paths["missing"] = tmp_path / "missing.pem"
    paths["directory"] = tmp_path
    return paths


@pytest.mark.parametrize(("name", "message"), [
    ("encrypted", "encrypted"), ("public", "this is a public key; signing needs the private key"),
    ("ec", "holds an EC key"), ("missing", "cannot read the key file"), ("directory", "cannot read the key file"),
])
def test_an_unusable_key_is_refused(tmp_path: Path, name: str, message: str) -> None:
    path = _bad_keys(tmp_path)[name]
    for kind in (["ci", *JOB], ["pat", "--user", "alice"]):
        _refused(kasctl("token", *kind, "--key", str(path), "--ttl", "1h"), str(path), message)


def test_no_key_at_all_says_where_one_comes_from() -> None:
    _refused(kasctl("token", "ci", *JOB, "--ttl", "1h"), "--key FILE", "KASCTL_SIGNING_KEY_FILE")


@pytest.mark.parametrize(("extra", "message"), [
    (["--environment-tier", "development"], "--environment-tier needs --environment"),
    (["--environment", "review/x", "--environment-tier", "prod"], "--environment-tier"),
    (["--project-id", "0"], "--project-id"),
    # ids are what kasd and GitLab hold: ASCII digits, at most 2**63-1
    (["--job-id", "9" * 20], "--job-id: must be a positive whole number of at most 19 digits"),
    (["--pipeline-id", "\u00b2"], "--pipeline-id: must be a positive whole number of at most 19 digits"),
])
def test_bad_job_flags_are_refused(keys: Path, extra: list[str], message: str) -> None:
    _refused(kasctl("token", "ci", "--key", str(keys / "jobtoken-signing.pem"), *JOB, *extra, "--ttl", "1h"),
             message)


def test_a_bad_project_path_is_refused(keys: Path) -> None:
    args = ["--project", "app", "--job-id", "1", "--pipeline-id", "1", "--user", "a", "--ref", "main"]
    _refused(kasctl("token", "ci", "--key", str(keys / "jobtoken-signing.pem"), *args, "--ttl", "1h"),
             "group/app")


# ------------------------------------------------------------------ token pat


def test_token_pat_prints_the_token_and_its_id_apart(keys: Path) -> None:
    result = kasctl("token", "pat", "--key", str(keys / "jobtoken-signing.pem"), "--user", "alice", "--ttl", "1d")
    assert result.returncode == 0, result.stderr
    token = result.stdout.removesuffix("\n")
    claims = verify_personal_token(token, _keyset(keys))
    assert claims.user == "alice" and claims.stamp is not None
    assert claims.stamp.token_id in result.stderr and claims.stamp.token_id not in result.stdout
    with pytest.raises(TokenInvalid, match="not a job token"):
        verify_job_token(token, _keyset(keys))
    _no_secrets(result, keys)


def test_help_teaches_with_examples() -> None:
    for args in (["--help"], ["token", "ci", "--help"], ["token", "pat", "--help"], ["keys", "generate", "--help"]):
        result = kasctl(*args)
        assert result.returncode == 0, result.stderr
        assert "example" in result.stdout, args
    ci = kasctl("token", "ci", "--help").stdout
    assert "KASCTL_SIGNING_KEY_FILE" in ci and "ci:<agent id>:<job token>" in ci and "30s, 15m, 1h, 1d" in ci
