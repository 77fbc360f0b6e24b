"""How counters become a range's figures, on a real Prometheus fed hand-made counter series in
gputally's OTLP shape: label sets that grow, resets, outages, two gputally instances, idle
capacity. Each test writes its own owner, a few minutes of samples within the last hour."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator, Mapping

import pytest
from harness.prometheus.fixtures import started_prometheus
from harness.prometheus.otlp import counter, gauge, point, request, resource
from harness.prometheus.server import Binaries, Prometheus

from tests.report.support import report

GPU = {"hw.model": "NVIDIA H100 80GB HBM3", "host.name": "node-1", "gputally.gpu.index": 0}


@pytest.fixture(scope="module")
def prom(prometheus_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with started_prometheus(prometheus_binaries, tmp_path_factory.mktemp("counters") / "prometheus") as server:
        yield server


@functools.cache
def base() -> float:
    """Samples go from 45 minutes before the first is written on: inside Prometheus'
    out-of-order window and the reports' ``--since 1h``. Taken when first asked, not at import:
    a whole-suite run collects this module (and the two that share it) many minutes before
    their tests run, and samples written then would fall out of the hour."""
    return time.time() - 45 * 60


def at(minute: float) -> float:
    return base() + minute * 60


def emit(prom: Prometheus, minute: float, owner: tuple[str, str], value: float, *, start: float,
         hw_id: str = "GPU-1", instance: str = "gw-0", labels: Mapping[str, str] | None = None,
         peak: float | None = None) -> None:
    """One emit of an (owner, GPU): every counter at ``value`` (energy and cost at 10x and 0.01x)."""
    kind, owner_id = owner
    attrs = {"service.name": "gputally", "service.instance.id": instance, "gputally.usage.owner.kind": kind,
             "gputally.usage.owner.id": owner_id, "hw.id": hw_id, **GPU, **(labels or {})}
    t = at(minute)
    metrics = [counter(f"gputally.usage.{name}", unit, [point(value * scale, at=t, start=start)])
               for name, unit, scale in (("allocated.time", "s", 1), ("busy.time", "s", 0.5), ("idle.time", "s", 0.25),
                                         ("energy", "J", 10))]
    metrics.append(counter("gputally.usage.cost", "{cost}",
                           [point(value * 0.01, {"gputally.usage.currency": "EUR"}, at=t, start=start)]))
    if peak is not None:
        metrics.append(gauge("gputally.usage.memory.peak", "By", [point(peak, at=t)]))
    prom.post_otlp(request(resource(attrs, *metrics)))


def job(prom: Prometheus, name: str, *args: str) -> dict[str, float]:
    """``report job NAME``'s totals in seconds (allocated), and the rest as JSON says them."""
    body = report("job", name, "--prometheus", prom.url, *args, "--format", "json").json()
    total = body["total"]
    seconds = total["allocated_gpu_hours"] * 3600
    assert math.isclose(total["busy_gpu_hours"] * 3600, seconds * 0.5, abs_tol=1e-9)
    assert math.isclose(total["idle_gpu_hours"] * 3600, seconds * 0.25, abs_tol=1e-9)
    assert math.isclose(total["energy_kwh"] * 3.6e6, seconds * 10, abs_tol=1e-6)
    assert math.isclose(total["cost"]["EUR"], seconds * 0.01, abs_tol=1e-9)
    return {"seconds": round(seconds, 6), "gpus": total["gpus"]}


def window(start_minute: float, end_minute: float) -> list[str]:
    return ["--start", f"{at(start_minute):.3f}", "--end", f"{at(end_minute):.3f}"]


def test_a_grown_label_set_is_counted_once(prom: Prometheus) -> None:
    """The owner's first emits went out before its metadata: two series, the second starting
    at the first's value. Prometheus' increase() sums to something else (extrapolated)."""
    owner = ("slurm.job", "grown")
    for minute, value in ((0, 0), (1, 100), (2, 200)):
        emit(prom, minute, owner, value, start=at(0))
    for minute, value in ((3, 250), (4, 400)):
        emit(prom, minute, owner, value, start=at(0), labels={"slurm.job.account": "physics"})
    assert job(prom, "grown", "--since", "1h") == {"seconds": 400, "gpus": 1}
    assert job(prom, "grown", *window(1.5, 10))["seconds"] == 300
    assert job(prom, "grown", *window(-5, 2.5))["seconds"] == 200
    assert job(prom, "grown", *window(-5, 3.5), "--chunk", "20s")["seconds"] == 250
    naive = prom.query('sum(increase(gputally_usage_allocated_time_seconds_total{gputally_usage_owner_id="grown"}'
                       f'[{int(at(10) - at(-5))}s]))', time=at(10))
    assert float(naive[0]["value"][1]) != pytest.approx(400, abs=1)
    table = report("--prometheus", prom.url, "--since", "1h", "--format", "json", "--by", "account").json()
    assert {r["label"]: r["allocated_gpu_hours"] * 3600 for r in table["rows"]}.get("physics") == pytest.approx(400)


def test_a_reset_counts_the_new_value(prom: Prometheus) -> None:
    """gputally restarted without storage: the same series drops and climbs again."""
    owner = ("slurm.job", "reset")
    for minute, value in ((0, 0), (1, 100), (2, 200)):
        emit(prom, minute, owner, value, start=at(0))
    for minute, value in ((20, 30), (21, 80)):
        emit(prom, minute, owner, value, start=at(19.5))
    assert job(prom, "reset", "--since", "1h")["seconds"] == 280
    assert job(prom, "reset", "--since", "1h", "--chunk", "7m")["seconds"] == 280
    assert job(prom, "reset", *window(1.5, 30))["seconds"] == 180
    assert job(prom, "reset", *window(20.5, 30))["seconds"] == 50


def test_a_restart_back_on_the_first_label_set(prom: Prometheus) -> None:
    """Restarted without storage, the owner's first emits went to its old, smaller label set
    again: the drop is between two series, which resets() does not see."""
    owner, account = ("k8s.pod", "ml/revert"), {"k8s.namespace.name": "ml", "k8s.pod.name": "revert"}
    more = {**account, "gputally.k8s.owner.kind": "Job", "gputally.k8s.owner.name": "revert"}
    emit(prom, 0, owner, 0, start=at(0), labels=account)
    emit(prom, 1, owner, 10, start=at(0), labels=account)
    emit(prom, 2, owner, 20, start=at(0), labels=more)
    emit(prom, 3, owner, 30, start=at(0), labels=more)
    emit(prom, 30, owner, 0, start=at(30), labels=account)
    emit(prom, 31, owner, 3, start=at(30), labels=account)
    emit(prom, 32, owner, 5, start=at(30), labels=more)
    emit(prom, 33, owner, 8, start=at(30), labels=more)
    body = report("pod", "ml/revert", "--prometheus", prom.url, "--since", "1h", "--format", "json").json()
    assert body["total"]["allocated_gpu_hours"] * 3600 == pytest.approx(38)
    assert body["labels"]["gputally_k8s_owner_kind"] == "Job"


def test_an_outage_with_storage_continues(prom: Prometheus) -> None:
    """With storage the counters go on from where they were, after a 20 minute gap."""
    owner = ("slurm.job", "outage")
    for minute, value in ((0, 0), (1, 50), (21, 60), (22, 90)):
        emit(prom, minute, owner, value, start=at(0))
    assert job(prom, "outage", "--since", "1h")["seconds"] == 90
    assert job(prom, "outage", *window(10, 40))["seconds"] == 40
    assert job(prom, "outage", *window(10, 40), "--chunk", "3m")["seconds"] == 40


def test_a_gpu_counted_by_two_instances(prom: Prometheus) -> None:
    """Scale-out moved the GPU to another gputally: its counter there starts at 0."""
    owner = ("slurm.job", "moved")
    emit(prom, 0, owner, 0, start=at(0), instance="gw-0")
    emit(prom, 1, owner, 100, start=at(0), instance="gw-0")
    emit(prom, 2, owner, 0, start=at(2), instance="gw-1")
    emit(prom, 3, owner, 40, start=at(2), instance="gw-1")
    assert job(prom, "moved", "--since", "1h") == {"seconds": 140, "gpus": 1}


def test_idle_capacity_is_its_own_row_and_a_missing_memory_size_is_a_question_mark(prom: Prometheus) -> None:
    emit(prom, 0, ("unallocated", "unallocated"), 0, start=at(0), hw_id="GPU-idle")
    emit(prom, 5, ("unallocated", "unallocated"), 300, start=at(0), hw_id="GPU-idle")
    pod = ("k8s.pod", "lab/tiny")
    labels = {"k8s.namespace.name": "lab", "k8s.pod.name": "tiny"}
    emit(prom, 0, pod, 0, start=at(0), hw_id="GPU-tiny", labels=labels, peak=2 * 2**30)
    emit(prom, 5, pod, 600, start=at(0), hw_id="GPU-tiny", labels=labels, peak=3 * 2**30)
    rows = {r["label"]: r for r in report("--prometheus", prom.url, "--since", "1h", "--by", "namespace",
                                          "--format", "json").json()["rows"]}
    assert rows["(unallocated)"]["allocated_gpu_hours"] * 3600 == pytest.approx(300)
    assert rows["(unallocated)"]["special"] and rows["lab"]["allocated_gpu_hours"] * 3600 == pytest.approx(600)
    text = report("pod", "lab/tiny", "--prometheus", prom.url, "--since", "1h")
    assert text.code == 0, text.err
    line = next(line for line in text.out.splitlines() if line.startswith("0 "))
    assert "3.0/?" in line.split()
    assert "peak memory" not in text.out  # without the GPU's size there is nothing to compare with
    # With the probe's hw.gpu.memory.limit for that GPU (80 GiB), the note appears.
    limit = gauge("hw.gpu.memory.limit", "By", [point(80 * 2**30, at=at(4))])
    prom.post_otlp(request(resource({"hw.id": "GPU-tiny", **GPU}, limit)))
    text = report("pod", "lab/tiny", "--prometheus", prom.url, "--since", "1h")
    assert "3.0/80.0" in text.out and "peak memory 3.0 GiB of 80 GiB: a smaller MIG profile would do" in text.out


def test_long_names_are_never_cut(prom: Prometheus) -> None:
    """A name or id cut in the middle names nobody: the table grows wider instead."""
    name = "a-very-long-inference-deployment-name-7f9c8d6b5-xk2lp"
    labels = {"k8s.namespace.name": "team-with-a-long-name", "k8s.pod.name": name}
    emit(prom, 0, ("k8s.pod", f"team-with-a-long-name/{name}"), 0, start=at(0), hw_id="GPU-long", labels=labels)
    emit(prom, 2, ("k8s.pod", f"team-with-a-long-name/{name}"), 120, start=at(0), hw_id="GPU-long", labels=labels)
    result = report("--prometheus", prom.url, "--since", "1h", "--by", "pod")
    assert result.code == 0
    line = next(line for line in result.out.splitlines() if line.startswith("team-with"))
    assert "…" not in result.out and line.split()[0] == f"team-with-a-long-name/{name}"
    assert float(line.split()[1]) == pytest.approx(120 / 3600, abs=0.001)
    lines = result.out.splitlines()
    header = next(i for i, line_ in enumerate(lines) if line_.startswith("pod "))
    assert len({len(line_) for line_ in lines[header:header + 3]}) == 1  # the columns still line up
    csv_text = report("--prometheus", prom.url, "--since", "1h", "--by", "pod", "--format", "csv").out
    assert f"team-with-a-long-name,{name}," in csv_text  # scripts get the whole name


def test_a_job_on_a_gpu_nobody_held_is_not_said_to_be_on_others(prom: Prometheus) -> None:
    """The job's process ran on GPU-free, which nobody held (its time is ``unallocated``), and on
    GPU-held, which a pod held: only that one is others'."""
    for hw_id, holder in (("GPU-free", ("unallocated", "unallocated")), ("GPU-held", ("k8s.pod", "uid-held"))):
        base = {"service.name": "gputally", "service.instance.id": "gw-0", "hw.id": hw_id, **GPU}
        for minute, value in ((0, 0), (1, 60), (2, 120)):
            t = at(minute)
            job = resource({**base, "gputally.usage.owner.kind": "slurm.job", "gputally.usage.owner.id": "guest"},
                           counter("gputally.usage.allocated.time", "s", [point(0, at=t, start=at(0))]),
                           counter("gputally.usage.busy.time", "s", [point(value / 2, at=t, start=at(0))]))
            held = resource({**base, "gputally.usage.owner.kind": holder[0], "gputally.usage.owner.id": holder[1]},
                            counter("gputally.usage.allocated.time", "s", [point(value, at=t, start=at(0))]))
            prom.post_otlp(request(job, held))
    body = report("job", "guest", "--prometheus", prom.url, "--since", "1h", "--format", "json").json()
    assert body["notes"] == ["ran on 1 GPU allocated to others: no allocated time, so no utilization",
                             "ran on 1 GPU nobody had allocated: no allocated time, so no utilization"]
