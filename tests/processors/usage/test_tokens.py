"""Tokens per (owner, served model, engine), from the engines' cumulative counters: input and
output apart, engine restarts (a new start time, a lower value) losing and doubling nothing,
duplicates and late requests changing nothing, and the counters kept across a restart."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from prometheus_client import CollectorRegistry

from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext
from gputally.processors.usage.processor import UsageCollector
import gputally.processors.usage as usage
from gputally.telemetry import SelfTelemetry
from tests.processors.usage.engines import Engine, engine_request, tokens_of
from tests.processors.usage.helpers import FakeClock, emitted, runtime

S = 10**9
POD_A = {"process.pid": 4100, "k8s.pod.uid": "uid-a", "k8s.namespace.name": "llm", "k8s.pod.name": "vllm-0",
         "server.port": 8000, "host.name": "gpu-node-1", "gputally.inference.gpu.ids": ["GPU-a"],
         "gputally.inference.gpu.pids": [4101], "process.linux.cgroup": "/kubepods/poduid-a/c1"}
POD_B = {"process.pid": 4200, "k8s.pod.uid": "uid-b", "k8s.namespace.name": "llm", "k8s.pod.name": "llama-0",
         "server.port": 8080, "host.name": "gpu-node-1", "process.linux.cgroup": "/kubepods/poduid-b/c1"}


def engines(clock: FakeClock) -> list[Engine]:
    """Three endpoints started a second after gputally: vLLM serving two models in pod A, llama.cpp
    in pod B, and an SGLang in pod A as well."""
    start = clock.wall + S
    return [Engine("vllm", POD_A, start), Engine("llamacpp", POD_B, start),
            Engine("sglang", {**POD_A, "server.port": 30000}, start)]


def run(rt: Any, clock: FakeClock, served: list[Engine], cycles: int, *, step: int = 10) -> list[bytes]:
    """``cycles`` engine requests 10 s apart, each after every engine served some tokens; the
    requests as sent."""
    sent = []
    for n in range(cycles):
        for i, engine in enumerate(served):
            for model in (("llama", "llama-lora") if engine.name == "vllm" else ("tiny",)):
                for token_type, per in (("input", 100 + i), ("output", 7 + n)):
                    key = (model, token_type)
                    engine.tokens[key] = engine.tokens.get(key, 0) + per * (n + 1)
        time_ns = clock.wall + (n + 2) * step * S
        raw = engine_request(served, time_ns).SerializeToString()
        rt.observe(raw)
        sent.append(raw)
    return sent


def want(served: list[Engine], owner_of: dict[str, str]) -> dict[tuple[str, str, str, str], float]:
    out: dict[tuple[str, str, str, str], float] = {}
    for engine in served:
        for (model, token_type), value in engine.tokens.items():
            key = (owner_of[engine.name], model, engine.name, token_type)
            out[key] = out.get(key, 0.0) + value
    return out


OWNER_OF = {"vllm": "uid-a", "llamacpp": "uid-b", "sglang": "uid-a"}


def test_tokens_are_booked_per_owner_model_and_engine() -> None:
    clock = FakeClock()
    rt = runtime(clock)
    served = engines(clock)
    run(rt, clock, served, 5)
    request = emitted(rt)
    assert tokens_of(request) == want(served, OWNER_OF)
    resources = [{kv.key: kv.value for kv in rm.resource.attributes} for rm in request.resource_metrics]
    vllm = next(r for r in resources if r["gputally.inference.engine"].string_value == "vllm")
    assert vllm["k8s.pod.name"].string_value == "vllm-0" and vllm["host.name"].string_value == "gpu-node-1"
    assert vllm["gputally.usage.owner.kind"].string_value == "k8s.pod"


def test_an_engine_request_without_gpus_is_read() -> None:
    """A probe may send its engines in a request of their own: no ``hw.id`` in it."""
    processor = usage.factory.create(usage.factory.parse({"settle": "0s"}),
                                     ComponentContext(id="usage", telemetry=SelfTelemetry()), Signal.METRICS)
    served = [Engine("vllm", POD_A, processor.runtime.wall_ns() + S)]
    served[0].tokens[("llama", "output")] = 42
    request = engine_request(served, processor.runtime.wall_ns() + 5 * S)
    assert b"hw.id" not in request.SerializeToString()
    batch = Batch(Signal.METRICS, message=request)
    assert asyncio.run(processor.process(batch)) is batch
    assert tokens_of(emitted(processor.runtime)) == {("uid-a", "llama", "vllm", "output"): 42.0}


def _one(rt: Any, engine: Engine, time_ns: int, value: float, *, start: int | None = None) -> None:
    if start is not None:
        engine.start_ns = start
    engine.tokens[("llama", "output")] = value
    rt.observe(engine_request([engine], time_ns).SerializeToString())


def test_an_engine_restart_loses_nothing_and_counts_nothing_twice() -> None:
    clock = FakeClock()
    rt = runtime(clock)
    t0 = clock.wall
    engine = Engine("vllm", POD_A, t0 + S)
    _one(rt, engine, t0 + 10 * S, 100)
    _one(rt, engine, t0 + 20 * S, 250)
    _one(rt, engine, t0 + 30 * S, 40, start=t0 + 25 * S)  # restarted at 25 s: 40 since then, a lower value
    _one(rt, engine, t0 + 40 * S, 90)
    _one(rt, engine, t0 + 50 * S, 300, start=t0 + 45 * S)  # restarted again: a higher value, a new start time
    _one(rt, engine, t0 + 60 * S, 20)  # and once more with the same start time: only the value is lower
    assert tokens_of(emitted(rt)) == {("uid-a", "llama", "vllm", "output"): 250 + 90 + 300 + 20}
    assert rt.ledger.serving.resets == 3
    registry = CollectorRegistry()
    registry.register(UsageCollector({"usage": rt}))
    assert registry.get_sample_value("gputally_usage_engine_resets_total", {"processor": "usage"}) == 3


def test_duplicates_and_late_requests_change_nothing() -> None:
    clock = FakeClock()
    once = runtime(clock)
    sent = run(once, clock, engines(clock), 6)
    expect = tokens_of(emitted(once))

    again = runtime(clock)
    for raw in sent:  # each request delivered twice, and the first ones once more at the end
        again.observe(raw)
        again.observe(raw)
    for raw in sent[:3]:
        again.observe(raw)
    assert tokens_of(emitted(again)) == expect
    assert again.ledger.serving.late == 3 * (len(sent) + 3)  # one per engine resource
    registry = CollectorRegistry()
    registry.register(UsageCollector({"usage": again}))
    assert registry.get_sample_value("gputally_usage_engine_readings_ignored_total",
                                     {"processor": "usage", "reason": "late"}) == 3 * (len(sent) + 3)
    assert registry.get_sample_value("gputally_usage_engines", {"processor": "usage"}) == 3

    # Out of order within `settle`: held, then integrated in time order.
    held = runtime(clock, settle=5)
    for raw in [sent[1], sent[0], sent[3], sent[2], sent[5], sent[4]]:
        held.observe(raw)
    clock.advance(10)
    assert tokens_of(emitted(held)) == expect

    # A later cycle settles first (it arrived first); the earlier one, due after it, is late.
    own = FakeClock()  # counting from the same start as `once`
    staggered = runtime(own, settle=5)
    for raw in sent[:3]:
        staggered.observe(raw)
    staggered.observe(sent[4])
    own.advance(3)
    staggered.observe(sent[3])
    own.advance(3)
    staggered.account()  # sent[4] is due, sent[3] not yet
    own.advance(3)
    staggered.observe(sent[5])
    own.advance(10)
    assert tokens_of(emitted(staggered)) == expect
    assert staggered.ledger.serving.late == 3  # sent[3]'s three engines


def test_a_series_counts_in_full_only_when_it_started_after_the_counters() -> None:
    """An engine that was counting before gputally began: its first value is a base (those
    tokens were served before any GPU time here was counted); one started after: all of it."""
    clock = FakeClock()
    rt = runtime(clock)
    t0 = clock.wall
    before, after = Engine("vllm", POD_A, t0 - 3600 * S), Engine("llamacpp", POD_B, t0 + S)
    _one(rt, before, t0 + 10 * S, 5000)
    _one(rt, after, t0 + 10 * S, 70)
    _one(rt, before, t0 + 20 * S, 5100)
    _one(rt, after, t0 + 20 * S, 90)
    assert tokens_of(emitted(rt)) == {("uid-a", "llama", "vllm", "output"): 100.0,
                                      ("uid-b", "llama", "llamacpp", "output"): 90.0}


def test_an_engine_back_after_it_was_forgotten_is_not_counted_again() -> None:
    clock = FakeClock()
    rt = runtime(clock, end_after="1h")
    t0 = clock.wall
    engine, other = Engine("vllm", POD_A, t0 + S), Engine("llamacpp", POD_B, t0 + S)
    _one(rt, engine, t0 + 10 * S, 100)
    _one(rt, other, t0 + 10 * S, 1)
    day = 86_400 * S
    _one(rt, other, t0 + 2 * day, 2)  # time goes on: the first engine is forgotten at the next emit
    emitted(rt)
    assert POD_A["server.port"] not in {dict(k).get("server.port") for k in rt.ledger.serving.engines}
    _one(rt, engine, t0 + 2 * day + 10 * S, 180)  # the same run (its start time), seen again
    _one(rt, engine, t0 + 2 * day + 20 * S, 200)
    got = tokens_of(emitted(rt))
    assert got[("uid-a", "llama", "vllm", "output")] == 20.0  # a new account: the owner had ended; 180 is its base


def test_values_that_are_not_counts_are_left_out() -> None:
    clock = FakeClock()
    rt = runtime(clock)
    t0 = clock.wall
    engine = Engine("vllm", POD_A, t0 + S)
    _one(rt, engine, t0 + 10 * S, 100)
    request = engine_request([engine], t0 + 20 * S)
    for point in request.resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points:
        point.as_double = math.nan
    rt.observe(request.SerializeToString())
    _one(rt, engine, t0 + 30 * S, 130)
    assert tokens_of(emitted(rt)) == {("uid-a", "llama", "vllm", "output"): 130.0}


def test_a_restart_with_storage_continues_the_series(tmp_path: Path) -> None:
    clock = FakeClock()
    whole = runtime(clock)
    sent = run(whole, clock, engines(clock), 6)
    expect = tokens_of(emitted(whole))

    first = runtime(clock, storage=tmp_path)
    asyncio.run(first.acquire())
    for raw in sent[:4]:
        first.observe(raw)
    before = emitted(first)
    asyncio.run(first.release())
    saved = json.loads((tmp_path / "usage-usage.json").read_text())
    assert saved["serving"]["engines"] and saved["serving"]["tokens"]

    clock.advance(600)  # a later start: without the saved series the rest would count from a new base
    again = runtime(clock, storage=tmp_path)
    asyncio.run(again.acquire())
    for raw in sent[2:]:  # the sender retries what was already counted
        again.observe(raw)
    after = emitted(again)
    assert tokens_of(after) == expect
    assert _starts(after) == _starts(before)


def _starts(request: ExportMetricsServiceRequest) -> dict[Any, int]:
    return {tuple(sorted((kv.key, str(kv.value)) for kv in rm.resource.attributes)):
            rm.scope_metrics[0].metrics[0].sum.data_points[0].start_time_unix_nano
            for rm in request.resource_metrics if rm.scope_metrics[0].metrics[0].name == "gputally.usage.tokens"}


def test_engines_beyond_max_owners_forget_the_longest_unseen() -> None:
    """A flood of endpoints (a port that changes every cycle) holds at most ``max_owners``
    engines; the one forgotten, seen again, is a base again (never counted twice)."""
    clock = FakeClock()
    rt = runtime(clock, max_owners=3)
    t0 = clock.wall
    first = Engine("vllm", POD_A, t0 + S)
    _one(rt, first, t0 + 10 * S, 100)
    for port in range(4):
        _one(rt, Engine("tgi", {**POD_B, "server.port": 9000 + port}, t0 + S), t0 + (20 + port) * S, 5)
    assert len(rt.ledger.serving.engines) == 3 and rt.ledger.serving.evicted == 2
    _one(rt, first, t0 + 40 * S, 130)  # forgotten: 130 is its new base
    _one(rt, first, t0 + 50 * S, 150)
    got = tokens_of(emitted(rt))
    assert got[("uid-a", "llama", "vllm", "output")] == 100 + 20
