"""examples/ as an operator uses it: every documented token matches its digest, the two configs fit
together, and the systemd units start the daemons with arguments their own loaders accept.

The example files are loaded with kasd's and agentd's own configuration loaders; only paths that
exist only on a real host (TLS files, the token file, the CA) are pointed at temporary files.
"""

from __future__ import annotations

import re
import shlex
from datetime import timedelta
from pathlib import Path

import pytest
import trio
import trustme

from agentd.config import load_config as load_agentd_config
from kasd.agents import AgentAuthenticator
from kasd.authority import load_authorization
from kasd.authz.jobtokens import JobClaims, mint_job_token, mint_personal_token
from kasd.authz.keys import load_signing_key, write_key_pair
from kasd.authz.verdict import AccessDenied
from kasd.config import Config
from kasd.config import load_config as load_kasd_config
from kasd.tokens import hash_token

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DIGEST = re.compile(r"\b[0-9a-f]{64}\b")
#: how a comment names the token of the digest on the next line
DOCUMENTED = re.compile(r'#.*\bsha256 of the [\w ]*token "([^"]+)"')
#: how examples/agentd.yaml says what its token file holds
AGENTD_TOKEN = re.compile(r"printf %s (\S+) > /etc/agentd/token")


def _documented_digests(path: Path) -> list[tuple[str, str, str]]:
    """(token, digest, comment) for every sha256 digest in ``path``; fails for an undocumented one."""
    found = []
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines):
        for digest in DIGEST.findall(line):
            comment = lines[number - 1] if number else ""
            named = DOCUMENTED.search(comment)
            assert named, f"{path.name}:{number + 1}: digest {digest[:8]}… has no comment naming its token"
            found.append((named.group(1), digest, comment))
    return found


CA = trustme.CA()


def _kasd_example(tmp_path: Path) -> Config:
    text = (EXAMPLES / "kasd.yaml").read_text()
    cert = CA.issue_cert("kas.example.com")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    cert.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    for name in ("tls.crt", "tls.key"):
        text = text.replace(f"/etc/kasd/tls/{name}", str(tmp_path / name))
    if not (tmp_path / "keys" / "jobtoken-signing.pem").exists():
        write_key_pair(tmp_path / "keys")
    text = text.replace("/etc/kasd/keys/", f"{tmp_path / 'keys'}/")
    text = text.replace("/etc/kasd/config-projects", str(EXAMPLES / "config-projects"))
    (tmp_path / "kasd.yaml").write_text(text)
    return load_kasd_config(["--config", str(tmp_path / "kasd.yaml")], {})


def _agentd_token() -> str:
    found = AGENTD_TOKEN.search((EXAMPLES / "agentd.yaml").read_text())
    assert found, "examples/agentd.yaml does not say which token its token file holds"
    return found.group(1)


def _agentd_example(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of examples/agentd.yaml whose host-only files exist, and the environment of a pod."""
    (tmp_path / "token").write_text(_agentd_token() + "\n")
    CA.cert_pem.write_to_path(str(tmp_path / "kas-ca.pem"))
    text = (EXAMPLES / "agentd.yaml").read_text()
    text = text.replace("token_file: /etc/agentd/token", f"token_file: {tmp_path / 'token'}")
    text = text.replace("kas_ca_file: /etc/agentd/kas-ca.pem", f"kas_ca_file: {tmp_path / 'kas-ca.pem'}")
    (tmp_path / "webhook-secret").write_text("example-webhook-secret\n")
    text = text.replace("/etc/agentd/webhook-secret", str(tmp_path / "webhook-secret"))
    (tmp_path / "agentd.yaml").write_text(text)
    return tmp_path / "agentd.yaml", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}


@pytest.mark.parametrize("path", sorted(p for p in EXAMPLES.rglob("*") if p.is_file()), ids=lambda p: p.name)
def test_every_digest_in_examples_is_the_sha256_of_the_token_its_comment_names(path: Path) -> None:
    for token, digest, comment in _documented_digests(path):
        assert hash_token(token) == digest, f"{path.name}: {comment.strip()} — sha256({token!r}) is {hash_token(token)}"


def test_kasd_example_loads_and_accepts_the_tokens_it_documents(tmp_path: Path) -> None:
    config = _kasd_example(tmp_path)
    documented = _documented_digests(EXAMPLES / "kasd.yaml")
    assert [digest for _, digest, _ in documented] == [agent.token_sha256 for agent in config.agents]
    # The REST API listener is on, so `kasctl kubeconfig` (and env stop, token revoke) work with it.
    assert config.listeners.api.address is not None
    assert (config.listeners.api.address.port, config.listeners.api.tls is not None) == (8153, True)

    # The agent tokens authenticate as their agents, the way kasd's agent port checks them.
    authenticate = AgentAuthenticator(config.agents)
    for agent, (token, _, _) in zip(config.agents, documented, strict=True):
        assert trio.run(authenticate, token, {}) is agent


def test_the_example_agent_configs_decide_as_their_comments_say(tmp_path: Path) -> None:
    config = _kasd_example(tmp_path)
    snapshot = load_authorization(config, None).snapshot
    key = load_signing_key(tmp_path / "keys" / "jobtoken-signing.pem")
    now = 1_800_000_000.0
    ttl = timedelta(hours=1)

    def job(**claims: object) -> str:
        base: dict[str, object] = {"project": "group/app", "job_id": 7, "pipeline_id": 3, "user": "alice", "ref": "main"}
        return mint_job_token(key, JobClaims(**{**base, **claims}), ttl, now=now)  # type: ignore[arg-type]

    # prod: protected refs only, as the job, in namespace app
    verdict = snapshot.authorize("ci", job(protected=True), 1, now=now)
    assert verdict.access_as == "ci_job" and verdict.namespace == "app"
    assert verdict.impersonate is not None and verdict.impersonate.user == "gitlab:ci_job:7"
    with pytest.raises(AccessDenied, match="protected_branches_only"):
        snapshot.authorize("ci", job(protected=False), 1, now=now)
    # prod: alice, a developer of group/app, as herself
    user = snapshot.authorize("pat", mint_personal_token(key, "alice", ttl, now=now), 1, now=now)
    assert user.impersonate is not None and user.impersonate.user == "gitlab:user:alice"
    # staging: the rules
    with pytest.raises(AccessDenied, match="when: never"):
        snapshot.authorize("ci", job(ref="wip/x"), 2, now=now)
    review = snapshot.authorize("ci", job(ref="feat", environment="review/feat"), 2, now=now)
    assert review.namespace == "review-review-feat-fo7aip"  # GitLab suffixes a slug that differs from its name
    assert snapshot.authorize("ci", job(ref="feat"), 2, now=now).namespace == "app-staging"
    assert snapshot.warnings == ()


def test_agentd_example_is_an_agent_of_the_kasd_example(tmp_path: Path) -> None:
    kasd = _kasd_example(tmp_path)
    config_file, environ = _agentd_example(tmp_path)
    agentd = load_agentd_config(["--config", str(config_file)], environ)
    token = agentd.token_file.read_text().strip()  # as agentd reads it at every dial
    agent = trio.run(AgentAuthenticator(kasd.agents), token, {})
    assert agent is not None, "kasd's example does not know agentd's example token"
    # kasd rejects a HELLO whose agent_id names another agent (hello-contradicts-token).
    assert agentd.agent_id in ("", str(agent.id)), (agentd.agent_id, agent.id)
    assert agentd.agent_id == "1" and agent.name == "prod"


def _exec_start(unit: str) -> list[str]:
    lines = (EXAMPLES / unit).read_text().splitlines()
    (line,) = [line for line in lines if line.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def test_agentd_unit_hands_the_secrets_over_as_credentials_agentd_can_read(tmp_path: Path) -> None:
    unit = (EXAMPLES / "agentd.service").read_text()
    assert "DynamicUser=yes" in unit and "ConfigurationDirectory=" not in unit
    credentials = dict(
        line.removeprefix("LoadCredential=").split(":", 1) for line in unit.splitlines() if line.startswith("LoadCredential=")
    )
    assert credentials == {"token": "/etc/agentd/token", "kubeconfig": "/etc/agentd/kubeconfig"}
    # systemd puts the copies in $CREDENTIALS_DIRECTORY, which %d names in ExecStart.
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "token").write_text(_agentd_token())
    (creds / "kubeconfig").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://10.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    config_file, _ = _agentd_example(tmp_path)
    argv = _exec_start("agentd.service")
    assert argv[0] == "/usr/local/bin/agentd"
    argv = [arg.replace("%d", str(creds)).replace("/etc/agentd/agentd.yaml", str(config_file)) for arg in argv[1:]]
    config = load_agentd_config(argv, {})  # outside a pod: the unit's kubeconfig is the way in
    assert config.token_file == creds / "token" and config.kubeconfig == creds / "kubeconfig"
    assert not config.in_cluster
    assert "Documentation=" not in unit


def test_kasd_unit_runs_as_a_user_the_examples_create(tmp_path: Path) -> None:
    unit = (EXAMPLES / "kasd.service").read_text()
    assert "User=kasd" in unit.splitlines() and "Group=kasd" in unit.splitlines()
    sysusers = [line.split() for line in (EXAMPLES / "kasd.sysusers.conf").read_text().splitlines()
                if line.strip() and not line.startswith("#")]  # fmt: skip
    assert [line[:2] for line in sysusers] == [["u", "kasd"]]  # `u` makes the user and its group
    argv = _exec_start("kasd.service")
    assert argv[:2] == ["/usr/local/bin/kasd", "--config"] and argv[2] == "/etc/kasd/kasd.yaml"
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit.splitlines()  # SIGHUP reloads authorization
    assert "Documentation=" not in unit
