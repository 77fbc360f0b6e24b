"""Exact figures on the real H200 time series: the processor's counters equal the split rules
applied to the recording (`series.expected`), owner by owner."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from tests.processors.usage.helpers import FakeClock, counters_of, emitted, feed, gpu_counters, runtime
from tests.processors.usage.series import (
    GPU,
    HOLDER_PID,
    NOTEBOOK_PID,
    TRAINER_PID,
    expected,
    probe_requests,
    readings,
    recording,
    with_attributes,
)

BASE = 1_800_000_000 * 10**9
TRAINER = {"k8s.namespace.name": "ml", "k8s.pod.name": "trainer-0", "k8s.pod.uid": "uid-t",
           "gputally.k8s.owner.kind": "StatefulSet", "gputally.k8s.owner.name": "trainer"}
NOTEBOOK = {"k8s.namespace.name": "ml", "k8s.pod.name": "jupyter-bob-0", "k8s.pod.uid": "uid-n"}
HOLDER = {"slurm.job.id": 90210, "slurm.job.user": "carol", "slurm.job.account": "physics"}
OWNER_OF = {TRAINER_PID: "uid-t", NOTEBOOK_PID: "uid-n", HOLDER_PID: "90210"}
"""Pods are accounted by uid (their names carried)."""


@pytest.fixture(scope="module")
def requests() -> list[Any]:
    return asyncio.run(probe_requests(recording(), base_ns=BASE))


def attributed(requests: list[Any], gpu: dict[str, Any]) -> list[Any]:
    processes = {TRAINER_PID: TRAINER, NOTEBOOK_PID: NOTEBOOK, HOLDER_PID: HOLDER}
    return [with_attributes(r, processes=processes, gpu=gpu) for r in requests]


def gpus_only(request: Any) -> Any:
    out = type(request).FromString(request.SerializeToString())
    keep = [rm for rm in out.resource_metrics if not any(kv.key == "process.pid" for kv in rm.resource.attributes)]
    del out.resource_metrics[:]
    out.resource_metrics.extend(keep)
    return out


def assert_counters(got: dict[str, dict[str, float]], want: dict[str, dict[str, float]]) -> None:
    assert set(got) == set(want)
    for owner, counters in want.items():
        for name, value in counters.items():
            assert math.isclose(got[owner][name], value, rel_tol=1e-9, abs_tol=1e-6), (owner, name, got[owner], value)


@pytest.mark.parametrize(
    ("gpu", "holders"),
    [
        ({}, []),  # nobody holds the GPU: its time is unallocated capacity
        ({**TRAINER}, ["uid-t"]),  # the trainer's pod holds it (PodResources, one pod)
        ({"gputally.k8s.pods": ["uid-n", "uid-t"],
          "gputally.k8s.pod.uids": ["ml/jupyter-bob-0/uid-n", "ml/trainer-0/uid-t"]}, ["uid-n", "uid-t"]),  # shared
    ],
    ids=["unallocated", "trainer-holds-it", "time-sliced"],
)
def test_counters_equal_the_split_rules_on_the_recording(requests: list[Any], gpu: dict[str, Any],
                                                         holders: list[str]) -> None:
    rt = runtime(end_after=3600)
    feed(rt, attributed(requests, gpu))
    out = emitted(rt)

    want = expected(readings(requests), owner_of=OWNER_OF.__getitem__, holders=holders)
    assert_counters(counters_of(out), {o: {k: v for k, v in c.items()} for o, c in want.items()})

    # Conservation: the owners' allocated time is the GPU's observed time, their energy its counter's delta.
    series = readings(requests)
    observed = (series[-1].time_ns - series[0].time_ns) / 1e9
    got = counters_of(out)
    assert math.isclose(sum(c["allocated"] for c in got.values()), observed)
    assert math.isclose(gpu_counters(out)[GPU]["observed"], observed)
    assert math.isclose(sum(c["energy"] for c in got.values()), series[-1].energy_j - series[0].energy_j)
    assert math.isclose(sum(c["busy"] for c in got.values()),
                        sum(b.utilization * (b.time_ns - a.time_ns) / 1e9 for a, b in zip(series, series[1:])))


def test_what_the_recording_says_in_words(requests: list[Any]) -> None:
    """The figures the README quotes, checked against the recording's own story."""
    rt = runtime(end_after=3600)
    feed(rt, attributed(requests, TRAINER))
    got = counters_of(emitted(rt))
    trainer, notebook, holder = got["uid-t"], got["uid-n"], got["90210"]
    assert trainer["busy"] > 10 * notebook["busy"] > 0  # ~90 % vs ~10 % of SM time while both ran
    assert holder["busy"] == 0 and holder["energy"] == 0 and holder["allocated"] == 0  # holds memory, computes nothing
    assert holder["peak"] == 3_055_550_464 and notebook["peak"] == 6_647_971_840
    assert trainer["idle"] == 0 and notebook["allocated"] == 0


def test_the_gpu_holder_is_charged_at_its_price(requests: list[Any]) -> None:
    rt = runtime(end_after=3600, prices=[{"model": "NVIDIA H200*", "per_gpu_hour": 3.6}],
                 default_price_per_gpu_hour=1.0, energy_price_per_kwh=0.2)
    feed(rt, attributed(requests, TRAINER))
    got = counters_of(emitted(rt))
    trainer = got["uid-t"]
    assert math.isclose(trainer["cost"], trainer["allocated"] / 3600 * 3.6 + trainer["energy"] / 3.6e6 * 0.2)
    assert math.isclose(got["90210"]["cost"], 0.0)  # allocated nothing, used no energy


async def test_dcgm_exporter_data_gives_the_same_gpu_counters(requests: list[Any]) -> None:
    """The same readings as dcgm-exporter scrapes (through otelcol's prometheus receiver and the
    dcgm processor): no per-process data, so the GPU's counters, all to its holder."""
    from gputally.processors.dcgm.config import DcgmConfig
    from gputally.processors.dcgm.processor import DcgmProcessor
    from tests.processors.dcgm import scrape

    series = readings(requests)
    families = [f for f in scrape.FAMILIES if f.name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED",
                                                          "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")]
    dcgm = DcgmProcessor(DcgmConfig())
    rt = runtime(end_after=3600)
    for reading in series:
        values = {"DCGM_FI_DEV_GPU_UTIL": round(reading.utilization * 100),
                  "DCGM_FI_DEV_FB_USED": 1000.0,
                  "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": reading.energy_j * 1000}
        gpu = scrape.Series(0, GPU, "00000000:00:06.0", [values[f.name] for f in families], hostname="gpu-node-7")
        request = scrape.request([gpu], families=families)
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for point in getattr(metric, metric.WhichOneof("data")).data_points:
                        point.time_unix_nano = reading.time_ns
        batch = await dcgm.process(scrape.Batch.decode(scrape.Signal.METRICS, request.SerializeToString()))
        assert batch is not None
        feed(rt, [with_attributes(batch.message, processes={}, gpu=TRAINER)])
    got = counters_of(emitted(rt))

    probe = runtime(end_after=3600)  # the probe's GPU resources alone: dcgm-exporter has no process list
    feed(probe, [with_attributes(gpus_only(r), processes={}, gpu=TRAINER) for r in requests])
    want = counters_of(emitted(probe))
    assert set(got) == set(want) == {"uid-t"}
    for name in ("allocated", "busy", "idle", "energy"):
        assert math.isclose(got["uid-t"][name], want["uid-t"][name], rel_tol=1e-9), name
    assert got["uid-t"]["peak"] == 1000 * 2**20  # dcgm's FB_USED, in MiB, is the holder's memory


def test_notebook_that_stopped_gets_its_summary(requests: list[Any]) -> None:
    clock = FakeClock()
    rt = runtime(clock, end_after=5, summary={"low_utilization": 0.15})
    rt.sends_events = True
    feed(rt, attributed(requests, TRAINER))
    rt.emit(final=True)
    events = rt.take_events()
    assert events is not None
    records = [(rl, r) for rl in events.message.resource_logs for sl in rl.scope_logs for r in sl.log_records]
    summaries = {dict((kv.key, kv.value.string_value) for kv in rl.resource.attributes)["gputally.usage.owner.id"]:
                 {kv.key: kv.value for kv in r.body.kvlist_value.values}
                 for rl, r in records if r.event_name == "gputally.usage.summary"}
    # The notebook left before the seventh reading; the holder and trainer are still there at the end.
    assert set(summaries) == {"uid-n"}
    notebook = summaries["uid-n"]
    notes = [v.string_value for v in notebook["notes"].array_value.values]
    series = readings(requests)
    busy = expected(series, owner_of=OWNER_OF.__getitem__, holders=["uid-t"])["uid-n"]["busy"]
    present = sum((b.time_ns - a.time_ns) / 1e9 for a, b in zip(series, series[1:]) if NOTEBOOK_PID in b.processes)
    limit = series[0].memory_limit / 2**30
    assert notes == [f"mean utilization {busy / present * 100:.0f} % on 1 GPU", f"peak memory 6 GiB of {limit:.0f} GiB"]
    assert busy / present < 0.15 and round(limit) == 140  # an H200 has 141 GB (140 GiB)
    assert notebook["allocated_gpu_hours"].double_value == 0.0
    assert notebook["busy_gpu_hours"].double_value > 0
