"""``gputally report --format focus`` on a real Prometheus: the recorded H200 series run
through the real pipeline (the package's ``fed`` scene), and hand-made counters with idle
capacity and unattributed work across an hour boundary. The exports pass the FinOps
Foundation's focus-validator, and a period's rows add up to its GPUs' cost to the cent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from harness.prometheus.fixtures import started_prometheus
from harness.prometheus.otlp import counter, point, request, resource
from harness.prometheus.server import Binaries, Prometheus

from gputally.report.timerange import parse_time
from tests.report.focus_support import read_rows, validate
from tests.report.support import CURRENCY, ENERGY_PRICE_PER_KWH, PRICE_PER_GPU_HOUR, Fed, report

CENT = Decimal("0.01")


def by_period(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault((row["ChargePeriodStart"], row["ChargePeriodEnd"]), []).append(row)
    return out


def table_cost(url: str, start: str, end: str) -> float:
    """The chargeback table's total cost for one charge period (every owner, the special rows too)."""
    body = report("--prometheus", url, "--start", start, "--end", end, "--format", "json").json()
    return float(body["total"]["cost"].get(CURRENCY, 0.0))


def test_the_export_of_the_recorded_h200_series_passes_focus_validator(fed: Fed, tmp_path: Path) -> None:
    result = report(*fed.args("--format", "focus", "--period", "hour"))
    assert result.code == 0, result.err
    verdict = validate(result.out, tmp_path)
    assert verdict.passed, verdict.failures
    rows = read_rows(result.out)
    held = {r["AllocatedResourceId"]: r for r in rows if r["AllocatedMethodId"] == "gputally-allocated-time"}
    assert {fed.scene.trainer, fed.scene.notebook} <= set(held), rows
    trainer = held[fed.scene.trainer]
    tags = json.loads(trainer["AllocatedTags"])
    # (pod labels reach AllocatedTags where Prometheus promotes them; the harness's does not)
    assert (tags["gputally/namespace"], tags["gputally/pod"], tags["gputally/owner-kind"]) == \
        (fed.scene.namespace, "trainer-0", "k8s.pod")
    assert trainer["AllocatedResourceName"] == f"{fed.scene.namespace}/trainer-0"
    assert (trainer["SkuId"], trainer["ResourceType"], trainer["BillingCurrency"]) == ("NVIDIA H200", "GPU", CURRENCY)
    # The Slurm job's process held memory and never computed on the pods' GPU: no time, no
    # energy, no cost, so no row (a charge of nothing is not a charge).
    assert str(fed.scene.job) not in {r["AllocatedResourceId"] for r in rows}
    assert all(Decimal(r["ConsumedQuantity"]) > 0 or Decimal(r["BilledCost"]) > 0 for r in rows)


def test_the_recorded_series_rows_add_up_to_the_gpus_cost_to_the_cent(fed: Fed) -> None:
    result = report(*fed.args("--format", "focus", "--period", "hour", "--decimals", "2"))
    assert result.code == 0, result.err
    periods = by_period(read_rows(result.out))
    exact = 0.0
    for (start, end), rows in periods.items():
        cost = table_cost(fed.url, f"{parse_time(start):.0f}", f"{parse_time(end):.0f}")
        exact += cost
        assert sum(Decimal(r["BilledCost"]) for r in rows) == Decimal(repr(cost)).quantize(CENT), (start, rows)
    want = fed.scene.expected()  # the split rules applied to the recording, owner by owner
    assert exact == pytest.approx(sum(fed.expected_cost(c) for c in want.values()), rel=1e-9)
    held: dict[str, float] = {}
    for rows in periods.values():
        for row in rows:
            if row["AllocatedMethodId"] == "gputally-allocated-time":
                owner = row["AllocatedResourceId"]
                held[owner] = held.get(owner, 0.0) + float(row["ConsumedQuantity"]) * 3600
    for pod in (fed.scene.trainer, fed.scene.notebook):
        assert held[pod] == pytest.approx(want[pod]["allocated"], abs=0.001)


# -- idle capacity and unattributed work across an hour boundary ----------------------------------

GPU = {"hw.id": "GPU-f0c5", "hw.model": "NVIDIA H200", "host.name": "node-9", "gputally.gpu.index": 3}


@pytest.fixture(scope="module")
def prom(prometheus_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with started_prometheus(prometheus_binaries, tmp_path_factory.mktemp("focus") / "prometheus") as server:
        yield server


def emit(prom: Prometheus, at: float, start: float, kind: str, owner: str, allocated: float, busy: float,
         energy: float, labels: dict[str, str] | None = None) -> None:
    attrs = {"service.name": "gputally", "service.instance.id": "gw-0", "gputally.usage.owner.kind": kind,
             "gputally.usage.owner.id": owner, **GPU, **(labels or {})}
    cost = allocated / 3600 * PRICE_PER_GPU_HOUR + energy / 3.6e6 * ENERGY_PRICE_PER_KWH
    prom.post_otlp(request(resource(attrs, *(
        counter(f"gputally.usage.{name}", unit, [point(value, at=at, start=start)])
        for name, unit, value in (("allocated.time", "s", allocated), ("busy.time", "s", busy),
                                  ("idle.time", "s", 0.0), ("energy", "J", energy))),
        counter("gputally.usage.cost", "{cost}", [point(cost, {"gputally.usage.currency": CURRENCY}, at=at,
                                                            start=start)]))))


def test_idle_capacity_and_unattributed_work_are_rows_and_each_hour_adds_up(prom: Prometheus, tmp_path: Path) -> None:
    """A pod holds the GPU for 10 minutes before the hour, nobody for 15 after it; a process no
    rule names computes in both hours. Samples at -20, -10 and +5 minutes around the hour H."""
    import time

    hour = (time.time() - 600) // 3600 * 3600
    start = hour - 1800
    pod = {"k8s.namespace.name": "ml", "k8s.pod.name": "trainer-0", "k8s.pod.label.team": "vision"}
    for minute, (pod_s, idle_s, stray_s) in ((-20, (0, 0, 0)), (-10, (600, 0, 30)), (5, (600, 900, 90))):
        at = hour + minute * 60
        emit(prom, at, start, "k8s.pod", "uid-9", pod_s, pod_s * 0.8, pod_s * 500, pod)
        emit(prom, at, start, "unallocated", "", idle_s, 0, idle_s * 60)
        emit(prom, at, start, "unattributed", "", 0, stray_s, stray_s * 400)
    window = ("--prometheus", prom.url, "--start", f"{start:.0f}", "--end", f"{hour + 360:.0f}")
    result = report(*window, "--format", "focus", "--period", "hour", "--decimals", "2")
    assert result.code == 0, result.err
    assert validate(result.out, tmp_path).passed
    periods = by_period(read_rows(result.out))
    assert len(periods) == 2
    before, after = (periods[k] for k in sorted(periods))
    assert {r["x_GputallyOwnerKind"]: Decimal(r["ConsumedQuantity"]) for r in before} == \
        {"k8s.pod": Decimal("0.166666667"), "unattributed": Decimal("0.008333333")}
    assert {r["x_GputallyOwnerKind"]: Decimal(r["ConsumedQuantity"]) for r in after} == \
        {"unallocated": Decimal("0.250000000"), "unattributed": Decimal("0.016666667")}
    idle = next(r for r in after if r["x_GputallyOwnerKind"] == "unallocated")
    assert idle["AllocatedResourceId"] == "" and idle["AllocatedMethodId"] == "gputally-allocated-time"
    for (p_start, p_end), rows in periods.items():
        cost = table_cost(prom.url, f"{parse_time(p_start):.0f}", f"{parse_time(p_end):.0f}")
        assert sum(Decimal(r["BilledCost"]) for r in rows) == Decimal(repr(cost)).quantize(CENT)
        table = report("--prometheus", prom.url, "--start", f"{parse_time(p_start):.0f}", "--end",
                       f"{parse_time(p_end):.0f}", "--format", "json").json()
        kinds = {"k8s.pod ml/trainer-0": "k8s.pod", "(unallocated)": "unallocated", "(unattributed)": "unattributed"}
        for row in table["rows"]:  # allocated, idle and unattributed cost: each within a cent of its rows
            mine = sum(Decimal(r["BilledCost"]) for r in rows if r["x_GputallyOwnerKind"] == kinds[row["label"]])
            assert abs(mine - Decimal(repr(row["cost"].get(CURRENCY, 0.0)))) < CENT, (row, rows)
    # The hour after: 900 s at 3.5/h plus 54 kJ at 0.2/kWh (idle) + 24 kJ (unattributed) = 0.8793.
    assert sum(Decimal(r["BilledCost"]) for r in after) == Decimal("0.88")
