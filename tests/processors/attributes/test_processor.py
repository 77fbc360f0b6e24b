"""The attributes processor: every action, both contexts, every signal and data kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gputally.otlp.batch import Batch, Signal
from gputally.processors.attributes import ActionConfig, AttributesConfig, AttributesProcessor, factory
from tests.processors.builders import (
    METRIC_KINDS,
    all_kinds,
    attributes,
    context,
    data_points,
    items,
    logs_batch,
    metric,
    metrics_batch,
    reencoded,
    resource_logs,
    resource_metrics,
    resource_spans,
    resources,
    traces_batch,
)

TESTDATA = Path(__file__).parent / "testdata"


def processor(signal: Signal, *actions: dict[str, Any]) -> AttributesProcessor:
    created = factory.create(factory.parse({"actions": list(actions)}), context("attributes"), signal)
    assert isinstance(created, AttributesProcessor)
    return created


def batch_with_items(signal: Signal, per_resource: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> Batch:
    """A batch of ``signal`` with, per resource, its attributes and its items' attributes."""
    if signal is Signal.METRICS:
        return metrics_batch(*(resource_metrics(r, [metric("gauge", "g", points)]) for r, points in per_resource))
    if signal is Signal.LOGS:
        return logs_batch(*(resource_logs(r, records) for r, records in per_resource))
    return traces_batch(*(resource_spans(r, [("span", a) for a in attrs]) for r, attrs in per_resource))


async def run(proc: AttributesProcessor, batch: Batch) -> Batch:
    out = await proc.process(batch)
    assert out is batch
    return reencoded(out)


EXPECTED: dict[str, list[dict[str, Any]]] = {
    "insert": [{"k": "old", "other": 1}, {"other": 2, "k": "new"}],
    "update": [{"k": "new", "other": 1}, {"other": 2}],
    "upsert": [{"k": "new", "other": 1}, {"other": 2, "k": "new"}],
    "delete": [{"other": 1}, {"other": 2}],
}
BEFORE: list[dict[str, Any]] = [{"k": "old", "other": 1}, {"other": 2}]


def action(kind: str, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"key": "k", "action": kind, **extra}
    if kind != "delete" and "from_attribute" not in extra:
        spec["value"] = "new"
    return spec


@pytest.mark.parametrize("kind", EXPECTED)
@pytest.mark.parametrize("data", METRIC_KINDS)
async def test_point_actions_on_every_metric_data_kind(kind: str, data: str) -> None:
    batch = metrics_batch(resource_metrics({"host.name": "n1"}, [metric(data, "x", BEFORE)]))
    out = await run(processor(Signal.METRICS, action(kind)), batch)
    assert [attributes(p) for p in data_points(out)] == EXPECTED[kind]
    assert [attributes(r) for r in resources(out)] == [{"host.name": "n1"}]
    assert out.items == 2


async def test_all_data_kinds_in_one_request_are_changed() -> None:
    batch = metrics_batch(resource_metrics({}, all_kinds(BEFORE), scopes=2))
    out = await run(processor(Signal.METRICS, action("upsert")), batch)
    assert [attributes(p) for p in data_points(out)] == EXPECTED["upsert"] * len(METRIC_KINDS)


@pytest.mark.parametrize("kind", EXPECTED)
@pytest.mark.parametrize("signal", [Signal.LOGS, Signal.TRACES])
async def test_point_actions_on_log_records_and_spans(kind: str, signal: Signal) -> None:
    batch = batch_with_items(signal, [({"host.name": "n1"}, BEFORE)])
    out = await run(processor(signal, action(kind)), batch)
    assert [attributes(i) for i in items(out)] == EXPECTED[kind]
    assert [attributes(r) for r in resources(out)] == [{"host.name": "n1"}]


@pytest.mark.parametrize("kind", EXPECTED)
@pytest.mark.parametrize("signal", list(Signal))
async def test_resource_actions(kind: str, signal: Signal) -> None:
    batch = batch_with_items(signal, [(BEFORE[0], [{"p": 1}]), (BEFORE[1], [{"p": 2}])])
    out = await run(processor(signal, action(kind, context="resource")), batch)
    assert [attributes(r) for r in resources(out)] == EXPECTED[kind]
    assert [attributes(i) for i in items(out)] == [{"p": 1}, {"p": 2}]


@pytest.mark.parametrize("signal", list(Signal))
@pytest.mark.parametrize("context_name", ["point", "resource"])
async def test_insert_where_no_item_has_the_key(signal: Signal, context_name: str) -> None:
    batch = batch_with_items(signal, [({"r": 1}, [{"a": 1}, {}]), ({}, [{"b": True}])])
    out = await run(processor(signal, action("insert", context=context_name)), batch)
    changed = resources(out) if context_name == "resource" else list(items(out))
    assert all(attributes(x)["k"] == "new" for x in changed)
    assert len(changed) == (2 if context_name == "resource" else 3)


@pytest.mark.parametrize("kind", ["update", "delete"])
@pytest.mark.parametrize("context_name", ["point", "resource"])
async def test_nothing_to_change_keeps_the_received_bytes(kind: str, context_name: str) -> None:
    batch = batch_with_items(Signal.METRICS, [({"r": 1}, [{"a": 1}])])
    raw = batch.serialize()
    out = await processor(Signal.METRICS, action(kind, context=context_name)).process(batch)
    assert out is batch
    assert out.serialize() is raw  # not re-encoded: nothing was touched


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("text", "string_value"),
        (7, "int_value"),
        (-(2**63), "int_value"),
        (2.5, "double_value"),
        (True, "bool_value"),
        (False, "bool_value"),
        (0, "int_value"),
        ("", "string_value"),
    ],
)
@pytest.mark.parametrize("context_name", ["point", "resource"])
async def test_value_types_map_to_any_value_kinds(value: Any, kind: str, context_name: str) -> None:
    batch = batch_with_items(Signal.LOGS, [({}, [{}])])
    proc = processor(Signal.LOGS, {"key": "v", "value": value, "action": "upsert", "context": context_name})
    out = await run(proc, batch)
    holder = resources(out)[0] if context_name == "resource" else next(items(out))
    (kv,) = holder.attributes
    assert kv.key == "v"
    assert kv.value.WhichOneof("value") == kind
    assert getattr(kv.value, kind) == value


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("insert", [{"src": [1, 2], "k": [1, 2]}, {"src": "s", "k": "old"}, {"other": 1}]),
        ("update", [{"src": [1, 2]}, {"src": "s", "k": "s"}, {"other": 1}]),
        ("upsert", [{"src": [1, 2], "k": [1, 2]}, {"src": "s", "k": "s"}, {"other": 1}]),
    ],
)
@pytest.mark.parametrize("signal", list(Signal))
async def test_from_attribute(kind: str, expected: list[dict[str, Any]], signal: Signal) -> None:
    before: list[dict[str, Any]] = [{"src": [1, 2]}, {"src": "s", "k": "old"}, {"other": 1}]
    out = await run(processor(signal, action(kind, from_attribute="src")), batch_with_items(signal, [({}, before)]))
    assert [attributes(i) for i in items(out)] == expected


async def test_from_attribute_on_resources() -> None:
    batch = batch_with_items(Signal.METRICS, [({"host.name": "n1"}, [{}]), ({}, [{}])])
    proc = processor(
        Signal.METRICS, {"key": "node", "from_attribute": "host.name", "action": "upsert", "context": "resource"}
    )
    out = await run(proc, batch)
    assert [attributes(r) for r in resources(out)] == [{"host.name": "n1", "node": "n1"}, {}]


async def test_from_an_attribute_absent_everywhere_changes_nothing() -> None:
    batch = batch_with_items(Signal.TRACES, [({}, [{"a": 1}])])
    raw = batch.serialize()
    await processor(Signal.TRACES, action("upsert", from_attribute="missing")).process(batch)
    assert batch.serialize() is raw


async def test_actions_run_in_order_and_see_each_others_results() -> None:
    proc = processor(
        Signal.METRICS,
        {"key": "a", "value": 1, "action": "insert"},
        {"key": "a", "value": 2, "action": "update"},
        {"key": "b", "from_attribute": "a", "action": "insert"},
        {"key": "c", "value": "x", "action": "upsert"},
        {"key": "c", "value": "y", "action": "upsert"},
        {"key": "d", "value": 1, "action": "insert"},
        {"key": "d", "action": "delete"},
        {"key": "e", "action": "delete"},
        {"key": "e", "value": "z", "action": "insert"},
    )
    out = await run(proc, metrics_batch(resource_metrics({}, all_kinds([{}, {"a": 0, "e": "old"}]))))
    expected = [{"a": 2, "b": 2, "c": "y", "e": "z"}, {"a": 2, "e": "z", "b": 2, "c": "y"}]
    assert [attributes(p) for p in data_points(out)] == expected * len(METRIC_KINDS)


async def test_a_copy_that_only_some_items_get_leaves_the_key_unknown_to_later_actions() -> None:
    proc = processor(
        Signal.LOGS,
        {"key": "k", "from_attribute": "src", "action": "insert"},
        {"key": "k", "value": "fallback", "action": "insert"},
    )
    out = await run(proc, batch_with_items(Signal.LOGS, [({}, [{"src": "s"}, {}])]))
    assert [attributes(i) for i in items(out)] == [{"src": "s", "k": "s"}, {"k": "fallback"}]


async def test_a_value_that_looks_like_the_key_does_not_fool_the_fast_path() -> None:
    # The key's bytes occur (as a string value and a metric name), yet no point has the key.
    batch = metrics_batch(resource_metrics({"r": "k"}, [metric("sum", "k", [{"other": "k"}, {"k": "here"}])]))
    out = await run(processor(Signal.METRICS, action("insert")), batch)
    assert [attributes(p) for p in data_points(out)] == [{"other": "k", "k": "new"}, {"k": "here"}]


async def test_metrics_without_data_are_left_alone() -> None:
    from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric

    batch = metrics_batch(resource_metrics({}, [Metric(name="empty"), metric("gauge", "g", [{}])]))
    out = await run(processor(Signal.METRICS, action("upsert")), batch)
    assert [attributes(p) for p in data_points(out)] == [{"k": "new"}]


# --- a reference model, checked on random requests and action lists ----------------------

KEYS = ["a", "b", "k"]
VALUES = st.one_of(st.sampled_from(["a", "k", "v"]), st.integers(-3, 3), st.booleans())
ATTRS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=3)


@st.composite
def action_specs(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["insert", "update", "upsert", "delete"]))
    spec: dict[str, Any] = {"key": draw(st.sampled_from(KEYS)), "action": kind}
    spec["context"] = draw(st.sampled_from(["point", "resource"]))
    if kind != "delete":
        if draw(st.booleans()):
            spec["from_attribute"] = draw(st.sampled_from(KEYS))
        else:
            spec["value"] = draw(VALUES)
    return spec


def model(attrs: dict[str, Any], specs: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(attrs)
    for spec in specs:
        key, kind = spec["key"], spec["action"]
        if kind == "delete":
            out.pop(key, None)
            continue
        if "from_attribute" in spec:
            if spec["from_attribute"] not in out:
                continue
            value = out[spec["from_attribute"]]
        else:
            value = spec["value"]
        if kind == "upsert" or (kind == "insert") == (key not in out):
            out[key] = value
    return out


@settings(max_examples=200, deadline=None)
@given(
    signal=st.sampled_from(list(Signal)),
    request=st.lists(st.tuples(ATTRS, st.lists(ATTRS, max_size=3)), min_size=1, max_size=3),
    specs=st.lists(action_specs(), min_size=1, max_size=5),
)
async def test_matches_a_reference_model(
    signal: Signal, request: list[tuple[dict[str, Any], list[dict[str, Any]]]], specs: list[dict[str, Any]]
) -> None:
    out = await run(processor(signal, *specs), batch_with_items(signal, request))
    point_specs = [s for s in specs if s["context"] == "point"]
    resource_specs = [s for s in specs if s["context"] == "resource"]
    assert [attributes(r) for r in resources(out)] == [model(r, resource_specs) for r, _ in request]
    assert [attributes(i) for i in items(out)] == [model(i, point_specs) for _, its in request for i in its]


# --- config ------------------------------------------------------------------------------


def test_config_from_yaml() -> None:
    config = factory.parse(yaml.safe_load((TESTDATA / "attributes.yaml").read_text()))
    assert [(a.key, a.action, a.context) for a in config.actions] == [
        ("k8s.cluster.name", "upsert", "resource"),
        ("gpu.model", "insert", "point"),
        ("internal.debug", "delete", "point"),
    ]
    assert config.actions[1].from_attribute == "hw.model"


def test_config_typo_is_an_error_naming_the_key() -> None:
    with pytest.raises(ValidationError) as caught:
        factory.parse(yaml.safe_load((TESTDATA / "attributes_typo.yaml").read_text()))
    locations = {tuple(e["loc"]) for e in caught.value.errors()}
    assert ("actions", 0, "from_atribute") in locations


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"key": "k", "action": "insert"}, "needs exactly one of 'value' and 'from_attribute'"),
        ({"key": "k", "action": "upsert", "value": 1, "from_attribute": "x"}, "(both are set)"),
        ({"key": "k", "action": "delete", "value": 1}, "'delete' takes neither"),
        ({"key": "k", "action": "delete", "from_attribute": "x"}, "'delete' takes neither"),
        ({"key": "", "action": "delete"}, "at least 1 character"),
        ({"key": "k", "action": "rename", "value": 1}, "'insert', 'update', 'upsert' or 'delete'"),
        ({"key": "k", "action": "insert", "value": 1, "context": "scope"}, "'point' or 'resource'"),
        ({"key": "k", "action": "insert", "value": 2**63}, "signed 64-bit"),
        ({"key": "k", "action": "insert", "value": [1]}, "valid string"),
        ({"key": "k", "action": "insert", "value": None}, "needs exactly one"),
    ],
)
def test_invalid_actions(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ActionConfig.model_validate(spec)


@pytest.mark.parametrize("section", [None, {}, {"actions": []}])
def test_actions_are_required(section: Any) -> None:
    with pytest.raises(ValidationError, match="actions"):
        factory.parse(section)


def test_value_types_survive_validation() -> None:
    config = AttributesConfig.model_validate(
        {"actions": [{"key": "k", "action": "insert", "value": v} for v in ("1", 1, 1.0, True)]}
    )
    assert [type(a.value) for a in config.actions] == [str, int, float, bool]
