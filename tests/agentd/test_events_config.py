"""The ``events:`` section of agentd's file: read into settings, and every mistake named by its key
(without the secret)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentd.config import ConfigError, load_config
from agentd.events.settings import DEFAULT_RETRY_FOR

pytestmark = pytest.mark.timeout(20)

SECRET = "the-hmac-key-itself"


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text("secret-agent-token\n")
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\n")
    (tmp_path / "hook-secret").write_text(SECRET + "\n")
    return tmp_path


def load(files: Path, events: str) -> object:
    path = files / "agentd.yaml"
    path.write_text(f"kas_address: http://kas:8150/tunnel\ntoken_file: {files / 'token'}\n"
                    f"kubeconfig: {files / 'kubeconfig'}\nevents:\n{events}")
    return load_config(["--config", str(path)], {}).events


def test_the_contract_s_example_is_read(files: Path) -> None:
    events = load(files, f"""\
  retry_for: 12
  handlers:
    - type: push
      webhook:
        url: http://hooks.ci.svc:8080/gitlab?from=kasd
        secret_file: {files / 'hook-secret'}
    - type: "*"
      annotate:
        apiVersion: source.toolkit.fluxcd.io/v1
        kind: GitRepository
        namespace: flux-system
        match: url
""")
    assert events.retry_for == 12  # type: ignore[attr-defined]
    webhook, annotate = events.handlers  # type: ignore[attr-defined]
    assert webhook.type == "push" and webhook.webhook.url == "http://hooks.ci.svc:8080/gitlab?from=kasd"
    assert webhook.webhook.read_secret() == SECRET.encode()  # without the file's trailing newline
    assert annotate.type == "*" and annotate.annotate.match == "url" and annotate.annotate.name is None
    assert annotate.annotate.annotation == "reconcile.fluxcd.io/requestedAt"
    assert annotate.annotate.api_prefix == "/apis/source.toolkit.fluxcd.io/v1"
    assert SECRET not in repr(events)


def test_no_events_section_is_no_handlers(files: Path) -> None:
    events = load(files, "  handlers: []\n")
    assert events.handlers == () and events.retry_for == DEFAULT_RETRY_FOR  # type: ignore[attr-defined]


@pytest.mark.parametrize(("events", "message"), [
    ("  retry_for: 0\n", "events.retry_for in {file}: must be between 1 and 3600 seconds, got 0"),
    ("  retry_after: 3\n", "events in {file}: unknown key(s) retry_after; known keys: retry_for, handlers"),
    ("  handlers: {type: push}\n", "events.handlers in {file}: must be a list of handlers, got a mapping"),
    ("  handlers: [{type: Push, webhook: {}}]\n", "events.handlers[0].type in {file}: must be an event type"),
    ("  handlers: [{type: push}]\n",
     "events.handlers[0] in {file}: a handler needs exactly one of webhook and annotate, got neither"),
    ("  handlers: [{type: push, webhook: {url: 'http://a', secret_file: S}, annotate: {kind: X}}]\n",
     "events.handlers[0] in {file}: a handler needs exactly one of webhook and annotate, got webhook and annotate"),
    ("  handlers: [{type: push, webhook: {url: 'ftp://hooks/x', secret_file: S}}]\n",
     "events.handlers[0].webhook.url in {file}: must be an http:// or https:// URL with a host, got 'ftp://hooks/x'"),
    ("  handlers: [{type: push, webhook: {url: 'http://u:p@hooks/x', secret_file: S}}]\n",
     "events.handlers[0].webhook.url in {file}: must not hold user information"),
    ("  handlers: [{type: push, webhook: {url: 'http://hooks/x'}}]\n",
     "events.handlers[0].webhook.secret_file in {file}: missing: the file holding the HMAC-SHA256 key"),
    ("  handlers: [{type: push, webhook: {url: 'http://hooks/x', secret_file: /nonexistent/s}}]\n",
     "events.handlers[0].webhook.secret_file in {file}: secret file /nonexistent/s does not exist"),
    ("  handlers: [{type: push, annotate: {apiVersion: source.toolkit.fluxcd.io/v1, kind: GitRepository,"
     " namespace: flux-system}}]\n",
     "events.handlers[0].annotate in {file}: needs exactly one of name (one object) and match: url"),
    ("  handlers: [{type: push, annotate: {apiVersion: source.toolkit.fluxcd.io/v1, kind: GitRepository,"
     " namespace: flux-system, match: name}}]\n",
     "events.handlers[0].annotate.match in {file}: the only match is url"),
    ("  handlers: [{type: push, annotate: {apiVersion: fluxcd, kind: GitRepository, namespace: f, name: a}}]\n",
     "events.handlers[0].annotate.apiVersion in {file}: must be <group>/<version>"),
    ("  handlers: [{type: push, annotate: {apiVersion: v1, kind: ConfigMap, namespace: Flux, name: a}}]\n",
     "events.handlers[0].annotate.namespace in {file}: must be a namespace name"),
])
def test_a_mistake_is_named_by_its_key(files: Path, events: str, message: str) -> None:
    events = events.replace("secret_file: S", f"secret_file: {files / 'hook-secret'}")
    with pytest.raises(ConfigError) as error:
        load(files, events)
    assert str(error.value).startswith(message.format(file=files / "agentd.yaml")), str(error.value)
    assert SECRET not in str(error.value)


def test_an_empty_secret_file_is_refused(files: Path) -> None:
    (files / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=r"events.handlers\[0\].webhook.secret_file in .*: secret file .* is empty"):
        load(files, f"  handlers: [{{type: push, webhook: {{url: 'http://hooks/x', secret_file: {files / 'empty'}}}}}]\n")
