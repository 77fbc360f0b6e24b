"""``gputally report`` (the chargeback table) on a real Prometheus fed by the real pipeline:
its figures are the counters the split rules give (GPU-hours = s / 3600, kWh = J / 3.6e6)."""

from __future__ import annotations

import csv
import io
import math
from typing import Any

from tests.report.support import CURRENCY, Fed, report
from tests.processors.usage.series import Counters

FIELDS = {"allocated_gpu_hours": ("allocated", 3600), "busy_gpu_hours": ("busy", 3600),
          "idle_gpu_hours": ("idle", 3600), "energy_kwh": ("energy", 3.6e6)}


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def assert_row(row: dict[str, Any], counters: dict[str, float], fed: Fed) -> None:
    for name, (counter, per) in FIELDS.items():
        assert close(row[name], counters[counter] / per), (row["label"], name, row[name], counters[counter] / per)
    assert close(row["cost"][CURRENCY], fed.expected_cost(counters)), row
    allocated = counters["allocated"]
    assert (row["efficiency"] is None) if allocated == 0 else close(row["efficiency"], counters["busy"] / allocated)


def summed(want: Counters, owners: list[str]) -> dict[str, float]:
    return {c: sum(want[o][c] for o in owners) for c in ("allocated", "busy", "idle", "energy")}


def rows_by_label(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    rows = {row["label"]: row for row in body["rows"]}
    # The warm-up copies, sent before the pods were named, held memory as "unattributed": 0 s, 0 J.
    unattributed = rows.pop("(unattributed)", None)
    if unattributed is not None:
        assert unattributed["allocated_gpu_hours"] == 0 and unattributed["energy_kwh"] == 0, unattributed
    return rows


def test_by_owner_equals_the_counters(fed: Fed) -> None:
    want = fed.scene.expected()
    body = report(*fed.args("--by", "owner", "--format", "json")).json()
    rows = rows_by_label(body)
    ns, job = fed.scene.namespace, str(fed.scene.job)
    assert set(rows) == {f"k8s.pod {ns}/trainer-0", f"k8s.pod {ns}/jupyter-bob-0", f"slurm.job {job}"}
    shown = {fed.scene.trainer: f"{ns}/trainer-0", fed.scene.notebook: f"{ns}/jupyter-bob-0"}  # keyed by uid
    for owner, counters in want.items():
        kind = "slurm.job" if owner == job else "k8s.pod"
        row = rows[f"{kind} {shown.get(owner, owner)}"]
        assert (row["owner_kind"], row["owner_id"], row["gpus"]) == (kind, owner, 1)
        assert_row(row, counters, fed)
    assert_row(body["total"] | {"label": "TOTAL"}, summed(want, list(want)), fed)
    assert body["currencies"] == [CURRENCY] and body["by"] == "owner"
    # Time-slicing: the trainer did 191 % of its half of the GPU's time, the notebook 6 %.
    assert rows[f"k8s.pod {ns}/trainer-0"]["efficiency"] > 1.5 > 0.1 > rows[f"k8s.pod {ns}/jupyter-bob-0"]["efficiency"]


def test_by_namespace_keeps_the_job_as_no_namespace(fed: Fed) -> None:
    want = fed.scene.expected()
    rows = rows_by_label(report(*fed.args("--by", "namespace", "--format", "json")).json())
    assert list(rows) == [fed.scene.namespace, "(no namespace)"]
    assert_row(rows[fed.scene.namespace], summed(want, fed.scene.holders), fed)
    assert rows[fed.scene.namespace]["namespace"] == fed.scene.namespace
    assert_row(rows["(no namespace)"], want[str(fed.scene.job)], fed)
    assert rows["(no namespace)"]["special"] and rows["(no namespace)"]["namespace"] is None


def test_by_job_account_user_partition(fed: Fed) -> None:
    want = fed.scene.expected()
    job = str(fed.scene.job)
    pods = summed(want, fed.scene.holders)
    for by, value in (("job", job), ("account", "physics"), ("user", "root"), ("partition", "gpu")):
        rows = rows_by_label(report(*fed.args("--by", by, "--format", "json")).json())
        assert list(rows) == [value, f"(no {by})"], (by, list(rows))  # rows without the label last
        assert_row(rows[value], want[job], fed)
        assert rows[value][by] == value
        assert_row(rows[f"(no {by})"], pods, fed)


def test_by_pod_and_model(fed: Fed) -> None:
    want = fed.scene.expected()
    ns = fed.scene.namespace
    rows = rows_by_label(report(*fed.args("--by", "pod", "--format", "json")).json())
    assert set(rows) == {f"{ns}/trainer-0", f"{ns}/jupyter-bob-0", "(no namespace)"}
    assert (rows[f"{ns}/trainer-0"]["namespace"], rows[f"{ns}/trainer-0"]["pod"]) == (ns, "trainer-0")
    assert_row(rows[f"{ns}/jupyter-bob-0"], want[fed.scene.notebook], fed)
    rows = rows_by_label(report(*fed.args("--by", "model", "--format", "json")).json())
    assert list(rows) == ["NVIDIA H200"]
    assert_row(rows["NVIDIA H200"], summed(want, list(want)), fed)


def test_terminal_table_fits_80_columns_and_shows_the_json_figures(fed: Fed) -> None:
    for by in ("owner", "namespace"):  # what src/gputally/report/README.md shows: run with -s to see it
        command = ["--prometheus", fed.url, "--since", "1h", "--by", by]
        result = report(*command)
        assert result.code == 0 and result.err == ""
        print(f"$ gputally report {' '.join(command)}\n{result.out}")
        lines = result.out.splitlines()
        if by == "owner":  # the pods' full names, never cut (the table grows wider for them)
            assert f"k8s.pod {fed.scene.namespace}/jupyter-bob-0" in result.out and "…" not in result.out
            # The trainer did more than its half of the shared GPU's time: the note says why.
            assert "eff above 100%: a GPU shared by N holders" in result.out
            # TOTAL adds like the rows: each column's shown rows sum to its shown TOTAL.
            end = next(i for i, line in enumerate(lines) if line.startswith("TOTAL"))
            rows = [line.rsplit(maxsplit=7)[1:] for line in lines[4:end - 1]]
            total = lines[end].split()[1:]
            for column in (0, 1, 3, 5, 6):
                shown = [float(r[column]) for r in rows]
                places = len(total[column].split(".")[1])
                assert round(sum(shown), places) == float(total[column]), (column, shown, total[column])
            assert float(total[4]) == max(float(r[4]) for r in rows if r[4] != "-")  # peak: the most, not a sum
        else:
            assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert lines[0].startswith("GPU usage by namespace, ") and lines[1].endswith("cost in EUR")
    assert lines[3].split() == ["namespace", "alloc", "h", "busy", "h", "eff", "idle", "h", "peak", "GiB", "kWh",
                                "EUR"]
    body = report(*command, "--format", "json").json()
    total = body["total"]
    end = next(i for i, line in enumerate(lines) if line.startswith("TOTAL"))
    # Under the table: the unattributed work (none in the scene: every process has an owner).
    assert lines[end + 1:] == ["", "unattributed work: none (every busy GPU-hour has an owner)"]
    assert body["unattributed"]["busy_gpu_hours"] == 0
    lines = lines[:end + 1]
    cells = lines[-1].split()
    assert cells[0] == "TOTAL" and set(lines[-2]) == {"-"}
    decimals = len(cells[1].split(".")[1])
    assert float(cells[1]) == round(total["allocated_gpu_hours"], decimals) > 0
    assert cells[3] == f"{total['efficiency'] * 100:.0f}%"
    assert float(cells[-1]) == round(total["cost"][CURRENCY], len(cells[-1].split(".")[1])) > 0
    labels = [line.split()[0] for line in lines[4:-2]]
    assert labels[0] == fed.scene.namespace and "(no" in labels


def test_csv_has_the_json_figures(fed: Fed) -> None:
    body = report(*fed.args("--by", "owner", "--format", "json")).json()
    result = report(*fed.args("--by", "owner", "--format", "csv"))
    assert result.code == 0
    rows = list(csv.DictReader(io.StringIO(result.out)))
    assert list(rows[0]) == ["owner_kind", "owner_id", "gpus", "allocated_gpu_hours", "busy_gpu_hours", "efficiency",
                             "idle_gpu_hours", "peak_memory_bytes", "energy_kwh", f"cost_{CURRENCY}"]
    assert [(r["owner_kind"], r["owner_id"]) for r in rows[:-1]] == [
        (r["owner_kind"], r["owner_id"]) for r in body["rows"]]
    for row, want in zip(rows, [*body["rows"], body["total"]], strict=True):
        assert float(row["allocated_gpu_hours"]) == want["allocated_gpu_hours"]
        assert float(row["energy_kwh"]) == want["energy_kwh"]
        assert row["peak_memory_bytes"] == ("" if want["peak_memory_bytes"] is None else repr(want["peak_memory_bytes"]))
        assert float(row[f"cost_{CURRENCY}"]) == want["cost"][CURRENCY]
        assert row["efficiency"] == ("" if want["efficiency"] is None else repr(want["efficiency"]))
    assert rows[-1]["owner_kind"] == "TOTAL"


def test_chunks_and_split_ranges_add_up(fed: Fed) -> None:
    """Cut into 1 s chunks (the scene emits every second), or into two ranges at any emit, the
    figures are those of one query: nothing is extrapolated, nothing counted twice."""
    whole = rows_by_label(report(*fed.args("--format", "json")).json())
    chunked = rows_by_label(report(*fed.args("--format", "json", "--chunk", "1s")).json())
    assert chunked == whole
    trainer = fed.scene.trainer
    samples = {float(t): float(v) for s in fed.prometheus.query(
        f'gputally_usage_allocated_time_seconds_total{{gputally_usage_owner_id="{trainer}"}}[1h]', time=fed.end)
        for t, v in s["values"]}
    emits = sorted(samples)
    # Prometheus writes a 0 at a counter's start time too: the warm-up sample's, 10 minutes back.
    emits = [t for t in emits if t > fed.start]
    assert len(emits) >= 2
    for cut in (emits[0] + 0.001, (emits[0] + emits[-1]) / 2, emits[-1] - 0.001):
        common = ["--prometheus", fed.url, "--format", "json", "--lookback", "1h"]
        before = rows_by_label(report(*common, "--start", f"{fed.start:.3f}", "--end", f"{cut:.3f}").json())
        after = rows_by_label(report(*common, "--start", f"{cut:.3f}", "--end", f"{fed.end:.3f}").json())
        for label, row in whole.items():
            for name in FIELDS:
                parts = [r[label][name] for r in (before, after) if label in r]
                assert close(sum(parts), row[name]), (cut, label, name, parts, row[name])
    first = {row["owner_id"]: row for row in report(
        "--prometheus", fed.url, "--format", "json", "--start", f"{fed.start:.3f}",
        "--end", f"{emits[0] + 0.001:.3f}").json()["rows"]}  # by uid: the first emit may predate the names
    # Up to the first emit, the counter's value then (all of the scene, or part of it, as the emits fell).
    assert close(first[trainer]["allocated_gpu_hours"], samples[emits[0]] / 3600)


def test_since(fed: Fed) -> None:
    """--since ends now: the whole scene is inside the last hour."""
    body = report("--prometheus", fed.url, "--since", "1h", "--format", "json").json()
    assert rows_by_label(body) == rows_by_label(report(*fed.args("--format", "json")).json())
