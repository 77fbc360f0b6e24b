"""Config validation against the real, installed component registry."""

from pathlib import Path

import pytest

from gputally.cli.serve import default_config_text
from gputally.errors import ConfigError
from gputally.otlp.batch import Signal
from gputally.pipeline.config import load_config, validate
from gputally.pipeline.registry import Registry

TESTDATA = Path(__file__).parent / "testdata"


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.discover()


def problems(name: str, registry: Registry, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(TESTDATA / name, registry=registry, environ=environ or {})
    return info.value.problems


def test_registry_finds_builtins_through_entry_points(registry: Registry) -> None:
    assert {"attributes", "filter", "batch", "memory_limiter"} <= set(registry.processors)
    assert {"otlp", "otlphttp", "debug"} <= set(registry.exporters)
    assert set(registry.receivers) == {"otlp", "bridge"}


def test_full_config_loads(registry: Registry) -> None:
    config = load_config(TESTDATA / "full.yaml", registry=registry, environ={"GPUTALLY_TEST_TOKEN": "s3cret"})
    assert set(config.service.pipelines) == {"metrics", "logs"}
    assert config.pipeline_signal("metrics") is Signal.METRICS
    assert config.exporters["otlp"].config.timeout == 10.0  # type: ignore[attr-defined]
    assert config.processors["batch"].config.timeout == 0.5  # type: ignore[attr-defined]
    assert config.extensions["bearertokenauth/in"].token == "s3cret"  # type: ignore[attr-defined]


def test_typo_names_the_key(registry: Registry) -> None:
    assert problems("typo.yaml", registry) == ["receivers.otlp.protocols.grpc.endpiont: unknown key"]


def test_dangling_references_are_all_reported(registry: Registry) -> None:
    found = problems("dangling.yaml", registry)
    assert "service.pipelines.metrics.processors[0]: processor 'batch/missing' is not defined under processors" in found
    assert "service.pipelines.metrics.exporters[1]: exporter 'otlp/nowhere' is not defined under exporters" in found
    assert "service.pipelines.tracez: pipeline type must be metrics, logs or traces, not 'tracez'" in found
    assert len(found) == 3


def test_bad_types_are_reported_with_paths(registry: Registry) -> None:
    found = problems("bad_types.yaml", registry)
    keys = sorted(line.split(":")[0] for line in found)
    assert keys == [
        "exporters.otlp.retry_on_failure.multiplier",
        "processors.batch.timeout",
        "receivers.otlp.protocols.http.max_request_body_size",
    ]


def test_unset_secret_is_an_error(registry: Registry) -> None:
    found = problems("full.yaml", registry, environ={})
    assert found == ["extensions.bearertokenauth/in.token: environment variable GPUTALLY_TEST_TOKEN is not set"]


def test_unknown_component_type_and_undefined_authenticator(registry: Registry) -> None:
    text = """
receivers:
  otlp:
    protocols:
      grpc:
        auth: {authenticator: bearertokenauth/nope}
exporters:
  kafka: {}
service:
  pipelines:
    metrics: {receivers: [otlp], exporters: [kafka]}
"""
    with pytest.raises(ConfigError) as info:
        load_config(text, registry=registry, environ={})
    assert any(p.startswith("exporters.kafka: unknown exporter type 'kafka'") for p in info.value.problems)
    assert (
        "receivers.otlp.protocols.grpc.auth.authenticator: extension 'bearertokenauth/nope' is not defined under extensions"
        in info.value.problems
    )


def test_missing_sections() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("receivers: {}\n", registry=Registry(), environ={})
    assert "exporters: Field required" in info.value.problems
    assert "service: Field required" in info.value.problems


def test_embedded_default_is_valid(registry: Registry) -> None:
    config = load_config(default_config_text(), registry=registry, environ={})
    assert set(config.service.pipelines) == {"metrics", "logs", "traces"}


def test_storage_beside_an_in_memory_queue_is_a_warning(registry: Registry) -> None:
    config = load_config(TESTDATA / "mixed_durability.yaml", registry=registry, environ={})
    assert config.warnings == (
        "exporters.otlp/memory.sending_queue.storage: not set, but otlp's metrics also go to otlp/disk, otlp/inline "
        "(on disk or sent inline): a crash loses what otlp/memory queued in memory after the sender was acknowledged",
    )


def test_the_shipped_configs_carry_no_durability_warning(registry: Registry) -> None:
    assert load_config(default_config_text(), registry=registry, environ={}).warnings == ()
    assert load_config(TESTDATA / "full.yaml", registry=registry, environ={"GPUTALLY_TEST_TOKEN": "x"}).warnings == ()


def test_storage_names_a_file_storage_extension(registry: Registry) -> None:
    """``storage`` keys name a file_storage extension; a path (the old spelling) is refused with
    the line that says the new one, and a name that is no file_storage extension is a fault."""
    document = {
        "extensions": {"file_storage/usage": {"directory": "/var/lib/gputally/usage"}, "bearertokenauth": {"token": "t"}},
        "receivers": {"otlp": {"protocols": {"grpc": None}}},
        "processors": {"usage": {"storage": "file_storage/usage"}},
        "exporters": {"otlp": {"sending_queue": {"storage": "file_storage/usage"}}},
        "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["usage"], "exporters": ["otlp"]}}},
    }
    config = validate(document, registry)
    assert config.processors["usage"].config.storage == "file_storage/usage"
    with pytest.raises(ConfigError) as caught:
        validate({**document, "processors": {"usage": {"storage": "/var/lib/gputally/usage"}},
                  "exporters": {"otlp": {"sending_queue": {"storage": "bearertokenauth"}}}}, registry)
    problems = "\n".join(caught.value.problems)
    assert ("processors.usage.storage: Value error, '/var/lib/gputally/usage' is a path, but storage now names a "
            "file_storage extension: define 'extensions: {file_storage: {directory: /var/lib/gputally/usage}}'") in problems
    assert ("exporters.otlp.sending_queue.storage: 'bearertokenauth' is not a file_storage extension defined "
            "under extensions") in problems
