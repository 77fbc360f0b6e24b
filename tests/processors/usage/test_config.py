"""Config: defaults, the testdata file, a typo, bad values, and what the service says of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gputally.errors import ConfigError
from gputally.pipeline.config import load_config
from gputally.pipeline.registry import Registry
from gputally.processors.usage import UsageConfig, factory
from gputally.processors.usage.config import DEFAULT_OWNERS

TESTDATA = Path(__file__).parent / "testdata"


def test_defaults() -> None:
    config = factory.parse(None)
    assert config == UsageConfig() == factory.parse({})
    assert [rule.kind for rule in config.owners] == ["slurm.job", "k8s.pod"] == [r.kind for r in DEFAULT_OWNERS]
    assert (config.idle_below, config.idle_after, config.end_after, config.max_gap) == (0.05, 1800.0, 300.0, 120.0)
    assert config.storage is None and config.prices == [] and config.currency == "USD"


def test_testdata_file_loads_in_a_service() -> None:
    config = load_config((TESTDATA / "usage.yaml").read_text(), registry=Registry.discover(), environ={})
    usage = config.processors["usage"].config
    assert usage.idle_after == 1200 and usage.emit_interval == 30 and usage.currency == "EUR"
    assert [p.per_gpu_hour for p in usage.prices] == [3.5, 2.8]
    assert usage.owners[0].key == ["slurm.cluster.name", "slurm.job.id"]


def test_a_typo_names_its_key() -> None:
    section = yaml.safe_load((TESTDATA / "usage_typo.yaml").read_text())["processors"]["usage"]
    with pytest.raises(ValidationError) as caught:
        factory.parse(section)
    assert [(tuple(e["loc"]), e["type"]) for e in caught.value.errors()] == [(("idle_bellow",), "extra_forbidden")]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"idle_below": 1.5}, "less than or equal to 1"),
        ({"idle_after": "soon"}, "not a duration"),
        ({"prices": [{"model": "H100", "per_gpu_hour": -1}]}, "greater than or equal to 0"),
        ({"owners": [{"kind": "unallocated", "key": ["x"]}]}, "reserved"),
        ({"owners": [{"kind": "a", "key": ["x"]}, {"kind": "a", "key": ["y"]}]}, "distinct"),
        ({"owners": [{"kind": "a", "key": []}]}, "at least 1 item"),
        ({"max_owners": 0}, "greater than or equal to 1"),
    ],
)
def test_bad_values_are_refused(given: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        factory.parse(given)


def test_the_service_reports_a_typo_with_its_key_path() -> None:
    document = yaml.safe_load((TESTDATA / "usage.yaml").read_text())
    document["processors"]["usage"]["summary"] = {"low_utilisation": 0.2}
    with pytest.raises(ConfigError) as caught:
        load_config(yaml.safe_dump(document), registry=Registry.discover(), environ={})
    assert caught.value.problems == ["processors.usage.summary.low_utilisation: unknown key"]


def test_the_service_refuses_it_in_a_traces_pipeline() -> None:
    document = yaml.safe_load((TESTDATA / "usage.yaml").read_text())
    document["service"]["pipelines"]["traces"] = {"receivers": ["otlp"], "processors": ["usage"],
                                                  "exporters": ["debug"]}
    with pytest.raises(ConfigError) as caught:
        load_config(yaml.safe_dump(document), registry=Registry.discover(), environ={})
    assert caught.value.problems == ["service.pipelines.traces.processors[0]: 'usage' does not support traces pipelines"]
