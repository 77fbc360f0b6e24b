"""Degraded attribution is visible (issue 29, item 3): each GPU's work that no rule attributed
is counted by why (no cgroup, no metadata), and no idle event or summary note calls an owner
idle while its GPU shows such work."""

from __future__ import annotations

import math

from gputally.processors.usage.config import OwnerRule, UsageConfig
from gputally.processors.usage.emit import MetricsEmitter
from gputally.processors.usage.ledger import Ledger
from gputally.processors.usage.observe import DeviceReading, ProcessReading
from gputally.processors.usage.owners import (
    NO_CGROUP,
    NO_METADATA,
    UNATTRIBUTED,
    Owner,
    OwnerRules,
    unattributed_reason,
)
from gputally.processors.usage.config import DEFAULT_OWNERS

POD = Owner("k8s.pod", "7d3c0c1e-uid")


def step(book: Ledger, t: float, utilization: float, processes: dict[str, ProcessReading]) -> None:
    time_ns = int(t * 1e9)
    book.add("GPU-0", time_ns, DeviceReading(utilization=utilization, allocation=((POD, ()),)), "", None, arrived=0.0)
    for key, process in processes.items():
        book.add("GPU-0", time_ns, None, key, process, arrived=0.0)
    book.settle(0.0, everything=True)


def daemon(utilization: float, reason: str = NO_CGROUP) -> ProcessReading:
    return ProcessReading(owner=(UNATTRIBUTED, ()), utilization=utilization, memory=2**30, reason=reason)


def test_why_a_process_is_unattributed() -> None:
    rules = OwnerRules(DEFAULT_OWNERS)
    nothing = {"process.pid": 7, "gputally.k8s.attribution": "none"}
    assert rules.process_owner(nothing)[0] is UNATTRIBUTED and unattributed_reason(nothing) == NO_CGROUP
    assert unattributed_reason({"process.pid": 7}) == NO_CGROUP  # no hint, no /proc
    # A rule keyed by names (no fallback): the cgroup named the pod's uid, the API never its names.
    by_name = OwnerRules([OwnerRule(kind="k8s.pod", key=["k8s.namespace.name", "k8s.pod.name"])])
    seen = {"process.pid": 7, "k8s.pod.uid": "u-1", "gputally.k8s.attribution": "cgroup"}
    assert by_name.process_owner(seen)[0] is UNATTRIBUTED and unattributed_reason(seen) == NO_METADATA
    assert unattributed_reason({"slurm.job.id": 4242}) == NO_METADATA  # a job id no rule keys on
    assert rules.process_owner(seen)[0] == Owner("k8s.pod", "u-1")  # the default rule keys pods by uid


def test_unattributed_work_is_counted_per_gpu_by_reason() -> None:
    book = Ledger(UsageConfig(idle_after=1000), start_ns=0)
    processes = {"1@": daemon(0.3, NO_CGROUP), "2@": daemon(0.1, NO_METADATA)}
    for t in range(0, 110, 10):
        step(book, t, 0.8, processes)
    device = book.devices["GPU-0"]
    busy = 0.8 * 100  # all of it theirs: the pod runs nothing
    assert math.isclose(device.unattributed[NO_CGROUP], busy * 0.75) and math.isclose(device.unattributed[NO_METADATA],
                                                                                        busy * 0.25)
    assert math.isclose(sum(device.unattributed.values()), device.accounts[UNATTRIBUTED].busy)
    assert math.isclose(device.accounts[POD].unattributed, busy)

    (request,) = MetricsEmitter().requests(book, 200 * 10**9)
    points = {}
    for rm in request.resource_metrics:
        for metric in (m for sm in rm.scope_metrics for m in sm.metrics if m.name == "gputally.usage.unattributed.time"):
            assert metric.unit == "s" and metric.sum.is_monotonic
            for point in metric.sum.data_points:
                (attribute,) = point.attributes
                assert attribute.key == "gputally.usage.unattributed.reason"
                points.setdefault(attribute.value.string_value, []).append(point.as_double)
    # On the GPU's resource, each reason from the GPU's start: a 0 there, then the count.
    assert set(points) == {NO_CGROUP, NO_METADATA} and all(v[0] == 0.0 for v in points.values())
    assert math.isclose(points[NO_CGROUP][1], busy * 0.75) and math.isclose(points[NO_METADATA][1], busy * 0.25)


def test_no_idle_event_while_the_gpu_shows_unattributed_work() -> None:
    """The pod's own process is not seen (no cgroup): the work on its GPU may be its own."""
    book = Ledger(UsageConfig(idle_after=30, idle_below=0.05), start_ns=0)
    for t in range(0, 200, 10):
        step(book, t, 0.9, {"1@": daemon(0.9)})
    assert [e.name for e in book.drain_events()] == []
    for t in range(200, 300, 10):  # the work stops: now the pod holds its GPU idle
        step(book, t, 0.0, {})
    assert [(e.name, str(e.owner)) for e in book.drain_events()] == [("gputally.usage.idle", str(POD))]


def test_the_summary_does_not_call_an_owner_idle_beside_unattributed_work() -> None:
    book = Ledger(UsageConfig(end_after=60), start_ns=0)
    for t in range(0, 100, 10):
        step(book, t, 0.9, {"1@": daemon(0.9)})
    summary = book.summary(POD)
    assert not any("used 0 of 1" in n or "mean utilization" in n for n in summary.body["notes"]), summary.body
    assert summary.body["notes"] == [f"{0.9 * 90 / 3600:.3f} GPU-h of work on its GPUs could not be attributed"]
    assert math.isclose(summary.body["unattributed_gpu_hours"], 0.9 * 90 / 3600)

    plain = Ledger(UsageConfig(end_after=60), start_ns=0)  # the same pod with nothing on its GPU
    for t in range(0, 100, 10):
        step(plain, t, 0.0, {})
    assert [n for n in plain.summary(POD).body["notes"] if "used 0 of 1" in n or "mean utilization" in n]
