"""FOCUS rows from accounts, without a Prometheus: the rounding that keeps sums whole, charge
periods, the columns FOCUS 1.3 asks for, Parquet, and the real focus-validator on a file with
every kind of row (a pod, a job on a GPU it does not hold, idle capacity, unattributed work)."""

from __future__ import annotations

import csv
import io
import json
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputally.report import focus, focus_write, money, periods
from gputally.report.errors import UsageError
from gputally.report.queries import Account, Usage
from gputally.report.timerange import Range
from tests.report.focus_support import read_rows, validate

HOUR = 3600.0
START = 1796083200.0  # 2026-12-01T00:00:00Z
GPU_LABELS = {"hw_model": "NVIDIA H200", "host_name": "node-1", "gputally_gpu_index": "0", "k8s_node_name": "node-1"}
PRICE, ENERGY_PRICE = 3.5, 0.2


def cost(allocated: float, energy: float) -> dict[str, float]:
    return {"EUR": allocated / 3600 * PRICE + energy / 3.6e6 * ENERGY_PRICE}


def scene(gpu: str = "GPU-1", share: float = 1.0) -> list[Account]:
    """One GPU for an hour: a pod held half of it, nobody the other half; a Slurm job's process
    and an unknown process computed on it."""
    labels = {**GPU_LABELS, "hw_id": gpu}
    pod = {**labels, "k8s_namespace_name": "ml", "k8s_pod_name": "trainer-0", "gputally_k8s_owner_kind": "StatefulSet",
           "gputally_k8s_owner_name": "trainer", "k8s_pod_label_team": "vision"}
    job = {**labels, "slurm_job_account": "physics", "slurm_job_partition": "gpu", "slurm_job_user": "ana",
           "slurm_job_name": "holder"}
    return [
        Account("gw-0", "k8s.pod", "uid-1", gpu, pod, 1800 * share, 1500 * share, 100 * share, 9e5 * share,
                cost(1800 * share, 9e5 * share)),
        Account("gw-0", "slurm.job", "42", gpu, job, 0, 60 * share, 0, 3e4 * share, cost(0, 3e4 * share)),
        Account("gw-0", "unallocated", "", gpu, dict(labels), 1800 * share, 0, 1800 * share, 1e5 * share,
                cost(1800 * share, 1e5 * share)),
        Account("gw-0", "unattributed", "", gpu, dict(labels), 0, 30 * share, 0, 1.5e4 * share,
                cost(0, 1.5e4 * share)),
    ]


def period(accounts: list[Account], start: float = START, length: float = HOUR) -> periods.Period:
    return periods.Period(start, start + length, Usage(Range(start, start + length), accounts, []))


# -- rounding ------------------------------------------------------------------------------------

@given(st.lists(st.decimals(min_value=0, max_value=10**6, places=9), min_size=1, max_size=60),
       st.integers(min_value=0, max_value=6))
def test_apportioned_parts_add_up_to_the_rounded_whole_and_stay_within_a_unit(parts: list[Decimal],
                                                                            decimals: int) -> None:
    unit = money.quantum(decimals)
    rounded = money.apportion(parts, unit)
    assert sum(rounded) == sum(parts).quantize(unit)
    assert all(abs(r - p) < unit and r % unit == 0 for r, p in zip(rounded, parts, strict=True))


def test_rounding_each_row_alone_would_lose_cents_and_the_export_does_not() -> None:
    """300 GPUs x 4 rows at 2 decimals: rounding each row alone drifts; the export's rows add
    up to the period's total cost rounded once."""
    accounts = [a for n in range(300) for a in scene(f"GPU-{n:03d}", share=0.0123457)]
    rows = focus.rows([period(accounts)], decimals=2)
    exact = sum(money.exact(v) for a in accounts for v in a.cost.values())
    naive = sum(money.exact(v).quantize(Decimal("0.01")) for a in accounts for v in a.cost.values())
    assert naive != exact.quantize(Decimal("0.01"))  # the drift this avoids
    assert sum(r["BilledCost"] for r in rows) == exact.quantize(Decimal("0.01"))
    for gpu in ("GPU-000", "GPU-299"):  # and each GPU's rows are within a cent of its cost
        gpu_cost = sum(money.exact(v) for a in accounts if a.hw_id == gpu for v in a.cost.values())
        assert abs(sum(r["BilledCost"] for r in rows if r["ResourceId"] == gpu) - gpu_cost) < Decimal("0.01")


# -- periods ------------------------------------------------------------------------------------

def test_periods_are_cut_at_utc_boundaries_and_the_range_edges() -> None:
    rng = Range(START - 1800, START + 2 * HOUR + 60)
    assert list(periods.windows(rng, HOUR)) == [(START - 1800, START), (START, START + HOUR),
                                                (START + HOUR, START + 2 * HOUR), (START + 2 * HOUR, START + 2 * HOUR + 60)]
    assert list(periods.windows(rng, 86400)) == [(START - 1800, START), (START, START + 2 * HOUR + 60)]
    assert periods.billing_month(START - 1) == (1793491200.0, START)  # November 2026
    assert periods.billing_month(START + 31 * 86400 - 1) == (START, 1798761600.0)  # December, to January 2027


# -- the rows -----------------------------------------------------------------------------------

def test_every_account_is_a_row_and_the_allocation_columns_say_who_and_how() -> None:
    rows = {r["x_GputallyOwnerKind"]: r for r in focus.rows([period(scene())])}
    assert set(rows) == {"k8s.pod", "slurm.job", "unallocated", "unattributed"}
    pod, job, idle, nobody = rows["k8s.pod"], rows["slurm.job"], rows["unallocated"], rows["unattributed"]
    assert (pod["AllocatedMethodId"], pod["AllocatedResourceId"], pod["AllocatedResourceName"]) == \
        (focus.METHOD_ALLOCATED, "uid-1", "ml/trainer-0")
    assert pod["ConsumedQuantity"] == pod["PricingQuantity"] == Decimal("0.5")
    assert (job["AllocatedMethodId"], job["AllocatedResourceId"]) == (focus.METHOD_BUSY, "42")
    assert job["ConsumedQuantity"] == Decimal("0.016666667")  # its busy time: it held no allocation
    assert idle["AllocatedResourceId"] is None and idle["AllocatedTags"] is None  # FOCUS: the part nobody got
    assert idle["AllocatedMethodId"] == focus.METHOD_ALLOCATED and idle["x_IdleGpuHours"] == Decimal("0.5")
    assert nobody["AllocatedResourceId"] is None and nobody["AllocatedMethodId"] == focus.METHOD_BUSY
    assert json.loads(pod["AllocatedTags"]) == {
        "gputally/owner-kind": "k8s.pod", "gputally/namespace": "ml", "gputally/pod": "trainer-0",
        "gputally/workload-kind": "StatefulSet", "gputally/workload": "trainer", "team": "vision"}
    assert json.loads(job["AllocatedTags"])["gputally/slurm-account"] == "physics"
    assert (pod["SubAccountId"], pod["SubAccountType"]) == ("ml", "Kubernetes Namespace")
    assert (job["SubAccountId"], job["SubAccountType"]) == ("physics", "Slurm Account")
    for row in rows.values():  # the GPU is the charge's resource, the owner what it was split to
        tags = json.loads(row["Tags"])
        assert tags["gputally/gpu"] == "GPU-1" and tags["gputally/host"] == "node-1"
        assert not set(tags) & set(json.loads(row["AllocatedTags"] or "{}"))  # FOCUS 1.3: never both
        assert (row["ResourceId"], row["ResourceName"], row["SkuId"], row["SkuPriceId"]) == \
            ("GPU-1", "node-1 GPU 0", "NVIDIA H200", "NVIDIA H200")
        assert (row["ChargePeriodStart"], row["ChargePeriodEnd"]) == (START, START + HOUR)
        assert row["BilledCost"] == row["EffectiveCost"] == row["ListCost"] == row["ContractedCost"]
        assert abs(row["ListUnitPrice"] * row["PricingQuantity"] - row["ListCost"]) < Decimal("1e-6")
    ratios = [json.loads(r["AllocatedMethodDetails"])["Elements"][0]["AllocatedRatio"] for r in rows.values()]
    assert sum(ratios) == pytest.approx(1.0)  # FOCUS: the allocated charges of one origin charge add up to 1
    assert sum(r["BilledCost"] for r in rows.values()) == \
        sum(money.exact(v) for a in scene() for v in a.cost.values()).quantize(money.quantum(6))


def test_a_gpu_counted_by_two_instances_in_one_period_is_one_row() -> None:
    first, second = scene(share=0.5), scene(share=0.5)
    for account in second:
        account.instance = "gw-1"
    rows = focus.rows([period(first + second)])
    assert len(rows) == 4
    pod = next(r for r in rows if r["x_GputallyOwnerKind"] == "k8s.pod")
    assert pod["ConsumedQuantity"] == Decimal("0.5")


def test_the_export_of_every_kind_of_row_passes_focus_validator(tmp_path: Path) -> None:
    text = focus_write.to_csv(focus.rows([period(scene()), period(scene("GPU-2"), START + HOUR)]))
    verdict = validate(text, tmp_path)
    assert verdict.passed, verdict.failures
    assert {"BilledCost", "ChargePeriodStart", "Provider", "ResourceID", "Tags", "SkuPriceId"} <= \
        verdict.checked_columns
    assert len(read_rows(text)) == 8


def test_focus_validator_fails_a_broken_export(tmp_path: Path) -> None:
    """The check above can fail: a cost that is not a number and a Tags that is not JSON."""
    text = focus_write.to_csv(focus.rows([period(scene())]))
    rows = read_rows(text)
    rows[0]["BilledCost"] = "lots"
    rows[1]["Tags"] = "team=vision"
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    verdict = validate(out.getvalue(), tmp_path)
    assert not verdict.passed
    assert any(f.startswith("BilledCost_IsDecimal") for f in verdict.failures), verdict.failures
    assert any(f.startswith("Tags_IsJSONObject") for f in verdict.failures), verdict.failures


def test_parquet_holds_the_same_rows_with_decimal_costs(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    rows = focus.rows([period(scene())], decimals=2)
    path = tmp_path / "focus.parquet"
    focus_write.write_parquet(rows, path)
    table = pq.read_table(path)
    assert table.column_names == [c.name for c in focus.COLUMNS]
    assert str(table.schema.field("BilledCost").type) == "decimal128(38, 2)"
    assert str(table.schema.field("ChargePeriodStart").type).startswith("timestamp")
    back = table.to_pylist()
    assert [r["BilledCost"] for r in back] == [r["BilledCost"] for r in rows]
    assert [r["ChargePeriodStart"].timestamp() for r in back] == [START] * 4
    assert [r["AllocatedResourceId"] for r in back] == [r["AllocatedResourceId"] for r in rows]


def test_parquet_without_pyarrow_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # what `import pyarrow` meets where it is not installed
    with pytest.raises(UsageError, match=r"pip install 'gputally\[parquet\]'"):
        focus_write.write_parquet(focus.rows([period(scene())]), tmp_path / "focus.parquet")
    assert not (tmp_path / "focus.parquet").exists()


@pytest.mark.parametrize(("args", "says"), [
    (("--format", "focus-parquet"), "gputally: --format focus-parquet writes a file: add --output FILE.parquet\n"),
    (("job", "42", "--format", "focus"), "gputally: report job/pod writes table or json, not focus\n"),
    (("--format", "csv", "--output", "x.csv"),
     "gputally: --output is for --format focus or focus-parquet; --format csv writes to stdout\n"),
])
def test_export_arguments_that_cannot_be_honoured_fail_before_asking_prometheus(args: tuple[str, ...],
                                                                                 says: str) -> None:
    from tests.report.support import report

    result = report("--prometheus", "http://127.0.0.1:9", *args)  # nothing listens there
    assert (result.code, result.err, result.out) == (2, says, "")


def test_decimals_are_checked_by_the_parser() -> None:
    from tests.report.support import report

    result = report("--prometheus", "http://127.0.0.1:9", "--format", "focus", "--decimals", "13")
    assert result.code == 2 and "13 is not between 0 and 12" in result.err
