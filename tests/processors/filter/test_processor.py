"""The filter processor: include/exclude by name and attributes, strict and regexp."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gputally.otlp.batch import Batch, Signal
from gputally.otlp.census import census_logs, census_metrics, census_traces
from gputally.processors.filter import FilterConfig, FilterProcessor, factory
from tests.processors.builders import (
    all_kinds,
    attributes,
    context,
    log_records,
    logs_batch,
    metric,
    metric_names,
    metrics_batch,
    reencoded,
    resource_logs,
    resource_metrics,
    resource_spans,
    resources,
    spans,
    traces_batch,
)

TESTDATA = Path(__file__).parent / "testdata"
CENSUS = {Signal.METRICS: census_metrics, Signal.LOGS: census_logs, Signal.TRACES: census_traces}


def processor(signal: Signal, section: dict[str, Any]) -> FilterProcessor:
    created = factory.create(factory.parse(section), context("filter"), signal)
    assert isinstance(created, FilterProcessor)
    return created


async def run(signal: Signal, section: dict[str, Any], batch: Batch) -> Batch | None:
    out = await processor(signal, section).process(batch)
    if out is not None:
        assert out.items == CENSUS[signal](out.serialize()).items  # recounted
        out = reencoded(out)
    return out


def gpu_metrics() -> Batch:
    """Two resources (clusters a and b), each with gpu.util, gpu.mem and dcgm_power (2 points each)."""

    def entry(cluster: str) -> Any:
        names = ["gpu.util", "gpu.mem", "dcgm_power"]
        return resource_metrics({"cluster": cluster}, [metric("gauge", n, [{}, {}]) for n in names], scopes=2)

    return metrics_batch(entry("a"), entry("b"))


async def test_include_strict_names_keeps_only_those() -> None:
    out = await run(
        Signal.METRICS, {"metrics": {"include": {"match_type": "strict", "metric_names": ["gpu.util"]}}}, gpu_metrics()
    )
    assert out is not None
    assert metric_names(out) == ["gpu.util", "gpu.util"]
    assert out.items == 4


async def test_include_regexp_searches_anywhere_in_the_name() -> None:
    section = {"metrics": {"include": {"match_type": "regexp", "metric_names": ["util", "^dcgm_"]}}}
    out = await run(Signal.METRICS, section, gpu_metrics())
    assert out is not None
    assert sorted(metric_names(out)) == ["dcgm_power", "dcgm_power", "gpu.util", "gpu.util"]


@pytest.mark.parametrize(("match_type", "names"), [("strict", ["gpu.util", "gpu.mem"]), ("regexp", [r"^gpu\."])])
async def test_exclude_names(match_type: str, names: list[str]) -> None:
    out = await run(
        Signal.METRICS, {"metrics": {"exclude": {"match_type": match_type, "metric_names": names}}}, gpu_metrics()
    )
    assert out is not None
    assert metric_names(out) == ["dcgm_power", "dcgm_power"]
    assert out.items == 4


async def test_include_then_exclude() -> None:
    section = {
        "metrics": {
            "include": {"match_type": "regexp", "metric_names": [r"^gpu\."]},
            "exclude": {"match_type": "strict", "metric_names": ["gpu.mem"]},
        }
    }
    out = await run(Signal.METRICS, section, gpu_metrics())
    assert out is not None
    assert metric_names(out) == ["gpu.util", "gpu.util"]


async def test_include_by_resource_attribute_drops_other_resources_whole() -> None:
    section = {
        "metrics": {"include": {"match_type": "strict", "resource_attributes": [{"key": "cluster", "value": "b"}]}}
    }
    out = await run(Signal.METRICS, section, gpu_metrics())
    assert out is not None
    assert [attributes(r) for r in resources(out)] == [{"cluster": "b"}]
    assert out.items == 6


async def test_exclude_needs_name_and_resource_to_match() -> None:
    section = {
        "metrics": {
            "exclude": {
                "match_type": "regexp",
                "metric_names": ["mem"],
                "resource_attributes": [{"key": "cluster", "value": "^a$"}],
            }
        }
    }
    out = await run(Signal.METRICS, section, gpu_metrics())
    assert out is not None
    assert metric_names(out) == ["gpu.util", "dcgm_power", "gpu.util", "dcgm_power", "gpu.mem"]


async def test_exclude_by_resource_only_drops_those_resources() -> None:
    section = {
        "metrics": {"exclude": {"match_type": "strict", "resource_attributes": [{"key": "cluster", "value": "a"}]}}
    }
    out = await run(Signal.METRICS, section, gpu_metrics())
    assert out is not None
    assert [attributes(r) for r in resources(out)] == [{"cluster": "b"}]


async def test_all_data_kinds_are_counted_and_dropped() -> None:
    batch = metrics_batch(resource_metrics({}, all_kinds([{}, {}, {}], prefix="keep") + all_kinds([{}], prefix="drop")))
    section = {"metrics": {"exclude": {"match_type": "regexp", "metric_names": ["^drop"]}}}
    out = await run(Signal.METRICS, section, batch)
    assert out is not None
    assert out.items == 15
    assert all(name.startswith("keep") for name in metric_names(out))


async def test_emptied_scopes_and_resources_are_removed() -> None:
    batch = metrics_batch(
        resource_metrics({"r": 1}, [metric("gauge", "drop", [{}]), metric("gauge", "keep", [{}])], scopes=2),
        resource_metrics({"r": 2}, [metric("gauge", "drop", [{}])]),
    )
    out = await run(Signal.METRICS, {"metrics": {"exclude": {"match_type": "strict", "metric_names": ["drop"]}}}, batch)
    assert out is not None
    (entry,) = out.message.resource_metrics
    assert attributes(entry.resource) == {"r": 1}
    assert [s.scope.name for s in entry.scope_metrics] == ["scope1"]
    assert out.items == 1


@pytest.mark.parametrize("block", ["include", "exclude"])
async def test_nothing_left_is_none(block: str) -> None:
    names = ["nothing.matches"] if block == "include" else ["gpu.util", "gpu.mem", "dcgm_power"]
    assert (
        await run(Signal.METRICS, {"metrics": {block: {"match_type": "strict", "metric_names": names}}}, gpu_metrics())
        is None
    )


async def test_untouched_batch_keeps_its_received_bytes() -> None:
    batch = gpu_metrics()
    raw = batch.serialize()
    out = await processor(
        Signal.METRICS, {"metrics": {"exclude": {"match_type": "strict", "metric_names": ["other"]}}}
    ).process(batch)
    assert out is batch
    assert out.serialize() is raw
    assert out.items == 12


async def test_a_signal_without_a_section_passes() -> None:
    batch = gpu_metrics()
    raw = batch.serialize()
    out = await processor(
        Signal.METRICS, {"logs": {"exclude": {"match_type": "strict", "record_attributes": [{"key": "x"}]}}}
    ).process(batch)
    assert out is batch
    assert out.serialize() is raw


def logs() -> Batch:
    return logs_batch(
        resource_logs({"host": "n1"}, [{"level": "debug"}, {"code": 7.0}, {"level": "info", "code": 7}], scopes=2),
        resource_logs({"host": "n2"}, [{"level": "debug"}, {"level": "error", "code": "7"}]),
    )


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (
            {"exclude": {"match_type": "strict", "record_attributes": [{"key": "level", "value": "debug"}]}},
            [{"level": "info", "code": 7}, {"code": 7.0}, {"level": "error", "code": "7"}],
        ),
        (
            {"include": {"match_type": "regexp", "record_attributes": [{"key": "level", "value": "^(info|error)$"}]}},
            [{"level": "info", "code": 7}, {"level": "error", "code": "7"}],
        ),
        (
            {"include": {"match_type": "strict", "record_attributes": [{"key": "code", "value": 7}]}},
            [{"level": "info", "code": 7}],
        ),  # typed: 7.0 and "7" differ from 7
        ({"include": {"match_type": "strict", "record_attributes": [{"key": "code", "value": 7.0}]}}, [{"code": 7.0}]),
        (
            {"include": {"match_type": "regexp", "record_attributes": [{"key": "code", "value": "7"}]}},
            [{"level": "error", "code": "7"}],
        ),  # patterns apply to string values only
        (
            {"exclude": {"match_type": "strict", "record_attributes": [{"key": "code"}]}},
            [{"level": "debug"}, {"level": "debug"}],
        ),  # key only: any value
        (
            {
                "include": {
                    "match_type": "strict",
                    "resource_attributes": [{"key": "host", "value": "n2"}],
                    "record_attributes": [{"key": "level", "value": "debug"}],
                }
            },
            [{"level": "debug"}],
        ),
        (
            {"exclude": {"match_type": "regexp", "resource_attributes": [{"key": "host", "value": "1$"}]}},
            [{"level": "debug"}, {"level": "error", "code": "7"}],
        ),
        (
            {
                "include": {
                    "match_type": "strict",
                    "record_attributes": [{"key": "level", "value": "debug"}, {"key": "code"}],
                }
            },
            None,
        ),  # all listed attributes must match: none has both
    ],
)
async def test_logs(section: dict[str, Any], expected: list[dict[str, Any]] | None) -> None:
    out = await run(Signal.LOGS, {"logs": section}, logs())
    if expected is None:
        assert out is None
        return
    assert out is not None
    assert [attributes(r) for r in log_records(out)] == expected
    assert out.items == len(expected)


def traces() -> Batch:
    return traces_batch(
        resource_spans({"service.name": "trainer", "zone": "z1"}, [("step", {"gpu": 0}), ("load", {"gpu": 1})]),
        resource_spans({"service.name": "loader"}, [("step", {"gpu": 0}), ("fetch", {})]),
        resource_spans({"service.name": 5}, [("step", {})]),
    )


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"include": {"match_type": "strict", "services": ["trainer"]}}, ["step", "load"]),
        ({"include": {"match_type": "regexp", "services": ["^load"]}}, ["step", "fetch"]),
        ({"exclude": {"match_type": "strict", "span_names": ["step"]}}, ["load", "fetch"]),
        ({"exclude": {"match_type": "regexp", "span_names": ["^(st|lo)"]}}, ["fetch"]),
        ({"include": {"match_type": "strict", "attributes": [{"key": "gpu", "value": 0}]}}, ["step", "step"]),
        ({"exclude": {"match_type": "strict", "resources": [{"key": "zone"}]}}, ["step", "fetch", "step"]),
        (
            {"include": {"match_type": "strict", "services": ["trainer", "loader"], "span_names": ["step"]}},
            ["step", "step"],
        ),
    ],
)
async def test_spans(section: dict[str, Any], expected: list[str]) -> None:
    out = await run(Signal.TRACES, {"spans": section}, traces())
    assert out is not None
    assert [s.name for s in spans(out)] == expected
    assert out.items == len(expected)


# --- config ------------------------------------------------------------------------------


def test_config_from_yaml() -> None:
    config = factory.parse(yaml.safe_load((TESTDATA / "filter.yaml").read_text()))
    assert config.metrics.include is not None and config.metrics.include.metric_names == [r"^gpu\.", "^dcgm_"]
    assert config.metrics.exclude is not None and config.metrics.exclude.match_type == "strict"
    assert config.logs.exclude is not None and config.logs.exclude.record_attributes[0].value == "debug"
    assert config.spans.include is not None and config.spans.include.services == ["trainer"]


def test_config_typo_is_an_error_naming_the_key() -> None:
    with pytest.raises(ValidationError) as caught:
        factory.parse(yaml.safe_load((TESTDATA / "filter_typo.yaml").read_text()))
    assert ("metrics", "exclude", "metric_name") in {tuple(e["loc"]) for e in caught.value.errors()}


@pytest.mark.parametrize(
    ("section", "location", "message"),
    [
        (
            {"metrics": {"include": {"match_type": "regexp", "metric_names": ["ok", "gpu.(util"]}}},
            ("metrics", "include", "metric_names"),
            "invalid regular expression \\[1\\] 'gpu.\\(util'",
        ),
        (
            {"spans": {"exclude": {"match_type": "regexp", "services": ["["]}}},
            ("spans", "exclude", "services"),
            "invalid regular expression",
        ),
        (
            {"logs": {"include": {"match_type": "regexp", "record_attributes": [{"key": "a", "value": "*x"}]}}},
            ("logs", "include", "record_attributes"),
            "invalid regular expression",
        ),
        (
            {"logs": {"include": {"match_type": "regexp", "resource_attributes": [{"key": "a", "value": 3}]}}},
            ("logs", "include", "resource_attributes"),
            "values must be strings",
        ),
        (
            {"metrics": {"exclude": {"match_type": "strict"}}},
            ("metrics", "exclude"),
            "set at least one of metric_names, resource_attributes",
        ),
        (
            {"metrics": {"exclude": {"match_type": "expr", "metric_names": ["x"]}}},
            ("metrics", "exclude", "match_type"),
            "'strict' or 'regexp'",
        ),
        ({"metrics": {"exclude": {"metric_names": ["x"]}}}, ("metrics", "exclude", "match_type"), "Field required"),
        (
            {"logs": {"exclude": {"match_type": "strict", "record_attributes": [{"value": "x"}]}}},
            ("logs", "exclude", "record_attributes", 0, "key"),
            "Field required",
        ),
    ],
)
def test_invalid_config(section: dict[str, Any], location: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValidationError, match=message) as caught:
        FilterConfig.model_validate(section)
    assert location in {tuple(e["loc"]) for e in caught.value.errors()}


async def test_strict_names_are_not_patterns() -> None:
    """Not compiled (``gpu.(util`` is no valid pattern) and matched whole: ``.`` is a dot."""
    section = {"metrics": {"include": {"match_type": "strict", "metric_names": ["gpu.(util"]}}}
    assert FilterConfig.model_validate(section).metrics.include.metric_names == ["gpu.(util"]
    names = ["gpu.(util", "gpuX(util", "gpu.(utilization"]
    out = await run(Signal.METRICS, section, metrics_batch(resource_metrics({}, [metric("gauge", n, [{}]) for n in names])))
    assert out is not None and metric_names(out) == ["gpu.(util"]
