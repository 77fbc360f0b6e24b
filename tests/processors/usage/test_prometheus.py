"""The usage counters in a real Prometheus, written by gputally's otlphttp exporter through
Prometheus' OTLP receiver: the figures there are the figures the split rules give."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import doctext
from harness.kube.cluster import KubeCluster
from harness.slurm.cluster import SlurmCluster

from tests.processors.usage.scenario import feed_prometheus, placed


NAMES = {"allocated": "gputally_usage_allocated_time_seconds_total", "busy": "gputally_usage_busy_time_seconds_total",
         "idle": "gputally_usage_idle_time_seconds_total", "energy": "gputally_usage_energy_joules_total"}


async def test_prometheus_holds_the_usage_counters(
    prometheus: Any, kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str, slurm_cluster: SlurmCluster,
    tmp_path: Path,
) -> None:
    async with placed(kube_cluster, kube_admin, kube_namespace, slurm_cluster, tmp_path) as scene:
        await feed_prometheus(scene, prometheus, tmp_path)
    want = scene.expected()
    for name, metric in NAMES.items():
        found = {r["metric"]["gputally_usage_owner_id"]: float(r["value"][1]) for r in prometheus.query(metric)}
        # The warm-up copies, sent before the pods were named, held memory as "unattributed": 0 s, 0 J.
        assert found.pop("unattributed", 0.0) == 0.0
        assert set(found) == set(want), (metric, found)
        for owner, counters in want.items():
            assert math.isclose(found[owner], counters[name], rel_tol=1e-9, abs_tol=1e-6), (owner, name)
    by_namespace = prometheus.query(f'sum by (k8s_namespace_name) ({NAMES["allocated"]}{{k8s_namespace_name!=""}})')
    assert [r["metric"] for r in by_namespace] == [{"k8s_namespace_name": scene.namespace}]
    assert math.isclose(float(by_namespace[0]["value"][1]), sum(want[o]["allocated"] for o in scene.holders))
    job = prometheus.query(f'{NAMES["busy"]}{{slurm_job_account="physics", slurm_job_name="holder"}}')
    assert len(job) == 1 and float(job[0]["value"][1]) == 0.0
    # The job's first counters went out before its metadata was fetched: its label set grew, so
    # it has two series (README: query per owner id, or with increase()).
    cost = prometheus.query('count by (gputally_usage_owner_id) (gputally_usage_cost_total{gputally_usage_currency="USD"})')
    assert {r["metric"]["gputally_usage_owner_id"] for r in cost} - {"unattributed"} == set(want)

    # Each counter series begins with a 0 at its start time, so a per-series delta over any range
    # that holds the whole series is its whole count: what increase() and the report rely on.
    (raw,) = prometheus.query(f'{NAMES["busy"]}{{gputally_usage_owner_id="{scene.trainer}"}}[30m]')
    values = [float(v) for _, v in raw["values"]]
    assert values[0] == 0.0 and math.isclose(values[-1], want[scene.trainer]["busy"], rel_tol=1e-9)
    increases = prometheus.query(f'sum by (gputally_usage_owner_id) (increase({NAMES["allocated"]}[30m]))')
    for row in increases:  # increase() extrapolates a little past a series' last sample: close, not exact
        owner = row["metric"]["gputally_usage_owner_id"]
        if owner in want and want[owner]["allocated"]:
            assert 1.0 <= float(row["value"][1]) / want[owner]["allocated"] < 1.2, (owner, row)

    # The documented queries, over 30 minutes instead of 30 days: each returns data.
    for query in readme_queries():
        result = prometheus.query(query.replace("[30d]", "[30m]"))  # a query Prometheus refuses raises
        if 'owner_kind="unallocated"' in query:
            assert result == [], result  # the scene's GPU is always held: no idle capacity
        else:
            assert result, f"no data for the documented query {query}"
    (namespace,) = prometheus.query(readme_queries()[0].replace("[30d]", "[30m]"))
    allocated_h = sum(want[o]["allocated"] for o in scene.holders) / 3600
    assert 1.0 <= float(namespace["value"][1]) / allocated_h < 1.2


def readme_queries() -> list[str]:
    """The PromQL lines of the "Who pays" section (docs/usage.md; the README's until it moved)."""
    block = doctext.blocks(doctext.section("Who pays: usage accounting"), "promql")[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
