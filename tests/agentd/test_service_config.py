"""The ``services:`` section of agentd's file: its defaults, and errors that name the exact key
(``services[1].name``) and never quote a credential."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from agentd.config import ConfigError, load_config

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text("secret-agent-token\n")
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\n")
    (tmp_path / "prom-token").write_text("prom-secret-token\n")
    return tmp_path


def load(files: Path, services: str) -> object:
    config = files / "agentd.yaml"
    config.write_text(f"kas_address: http://kas:8150/tunnel\ntoken_file: {files / 'token'}\n"
                      f"kubeconfig: {files / 'kubeconfig'}\nservices:\n{services}")
    return load_config(["--config", str(config)], {})


def test_a_service_with_only_a_name_and_url_gets_the_defaults(files: Path) -> None:
    config = load(files, "  - name: prometheus\n    url: http://prometheus.monitoring.svc:9090\n")
    (service,) = config.services  # type: ignore[attr-defined]
    assert (service.name, service.url, service.methods, service.paths) == (
        "prometheus", "http://prometheus.monitoring.svc:9090", ("GET", "HEAD"), ("/",))
    assert (service.credentials_file, service.ca_file, service.response_header_timeout) == (None, None, 30.0)


def test_every_key_of_a_service(files: Path) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(files / "ca.pem"))
    config = load(files, f"""  - name: prometheus
    url: https://prometheus.monitoring.svc:9090/prom/
    methods: [GET, POST]
    paths: ["/api/v1/"]
    credentials_file: {files / 'prom-token'}
    ca_file: {files / 'ca.pem'}
    response_header_timeout: 5
""")
    (service,) = config.services  # type: ignore[attr-defined]
    assert (service.methods, service.paths, service.response_header_timeout) == (("GET", "POST"), ("/api/v1/",), 5.0)
    assert service.credentials_file == files / "prom-token" and service.ca_file == files / "ca.pem"
    assert "prom-secret-token" not in repr(config)


@pytest.mark.parametrize(("services", "message"), [
    ("  - name: a\n    url: http://x\n  - name: a\n    url: http://y\n",
     "services[1].name in {config}: duplicate name 'a' (services[0] has it too)"),
    ("  - url: http://x\n", "services[0].name in {config}: missing: every service needs a name"),
    ("  - name: a\n", "services[0].url in {config}: missing: every service needs a url"),
    ("  - name: Prom_1\n    url: http://x\n",
     "services[0].name in {config}: must be a DNS label (lower-case letters, digits and '-', at most 63), got 'Prom_1'"),
    ("  - name: a\n    url: ftp://x\n",
     "services[0].url in {config}: must be an http:// or https:// URL with a host, got 'ftp://x'"),
    ("  - name: a\n    url: http://user:hunter2@x\n",
     "services[0].url in {config}: 'http://…@x' holds user information; give a credentials_file instead"),
    ("  - name: a\n    url: http://x/?a=1\n",
     "services[0].url in {config}: 'http://x/?a=1' has a query or fragment; only a path may follow the host"),
    ("  - name: a\n    url: http://x\n    methods: [GET, delete]\n",
     "services[0].methods[1] in {config}: must be an upper-case HTTP method such as GET, got 'delete'"),
    ("  - name: a\n    url: http://x\n    methods: []\n",
     "services[0].methods in {config}: must not be empty (leave the key out for the default)"),
    ("  - name: a\n    url: http://x\n    paths: [/api/v1/, api]\n",
     "services[0].paths[1] in {config}: must be a path starting with / (no query, no percent-encoding), got 'api'"),
    ("  - name: a\n    url: http://x\n    paths: [/api/../admin]\n",
     "services[0].paths[0] in {config}: '/api/../admin': the path holds a dot segment (. or .., in any encoding)"),
    ("  - name: a\n    url: http://x\n    credentials_file: /nonexistent/token\n",
     "services[0].credentials_file in {config}: credentials file /nonexistent/token does not exist"),
    ("  - name: a\n    url: http://x\n    ca_file: {files}/prom-token\n",
     "services[0].ca_file in {config}: CA file {files}/prom-token holds no PEM certificate"),
    ("  - name: a\n    url: http://x\n    response_header_timeout: 0\n",
     "services[0].response_header_timeout in {config}: must be above 0 and at most 3600 seconds, got 0"),
    ("  - name: a\n    url: http://x\n    response_header_timeout: soon\n",
     "services[0].response_header_timeout in {config}: expected a number of seconds, got a string of 4 characters"),
    ("  a: 1\n", "services in {config}: must be a list, got a mapping"),
    ("  - name: a\n    url: http://x\n    path: [/api/v1/]\n",
     "config file {config}: unknown key(s) in services[0]: path; known keys: ca_file, credentials_file, methods, "
     "name, paths, response_header_timeout, url"),
])
def test_each_bad_service_setting_is_named(files: Path, services: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load(files, services.replace("{files}", str(files)))
    assert str(error.value) == message.format(config=files / "agentd.yaml", files=files)


def test_a_ca_file_needs_an_https_service_and_a_credentials_file_one_token(files: Path) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(files / "ca.pem"))
    with pytest.raises(ConfigError, match=r"^services\[0\]\.ca_file in .*: a CA file is for an https:// service"):
        load(files, f"  - name: a\n    url: http://x\n    ca_file: {files / 'ca.pem'}\n")
    (files / "prom-token").write_text("two tokens\nsecret-part\n")
    with pytest.raises(ConfigError) as error:
        load(files, f"  - name: a\n    url: http://x\n    credentials_file: {files / 'prom-token'}\n")
    assert str(error.value).endswith("holds more than one token (spaces, lines or control characters)")
    assert "secret-part" not in str(error.value)
