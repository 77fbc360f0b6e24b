"""Exporter config sections, factories, entry points and the public surface."""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

import gputally.exporters.debug as debug
import gputally.exporters.otlp as otlp_grpc
import gputally.exporters.otlphttp as otlp_http
from gputally.exporters.debug.config import DebugConfig
from gputally.exporters.otlp.config import OTLPGrpcConfig
from gputally.exporters.otlphttp.config import OTLPHttpConfig
from gputally.pipeline.component import ComponentContext, Exporter
from gputally.pipeline.factory import ExporterFactory

TESTDATA = Path(__file__).parent / "testdata"
FACTORIES: dict[str, ExporterFactory[Any]] = {"otlp": otlp_grpc.factory, "otlphttp": otlp_http.factory, "debug": debug.factory}


def load(name: str) -> Any:
    return yaml.safe_load((TESTDATA / name).read_text())



def test_entry_points_name_these_factories() -> None:
    found = {ep.name: ep.load() for ep in entry_points(group="gputally.exporters")}
    assert found == FACTORIES
    assert {name: f.type_name for name, f in FACTORIES.items()} == {n: n for n in FACTORIES}


def test_otlp_yaml_with_every_key() -> None:
    config = otlp_grpc.factory.parse(load("otlp.yaml"))
    assert isinstance(config, OTLPGrpcConfig)
    assert config.endpoint == "collector.monitoring:4317"
    assert config.tls.server_name_override == "collector.internal"
    assert (config.timeout, config.retry_on_failure.max_elapsed_time) == (2.0, 300.0)
    assert config.sending_queue.storage == "file_storage"
    assert config.auth is not None and config.auth.authenticator == "bearertokenauth/backend"


def test_otlphttp_yaml_with_every_key() -> None:
    config = otlp_http.factory.parse(load("otlphttp.yaml"))
    assert isinstance(config, OTLPHttpConfig)
    assert config.encoding == "json" and config.timeout == 0.5
    assert config.metrics_endpoint == "https://metrics.example.com/api/v1/otlp/v1/metrics"
    assert not config.sending_queue.enabled and not config.retry_on_failure.enabled


def test_debug_yaml() -> None:
    assert debug.factory.parse(load("debug.yaml")) == DebugConfig(verbosity="detailed")
    assert debug.factory.parse(None).verbosity == "basic"


def test_typos_and_bad_values_are_reported_with_their_paths() -> None:
    with pytest.raises(ValidationError) as error:
        otlp_grpc.factory.parse(load("otlp_typo.yaml"))
    paths = {".".join(str(p) for p in e["loc"]) for e in error.value.errors()}
    assert paths == {"retry_on_failure.initial_intreval", "sending_queue.queue_size"}


@pytest.mark.parametrize(
    ("factory", "section", "fault"),
    [
        (otlp_http.factory, {"endpoint": "collector:4318"}, "endpoint"),
        (otlp_http.factory, {"traces_endpoint": "ftp://x/v1/traces"}, "traces_endpoint"),
        (otlp_http.factory, {"encoding": "xml"}, "encoding"),
        (otlp_grpc.factory, {"endpoint": "  "}, "endpoint"),
        (otlp_grpc.factory, {"headers": {"bad header": "x"}}, "headers"),
        (otlp_grpc.factory, {"headers": {"x-ok": "line\nbreak"}}, "headers"),
        (otlp_grpc.factory, {"compression": "zstd"}, "compression"),
        (otlp_grpc.factory, {"timeout": "soon"}, "timeout"),
        (otlp_grpc.factory, {"tls": {"cert_file": "/c.pem"}}, "tls"),
        (debug.factory, {"verbosity": "loud"}, "verbosity"),
    ],
)
def test_invalid_values(factory: ExporterFactory[Any], section: dict[str, Any], fault: str) -> None:
    with pytest.raises(ValidationError) as error:
        factory.parse(section)
    assert error.value.errors()[0]["loc"][0] == fault


def test_parse_records_which_keys_were_written() -> None:
    # The environment fills only unwritten keys, so parsing must keep this information.
    config = otlp_grpc.factory.parse({"timeout": "5s", "tls": {"insecure": True}})
    assert config.model_fields_set == {"timeout", "tls"}
    assert config.tls.model_fields_set == {"insecure"}


@pytest.mark.parametrize("name", sorted(FACTORIES))
async def test_lifecycle_of_every_exporter(name: str, context, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in [v for v in os.environ if v.startswith("OTEL_EXPORTER_OTLP_")]:
        monkeypatch.delenv(variable)
    factory = FACTORIES[name]
    ctx: ComponentContext = context(name)

    never_started = factory.create(factory.parse({}), ctx)
    assert isinstance(never_started, Exporter)
    await never_started.shutdown()
    await never_started.shutdown()

    exporter = factory.create(factory.parse({}), ctx)
    await exporter.start()
    await exporter.shutdown()
    await exporter.shutdown()
