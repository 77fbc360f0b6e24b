"""OTEL_EXPORTER_OTLP_* resolution, as the OpenTelemetry specification describes it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gputally.exporterhelper.otlpconfig import parse_headers
from gputally.exporters.otlp.config import OTLPGrpcConfig
from gputally.exporters.otlphttp.config import OTLPHttpConfig
from gputally.otlp.batch import Signal

M, L, T = Signal.METRICS, Signal.LOGS, Signal.TRACES
P = "OTEL_EXPORTER_OTLP_"


@pytest.mark.parametrize(
    ("section", "environ", "signal", "expected_url"),
    [
        ({}, {}, M, "http://localhost:4318/v1/metrics"),
        ({}, {}, T, "http://localhost:4318/v1/traces"),
        ({}, {f"{P}ENDPOINT": "https://otel.example:4318"}, L, "https://otel.example:4318/v1/logs"),
        ({}, {f"{P}ENDPOINT": "http://c:4318/base/"}, M, "http://c:4318/base/v1/metrics"),
        ({}, {f"{P}ENDPOINT": "http://c:4318/base"}, M, "http://c:4318/base/v1/metrics"),
        # Signal-specific is used as written, and only for its signal.
        ({}, {f"{P}ENDPOINT": "http://g:1", f"{P}METRICS_ENDPOINT": "http://m:2/custom"}, M, "http://m:2/custom"),
        ({}, {f"{P}ENDPOINT": "http://g:1", f"{P}METRICS_ENDPOINT": "http://m:2/custom"}, L, "http://g:1/v1/logs"),
        ({}, {f"{P}TRACES_ENDPOINT": "http://t:3"}, T, "http://t:3/"),
        # Empty counts as unset; an invalid URL is ignored.
        ({}, {f"{P}ENDPOINT": "", f"{P}METRICS_ENDPOINT": " "}, M, "http://localhost:4318/v1/metrics"),
        ({}, {f"{P}ENDPOINT": "not a url"}, M, "http://localhost:4318/v1/metrics"),
        # Config wins: its base URL beats even the signal-specific variable.
        ({"endpoint": "http://cfg:9"}, {f"{P}METRICS_ENDPOINT": "http://m:2/x"}, M, "http://cfg:9/v1/metrics"),
        ({"metrics_endpoint": "http://cfg:9/mine"}, {f"{P}ENDPOINT": "http://g:1"}, M, "http://cfg:9/mine"),
        ({"metrics_endpoint": "http://cfg:9/mine"}, {f"{P}ENDPOINT": "http://g:1"}, L, "http://g:1/v1/logs"),
    ],
)
def test_http_endpoint(section: dict[str, Any], environ: dict[str, str], signal: Signal, expected_url: str) -> None:
    target = OTLPHttpConfig.model_validate(section).targets(environ)[signal]
    assert target.endpoint == expected_url
    assert target.tls.insecure is expected_url.startswith("http://")


@pytest.mark.parametrize(
    ("section", "environ", "expected"),
    [
        ({}, {}, ("localhost:4317", True)),
        ({}, {f"{P}ENDPOINT": "https://otel.example:4317"}, ("otel.example:4317", False)),
        ({}, {f"{P}ENDPOINT": "http://otel.example:4317/ignored/path"}, ("otel.example:4317", True)),
        ({}, {f"{P}ENDPOINT": "otel.example:4317"}, ("otel.example:4317", False)),
        ({}, {f"{P}ENDPOINT": "otel.example:4317", f"{P}INSECURE": "TRUE"}, ("otel.example:4317", True)),
        ({}, {f"{P}ENDPOINT": "otel.example:4317", f"{P}INSECURE": "yes"}, ("otel.example:4317", False)),
        # The scheme beats the insecure flag, both ways.
        ({}, {f"{P}ENDPOINT": "https://a:1", f"{P}INSECURE": "true"}, ("a:1", False)),
        ({"endpoint": "http://a:1", "tls": {"insecure": False}}, {}, ("a:1", True)),
        ({}, {f"{P}ENDPOINT": "a:1", f"{P}METRICS_ENDPOINT": "http://m:2"}, ("m:2", True)),
        ({"endpoint": "cfg:5"}, {f"{P}ENDPOINT": "http://a:1"}, ("cfg:5", False)),
        ({"endpoint": "cfg:5", "tls": {"insecure": True}}, {}, ("cfg:5", True)),
        ({"tls": {"insecure": False}}, {f"{P}ENDPOINT": "a:1", f"{P}INSECURE": "true"}, ("a:1", False)),
    ],
)
def test_grpc_endpoint_and_insecure(
    section: dict[str, Any], environ: dict[str, str], expected: tuple[str, bool]
) -> None:
    target = OTLPGrpcConfig.model_validate(section).targets(environ)[M]
    assert (target.endpoint, target.tls.insecure) == expected


def test_signal_specific_grpc_endpoint_only_for_its_signal() -> None:
    targets = OTLPGrpcConfig().targets({f"{P}ENDPOINT": "http://g:1", f"{P}LOGS_ENDPOINT": "https://l:2"})
    assert {s: (t.endpoint, t.tls.insecure) for s, t in targets.items()} == {
        M: ("g:1", True), L: ("l:2", False), T: ("g:1", True),
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("a=b", {"a": "b"}),
        ("API-Key=s3cr%3Dt%2C1 , x-tenant = gpu%20team", {"api-key": "s3cr=t,1", "x-tenant": "gpu team"}),
        ("authorization=Bearer%20abc", {"authorization": "Bearer abc"}),
        ("novalue,=empty,ok=1,bad name=2", {"ok": "1"}),
        ("k=a=b", {"k": "a=b"}),
    ],
)
def test_parse_headers(text: str, expected: dict[str, str]) -> None:
    assert parse_headers(text) == expected


def test_headers_signal_specific_replaces_generic_and_config_wins_per_name() -> None:
    environ = {f"{P}HEADERS": "a=generic,b=generic", f"{P}TRACES_HEADERS": "a=traces"}
    targets = OTLPHttpConfig.model_validate({"headers": {"B": "config"}}).targets(environ)
    assert dict(targets[M].headers) == {"a": "generic", "b": "config"}
    assert dict(targets[T].headers) == {"a": "traces", "b": "config"}


@pytest.mark.parametrize(
    ("section", "environ", "expected"),
    [
        ({}, {}, 5.0),
        ({}, {f"{P}TIMEOUT": "2500"}, 2.5),
        ({}, {f"{P}TIMEOUT": "1000", f"{P}METRICS_TIMEOUT": "250"}, 0.25),
        ({}, {f"{P}TIMEOUT": "soon"}, 5.0),
        ({}, {f"{P}TIMEOUT": "-1"}, 5.0),
        ({}, {f"{P}TIMEOUT": "0"}, None),
        ({"timeout": "7s"}, {f"{P}TIMEOUT": "2500"}, 7.0),
        ({"timeout": 0}, {}, None),
    ],
)
def test_timeout_milliseconds(section: dict[str, Any], environ: dict[str, str], expected: float | None) -> None:
    assert OTLPGrpcConfig.model_validate(section).targets(environ)[M].timeout == expected


@pytest.mark.parametrize(
    ("section", "environ", "expected"),
    [
        ({}, {}, "gzip"),
        ({}, {f"{P}COMPRESSION": "none"}, "none"),
        ({}, {f"{P}COMPRESSION": "NONE", f"{P}METRICS_COMPRESSION": "gzip"}, "gzip"),
        ({}, {f"{P}COMPRESSION": "zstd"}, "gzip"),
        ({"compression": "gzip"}, {f"{P}COMPRESSION": "none"}, "gzip"),
        ({"compression": ""}, {}, "none"),
    ],
)
def test_compression(section: dict[str, Any], environ: dict[str, str], expected: str) -> None:
    assert OTLPHttpConfig.model_validate(section).targets(environ)[M].compression == expected


def test_certificates_from_environment_and_config_precedence(caplog: pytest.LogCaptureFixture) -> None:
    environ = {
        f"{P}CERTIFICATE": "/env/ca.pem",
        f"{P}CLIENT_CERTIFICATE": "/env/client.pem",
        f"{P}CLIENT_KEY": "/env/client.key",
        f"{P}METRICS_CERTIFICATE": "/env/metrics-ca.pem",
    }
    targets = OTLPGrpcConfig(endpoint="collector:4317").targets(environ)
    assert targets[L].tls.ca_file == Path("/env/ca.pem")
    assert targets[M].tls.ca_file == Path("/env/metrics-ca.pem")
    assert (targets[L].tls.cert_file, targets[L].tls.key_file) == (Path("/env/client.pem"), Path("/env/client.key"))

    section = {"endpoint": "collector:4317", "tls": {"ca_file": "/cfg/ca.pem"}}
    tls = OTLPGrpcConfig.model_validate(section).targets(environ)[L].tls
    assert tls.ca_file == Path("/cfg/ca.pem")
    assert tls.cert_file == Path("/env/client.pem")  # not written in config: the environment's

    with caplog.at_level(logging.WARNING):
        lone = OTLPGrpcConfig().targets({f"{P}CLIENT_KEY": "/env/client.key"})[M].tls
    assert lone.key_file is None and lone.cert_file is None
    assert "OTEL_EXPORTER_OTLP_CLIENT_KEY" in caplog.text


def test_each_bad_variable_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    environ = {f"{P}TIMEOUT": "soon", f"{P}HEADERS": "broken", f"{P}ENDPOINT": "nowhere"}
    with caplog.at_level(logging.WARNING):
        OTLPHttpConfig().targets(environ)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert any("OTEL_EXPORTER_OTLP_TIMEOUT='soon'" in m for m in messages)
