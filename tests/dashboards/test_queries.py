"""Every panel of every dashboard, run against a real Prometheus fed by the real pipeline.

The usage scene (tests/processors/usage/scenario.py: an H200 time-sliced by two pods of a real
kube-apiserver, a real Slurm job's process on it) goes through ``gputally serve`` with ``k8s``,
``slurm`` and ``usage`` (GPU-hour and energy prices set) into Prometheus' OTLP receiver: the
probe's ``hw.*`` and ``gputally.gpu.*`` series and the usage counters. Grafana's variables are
resolved the way Grafana would (tests/dashboards/grafana.py), then each target runs as Grafana
runs it: instant targets at the usage processor's last emit, range targets over the 90 s before
it (which hold the probe's replayed samples and every usage emit).

The recording has no XID, no failed or degraded GPU, no ECC error, no unallocated GPU and no
Slurm job with GPU time, so these series are CONSTRUCTED with tests/harness/prometheus/otlp.py
and posted to the same Prometheus (`constructed_request`), on a node of their own
(``constructed-node``):

* GPU ``GPU-constructed-failed``: ``hw.status{hw.state=failed}`` = 1, ``hw.errors{error.type=xid,
  gputally.gpu.xid=79}`` 1 -> 2, and usage counters of Slurm job 4242 (user alice, account chem),
  whose first counters went out before its metadata (a second series without user/account);
* GPU ``GPU-constructed-degraded``: ``hw.status{hw.state=degraded}`` = 1, ``hw.errors{error.type=
  ecc_uncorrected}`` 0 -> 1, and usage counters of the reserved owner ``unallocated``;
* a pod named late on the failed GPU (``LATE_POD``): its first counters, and its process's
  first samples, went out with its uid only (the API server had not named it yet, as when it
  was unreachable), already counting; its later ones carry its namespace and name too. A
  process of the pod that replaced it (same namespace and name, another uid) runs beside it.

Throttling needs nothing constructed: the recording has ``sw_power_cap`` active.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness.kube.cluster import KubeCluster
from harness.prometheus import otlp
from harness.prometheus.server import Binaries, Prometheus
from harness.slurm.cluster import SlurmCluster

from tests.dashboards import grafana
from tests.processors.usage.scenario import Placed, fed_prometheus
from tests.processors.usage.series import readings

PRICE_PER_GPU_HOUR = 4.0
PRICE_PER_KWH = 0.25
USAGE = {"prices": [{"model": "*H200*", "per_gpu_hour": PRICE_PER_GPU_HOUR}], "energy_price_per_kwh": PRICE_PER_KWH}
DURATIONS = {"__range": "5m", "__rate_interval": "1m", "__interval": "2s"}
"""Grafana's built-ins: a 5-minute dashboard range holds the whole scene (its probe samples are
60-45 s old at the last emit) and not the warm-up copies 10 minutes before it."""
WINDOW_S, STEP_S = 90, 2
RESERVED = ("unallocated", "unattributed")
FIELDS = ("allocated", "busy", "idle", "energy", "cost")
DIVISOR = {"allocated": 3600, "busy": 3600, "idle": 3600, "energy": 3.6e6, "cost": 1}
UNIT = {"allocated": "h", "busy": "h", "idle": "h", "energy": "kwatth", "cost": "none"}

CONSTRUCTED_NODE = "constructed-node"
LATE_POD, LATE_NAMESPACE, LATE_NAME, LATE_PID = "3f1c2d4e-0b5a-4c6d-9e7f-late00000001", "research", "late-0", 4343
RECREATED_POD, RECREATED_PID = "8a7b6c5d-1e2f-4a3b-8c9d-late00000002", 4444
FAILED_GPU, DEGRADED_GPU = "GPU-constructed-failed", "GPU-constructed-degraded"
JOB, JOB_USER, JOB_ACCOUNT = "4242", "alice", "chem"
CONSTRUCTED = {  # owner id -> counter -> the values at -40 s, -20 s and 0 s from the last emit
    JOB: {"allocated": (0, 20, 40), "busy": (0, 10, 20), "idle": (0, 5, 10), "energy": (0, 3000, 6000),
          "cost": (0, 0.5, 1.0)},
    "unallocated": {"allocated": (0, 20, 40), "busy": (0, 0, 0), "idle": (0, 20, 40), "energy": (0, 2000, 4000),
                    "cost": (0, 0, 0)},
    LATE_POD: {"allocated": (10, 30, 50), "busy": (6, 16, 26), "idle": (0, 4, 8), "energy": (1500, 4500, 7500),
               "cost": (0.2, 0.6, 1.0)},
}
OTLP_NAMES = {"allocated": ("gputally.usage.allocated.time", "s"), "busy": ("gputally.usage.busy.time", "s"),
              "idle": ("gputally.usage.idle.time", "s"), "energy": ("gputally.usage.energy", "J"),
              "cost": ("gputally.usage.cost", "{cost}")}


def constructed_request(at: float) -> bytes:
    """The series the recording cannot have (module docstring), stamped at ``at`` - 40/-20/-0 s."""
    times = (at - 40, at - 20, at)

    def gpu(hw_id: str, index: int) -> dict[str, Any]:
        return {"hw.id": hw_id, "hw.type": "gpu", "hw.vendor": "NVIDIA", "hw.model": "NVIDIA H200",
                "hw.name": f"nvidia{index}", "gputally.gpu.index": index, "host.name": CONSTRUCTED_NODE}

    def status(state: str) -> Any:
        return otlp.updowncounter("hw.status", "1", [
            otlp.point(1 if s == state else 0, {"hw.state": s}, at=t) for s in ("ok", "degraded", "failed")
            for t in times])

    def usage(owner: str, kind: str, attributes: Mapping[str, Any], counters: Mapping[str, Sequence[float]],
              stamps: Sequence[float] = times) -> Any:
        metrics = []
        for field, values in counters.items():
            name, unit = OTLP_NAMES[field]
            extra = {"gputally.usage.currency": "USD"} if field == "cost" else {}
            metrics.append(otlp.counter(name, unit, [otlp.point(v, extra, at=t, start=at - 600)
                                                     for v, t in zip(values, stamps, strict=True)]))
        metrics.append(otlp.gauge("gputally.usage.memory.peak", "By", [otlp.point(2**30, at=stamps[-1])]))
        return otlp.resource({**attributes, "gputally.usage.owner.kind": kind, "gputally.usage.owner.id": owner},
                             *metrics, scope="gputally.processors.usage")

    failed, degraded = gpu(FAILED_GPU, 0), gpu(DEGRADED_GPU, 1)
    job = {"hw.id": FAILED_GPU, "hw.model": "NVIDIA H200", "host.name": CONSTRUCTED_NODE, "slurm.job.id": JOB}
    named = {**job, "slurm.job.user": JOB_USER, "slurm.job.account": JOB_ACCOUNT, "slurm.job.partition": "gpu"}
    # Two emits 50 and 45 s before the last, before the job's metadata arrived: a series without
    # user and account, as the real pipeline writes for a job named late.
    before_metadata = usage(JOB, "slurm.job", job, {field: (0, 0) for field in FIELDS}, (at - 50, at - 45))
    # The late pod's counters already grew before it was named (half of their -40 s values at
    # -45 s): a query that groups them by name sees two owners, or counts them twice.
    pod = {"hw.id": FAILED_GPU, "hw.model": "NVIDIA H200", "host.name": CONSTRUCTED_NODE, "k8s.pod.uid": LATE_POD}
    pod_named = {**pod, "k8s.namespace.name": LATE_NAMESPACE, "k8s.pod.name": LATE_NAME}
    pod_before_names = usage(LATE_POD, "k8s.pod", pod, {field: (0, values[0] / 2)
                                                        for field, values in CONSTRUCTED[LATE_POD].items()},
                             (at - 50, at - 45))

    def process(attributes: Mapping[str, Any], stamps: Sequence[float], pid: int = LATE_PID) -> Any:
        return otlp.resource(
            {**attributes, "process.pid": pid, "process.executable.name": "python"},
            otlp.gauge("gputally.gpu.process.memory.usage", "By", [otlp.point(2**30, at=t) for t in stamps]),
            otlp.gauge("gputally.gpu.process.utilization", "1",
                       [otlp.point(0.5, {"hw.gpu.task": "general"}, at=t) for t in stamps]),
            scope="gputally.probes.nvml")

    return otlp.request(
        otlp.resource(failed, status("failed"), otlp.counter("hw.errors", "{error}", [
            otlp.point(v, {"error.type": "xid", "gputally.gpu.xid": 79}, at=t) for v, t in zip((1, 2, 2), times,
                                                                                               strict=True)]),
            scope="gputally.probes.nvml"),
        otlp.resource(degraded, status("degraded"), otlp.counter("hw.errors", "{error}", [
            otlp.point(v, {"error.type": "ecc_uncorrected"}, at=t) for v, t in zip((0, 1, 1), times, strict=True)]),
            scope="gputally.probes.nvml"),
        before_metadata,
        usage(JOB, "slurm.job", named, CONSTRUCTED[JOB]),
        pod_before_names,
        usage(LATE_POD, "k8s.pod", pod_named, CONSTRUCTED[LATE_POD]),
        process(pod, (at - 50, at - 45)),
        process(pod_named, times),
        process({**pod_named, "k8s.pod.uid": RECREATED_POD}, times, RECREATED_PID),
        usage("unallocated", "unallocated", {"hw.id": DEGRADED_GPU, "hw.model": "NVIDIA H200",
                                             "host.name": CONSTRUCTED_NODE}, CONSTRUCTED["unallocated"]),
    )


@dataclass
class Fed:
    prometheus: Prometheus
    scene: Placed
    at: float
    """The usage processor's last emit: instant targets run here, range targets end here."""
    expected: dict[str, dict[str, float]]
    """Owner id -> allocated, busy, idle (s), energy (J), cost, peak (bytes): the scene's split
    rules (``scene.expected()``, cost from the prices) and the constructed counters."""
    kinds: dict[str, str]

    @property
    def start(self) -> float:
        return self.at - WINDOW_S

    def instant(self, expr: str) -> list[dict[str, Any]]:
        return self.prometheus.query(expr, time=self.at)

    def range(self, expr: str) -> list[dict[str, Any]]:
        return self.prometheus.query_range(expr, self.start, self.at, STEP_S)

    def values(self, board: Mapping[str, Any], **chosen: str) -> dict[str, grafana.Value | str]:
        return grafana.resolve(self.prometheus, board, chosen, start=self.start, end=self.at, durations=DURATIONS)


DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboards"


@pytest.fixture(scope="module")
def fed(prometheus_binaries: Binaries, kube_cluster: KubeCluster, kube_admin: Any, slurm_cluster: SlurmCluster,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fed]:
    """One Prometheus fed once for the module (the feed takes about 25 s)."""
    with fed_prometheus(prometheus_binaries, kube_cluster, kube_admin, slurm_cluster,
                        tmp_path_factory.mktemp("dashboards"), usage=USAGE) as (server, scene):
        (last,) = server.query("max(timestamp(gputally_usage_allocated_time_seconds_total))")
        at = float(last["value"][1])
        server.post_otlp(constructed_request(at))
        expected: dict[str, dict[str, float]] = {}
        for owner, counters in scene.expected().items():
            cost = counters["allocated"] / 3600 * PRICE_PER_GPU_HOUR + counters["energy"] / 3.6e6 * PRICE_PER_KWH
            expected[owner] = {**counters, "cost": cost}
        for owner, series in CONSTRUCTED.items():
            expected[owner] = {field: float(values[-1]) for field, values in series.items()} | {"peak": 2.0**30}
        kinds = {o: "slurm.job" for o in (str(scene.job), JOB)} | {"unallocated": "unallocated"}
        kinds |= {o: "k8s.pod" for o in (*scene.holders, LATE_POD)}
        yield Fed(server, scene, at, expected, kinds)


def empty_targets(fed: Fed, board: Mapping[str, Any], values: Mapping[str, grafana.Value | str]) -> list[str]:
    """The targets that return nothing (or only NaN) as Grafana would run them."""
    empty = []
    for panel in grafana.panels(board):
        for target in grafana.targets(panel):
            expr = grafana.substitute(target["expr"], values)
            if target.get("instant"):
                found = [r["value"][1] for r in fed.instant(expr)]
            else:
                found = [v for r in fed.range(expr) for _, v in r["values"]]
            if not [v for v in found if v != "NaN"]:
                empty.append(f"{panel['title']} / {target['refId']}: {expr}")
    return empty


def panel(board: Mapping[str, Any], title: str) -> dict[str, Any]:
    (found,) = [p for p in grafana.panels(board) if p["title"] == title]
    return found


def run(fed: Fed, board: Mapping[str, Any], title: str, ref: str, values: Mapping[str, grafana.Value | str],
        *keys: str) -> dict[Any, float]:
    """An instant target's result keyed by the ``keys`` labels (one label: its value; none: "")."""
    (target,) = [t for t in grafana.targets(panel(board, title)) if t["refId"] == ref]
    assert target["instant"], (title, ref)
    out: dict[Any, float] = {}
    for row in fed.instant(grafana.substitute(target["expr"], values)):
        labels = tuple(row["metric"].get(k, "") for k in keys)
        key = labels if len(keys) > 1 else labels[0] if keys else ""
        assert key not in out, (title, ref, key)
        out[key] = float(row["value"][1])
    return out


def close(found: float, want: float) -> bool:
    return math.isclose(found, want, rel_tol=1e-9, abs_tol=1e-9)


def owners_of(fed: Fed, kind: str | None = None, *, reserved: bool = True) -> list[str]:
    return [o for o in fed.expected if (kind is None or fed.kinds[o] == kind) and (reserved or o not in RESERVED)]


# ------------------------------------------------------------------------------------------------

def test_every_fleet_panel_returns_data(fed: Fed) -> None:
    board = grafana.load("fleet")
    assert empty_targets(fed, board, fed.values(board)) == []


def test_fleet_figures(fed: Fed) -> None:
    board = grafana.load("fleet")
    values = fed.values(board)
    assert run(fed, board, "GPUs reporting", "gpus", values) == {"": 1}  # the H200; constructed GPUs send no utilization
    assert run(fed, board, "Failed GPUs", "failed", values) == {"": 1}
    assert run(fed, board, "Degraded GPUs", "degraded", values) == {"": 1}
    states = run(fed, board, "Failed or degraded GPUs", "state", values, "hw_id", "hw_state")
    assert states == {(FAILED_GPU, "failed"): 1, (DEGRADED_GPU, "degraded"): 1}
    assert run(fed, board, "XIDs by GPU", "xids", values, "hw_id", "gputally_gpu_xid") == {(FAILED_GPU, "79"): 2}
    # The GPU's own energy counter over the range is what the usage processor split among the owners.
    energy = run(fed, board, "Energy by node over the range", "energy", values, "host_name")
    scene = readings(fed.scene.requests)
    assert close(energy[fed.scene.node], (scene[-1].energy_j - scene[0].energy_j) / 3.6e6)
    assert close(energy[fed.scene.node], sum(fed.scene.expected()[o]["energy"] for o in fed.scene.expected()) / 3.6e6)
    owners = owners_of(fed, reserved=False)
    share = run(fed, board, "Idle share of allocated GPU time", "idle_share", values)[""]
    assert close(share, sum(fed.expected[o]["idle"] for o in owners) / sum(fed.expected[o]["allocated"] for o in owners))
    throttled = fed.range(grafana.substitute(grafana.targets(panel(board, "Clock throttling by reason (GPUs affected)"))[0]["expr"],
                                              values))
    active = {r["metric"]["gputally_gpu_clock_event_reason"] for r in throttled if any(v == "1" for _, v in r["values"])}
    assert active == {"sw_power_cap"}  # recorded; gpu_idle is left out


def test_every_chargeback_panel_returns_data(fed: Fed) -> None:
    board = grafana.load("chargeback")
    assert empty_targets(fed, board, fed.values(board, currency="USD")) == []


def table_figures(fed: Fed, board: Mapping[str, Any], title: str, values: Mapping[str, Any],
                  *keys: str) -> dict[str, dict[Any, float]]:
    """Each column (refId) of a chargeback table, in seconds, joules and currency again."""
    table = panel(board, title)
    units = {o["matcher"]["options"].removeprefix("Value #"): p["value"] for o in table["fieldConfig"]["overrides"]
             for p in o["properties"] if p["id"] == "unit"}
    assert units == UNIT, (title, units)
    return {field: {k: v * DIVISOR[field] for k, v in run(fed, board, title, field, values, *keys).items()}
            for field in FIELDS}


def assert_figures(found: Mapping[str, Mapping[Any, float]], want: Mapping[Any, Mapping[str, float]]) -> None:
    for field in FIELDS:
        extra = {k: v for k, v in found[field].items() if k not in want}
        assert all(v == 0 for v in extra.values()), (field, extra)  # "unattributed" may show, with nothing in it
        for key, counters in want.items():
            assert key in found[field], (field, key, found[field])
            assert close(found[field][key], counters[field]), (field, key, found[field][key], counters[field])


def test_chargeback_tables_equal_the_usage_counters(fed: Fed) -> None:
    board = grafana.load("chargeback")
    values = fed.values(board, currency="USD")
    want = fed.expected
    pods = fed.scene.holders
    assert len(pods) == 2 and want[pods[0]]["allocated"] > 0 and want[str(fed.scene.job)]["peak"] > 0

    by_owner = table_figures(fed, board, "By owner (job or pod)", values, "gputally_usage_owner_id")
    assert_figures(by_owner, want)

    # The late pod's counters before and after it was named are one owner in one namespace.
    by_namespace = table_figures(fed, board, "By namespace", values, "k8s_namespace_name")
    assert_figures(by_namespace, {fed.scene.namespace: {f: sum(want[o][f] for o in pods) for f in FIELDS},
                                  LATE_NAMESPACE: want[LATE_POD]})
    assert set(by_namespace["allocated"]) == {fed.scene.namespace, LATE_NAMESPACE}

    job = fed.prometheus.series(f'gputally_usage_allocated_time_seconds_total{{gputally_usage_owner_id="{fed.scene.job}", '
                                'slurm_job_user!=""}')[0]
    for label, named in (("slurm_job_user", JOB_USER), ("slurm_job_account", JOB_ACCOUNT)):
        title = "By Slurm user" if label == "slurm_job_user" else "By Slurm account"
        found = table_figures(fed, board, title, values, label)
        assert_figures(found, {job[label]: want[str(fed.scene.job)], named: want[JOB]})
        # The constructed job's first counters went out without user and account: no unnamed row.
        assert set(found["allocated"]) == {job[label], named}, found

    # Grouped by owner id (a pod's uid), shown by name: a pod's namespace/name from its counters.
    shown = {fed.scene.trainer: f"{fed.scene.namespace}/trainer-0", fed.scene.notebook: f"{fed.scene.namespace}/jupyter-bob-0",
             LATE_POD: f"{LATE_NAMESPACE}/{LATE_NAME}"}
    names = run(fed, board, "By owner (job or pod)", "allocated", values, "gputally_usage_owner_id", "owner")
    assert {o: name for o, name in names if o in want} == {o: shown.get(o, o) for o in want}, names

    leaders = run(fed, board, "Idle allocated GPU-hours: top 10 owners", "idle", values, "gputally_usage_owner_id")
    legend = panel(board, "Idle allocated GPU-hours: top 10 owners")["targets"][0]["legendFormat"]
    assert legend == "{{owner}} ({{gputally_usage_owner_kind}})"
    assert set(run(fed, board, "Idle allocated GPU-hours: top 10 owners", "idle", values, "owner")) == \
        {shown.get(o, o) for o in owners_of(fed, reserved=False)}
    assert set(leaders) == set(owners_of(fed, reserved=False))
    assert all(close(v * 3600, want[o]["idle"]) for o, v in leaders.items())

    totals = {p["title"]: float(fed.instant(grafana.substitute(p["targets"][0]["expr"], values))[0]["value"][1])
              for p in grafana.panels(board) if p["type"] == "stat"}
    owners = owners_of(fed, reserved=False)
    assert close(totals["Allocated GPU-hours"] * 3600, sum(want[o]["allocated"] for o in owners))
    assert close(totals["Idle allocated GPU-hours"] * 3600, sum(want[o]["idle"] for o in owners))
    assert close(totals["Unallocated GPU-hours"] * 3600, want["unallocated"]["allocated"])
    assert close(totals["Energy (kWh)"] * 3.6e6, sum(want[o]["energy"] for o in want))
    assert close(totals["Cost (${currency})"], sum(want[o]["cost"] for o in owners))


@pytest.mark.parametrize("who", ["trainer", "job", "late"])
def test_every_workload_panel_returns_data_for_a_pod_and_a_job(fed: Fed, who: str) -> None:
    owner = {"trainer": fed.scene.trainer, "job": str(fed.scene.job), "late": LATE_POD}[who]  # a pod's: its uid
    board = grafana.load("workload")
    values = fed.values(board, owner_kind=fed.kinds[owner], owner_id=owner)
    if who != "late":  # the constructed GPU sends no hw.* series but status and errors
        assert empty_targets(fed, board, values) == []

    want = fed.expected[owner]
    figures = {p["title"]: run(fed, board, p["title"], "value", values, "gputally_usage_currency")
               for p in grafana.panels(board) if p["type"] == "stat"}
    assert close(figures["Allocated GPU-hours"][""] * 3600, want["allocated"])
    assert close(figures["Busy GPU-hours"][""] * 3600, want["busy"])
    assert close(figures["Idle GPU-hours"][""] * 3600, want["idle"])
    assert close(figures["Energy (kWh)"][""] * 3.6e6, want["energy"])
    assert close(figures["Cost"]["USD"], want["cost"])
    assert figures["Peak GPU memory"][""] == want["peak"]

    # The processes panels show this owner's processes, one series each, and no one else's: the
    # late pod's before it was named too, never the job's, which have no pod name either, nor
    # those of the pod that replaced it under the same name.
    pids = {str(pid) for pid, o in fed.scene.owners.items() if o == owner} | ({str(LATE_PID)} if who == "late" else set())
    for title in ("Process GPU memory", "Process SM utilization"):
        expr = grafana.substitute(grafana.targets(panel(board, title))[0]["expr"], values)
        shown = [r["metric"]["process_pid"] for r in fed.range(expr)]
        assert sorted(shown) == sorted(pids), (title, shown)
        if who == "late":
            (series,) = fed.range(expr)
            assert float(series["values"][0][0]) <= fed.at - 45, "the samples sent before the pod was named"


def test_every_node_panel_returns_data(fed: Fed) -> None:
    board = grafana.load("node")
    values = fed.values(board, host_name=fed.scene.node)
    assert empty_targets(fed, board, values) == []
    energy = run(fed, board, "Energy over the range", "energy", values)[""]
    assert close(energy * 3.6e6, sum(fed.scene.expected()[o]["energy"] for o in fed.scene.expected()))
    states = run(fed, board, "GPUs on the node", "state", values, "hw_model", "hw_state")
    assert states == {("NVIDIA H200", "ok"): 1}
    age = run(fed, board, "Age of the newest reading", "age", values)[""]
    assert abs(age - (fed.at - readings(fed.scene.requests)[-1].time_ns / 1e9)) < 0.002  # ms timestamps
    holders = fed.range(grafana.substitute(grafana.targets(panel(board, "Who holds the node's GPUs"))[0]["expr"], values))
    shown = {r["metric"]["gputally_usage_owner_id"] for r in holders}
    names = {r["metric"]["owner"] for r in holders if r["metric"]["gputally_usage_owner_id"] in fed.scene.holders}
    assert names == {f"{fed.scene.namespace}/trainer-0", f"{fed.scene.namespace}/jupyter-bob-0"}  # the legend's
    holding = {r["metric"]["gputally_usage_owner_id"] for r in holders if any(float(v) > 0 for _, v in r["values"])}
    # Both pods, and nobody else with an allocation (the job's process and any unattributed work
    # hold none). Whether the pods' rates are above 0 depends on whether the processor emitted
    # before the scene's 18 s of samples arrived in one burst: rate() cannot see a first emit.
    assert set(fed.scene.holders) <= shown and holding <= set(fed.scene.holders), (shown, holding)


def test_a_range_that_begins_after_an_owners_first_emit_counts_only_what_grew_inside_it(fed: Fed) -> None:
    """15 s back from the last emit, the constructed owners' counters stood at their -20 s values:
    the figures are the growth since (20 s of allocation, 3000 J), not their whole counters."""
    board = grafana.load("chargeback")
    values = {**fed.values(board, currency="USD"), "__range": "15s"}
    by_owner = table_figures(fed, board, "By owner (job or pod)", values, "gputally_usage_owner_id")
    for owner, counters in CONSTRUCTED.items():
        for field in FIELDS:
            assert close(by_owner[field][owner], counters[field][2] - counters[field][1]), (owner, field)


def test_the_dashboards_draw_from_the_real_queries(fed: Fed, tmp_path: Path) -> None:
    """Each board drawn from its panels' results (tests/dashboards/render.py): the pictures in
    the docs. ``GPUTALLY_DOCS_IMAGES=1`` writes them to docs/img/dashboards/."""
    from tests.dashboards import render

    out = DOCS_IMAGES if os.environ.get("GPUTALLY_DOCS_IMAGES") == "1" else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    trainer = fed.scene.trainer_uid  # a pod's owner id is its uid
    chosen = {"chargeback": {"currency": "USD"}, "fleet": {}, "node": {"host_name": fed.scene.node},
              "workload": {"owner_kind": fed.kinds[trainer], "owner_id": trainer}}
    for name, picks in chosen.items():
        board = grafana.load(name)
        render.draw(board, fed.values(board, **picks), fed.instant, fed.range, out / f"{name}.png")
        assert (out / f"{name}.png").stat().st_size > 10_000
