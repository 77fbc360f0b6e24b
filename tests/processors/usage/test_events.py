"""Events: an idle spell raises one WARN after ``idle_after`` and one INFO when it ends,
allocated-and-idle told apart from holding memory without computing; summaries at the end."""

from __future__ import annotations

import asyncio
from typing import Any

from gputally.processors.usage.config import UsageConfig
from gputally.processors.usage.ledger import Ledger
from gputally.processors.usage.observe import DeviceReading, ProcessReading
from gputally.processors.usage.owners import Owner
from tests.processors.usage.helpers import feed, runtime
from tests.processors.usage.series import HOLDER_PID, NOTEBOOK_PID, TRAINER_PID, probe_requests, recording, with_attributes

POD = Owner("k8s.pod", "ml/a")
JOB = Owner("slurm.job", "7")


def spells(book: Ledger) -> list[tuple[str, str, str, str]]:
    return [(e.severity, e.name, str(e.owner), e.body.get("kind", "")) for e in book.drain_events()]


def step(book: Ledger, t: float, utilization: float, *, holders: tuple[Owner, ...] = (POD,),
         processes: dict[str, ProcessReading] | None = None) -> None:
    time_ns = int(t * 1e9)
    book.add("GPU-0", time_ns, DeviceReading(utilization=utilization, allocation=tuple((h, ()) for h in holders)),
             "", None, arrived=0.0)
    for key, process in (processes or {}).items():
        book.add("GPU-0", time_ns, None, key, process, arrived=0.0)
    book.settle(0.0, everything=True)


def test_an_allocated_idle_gpu_warns_once_per_spell_and_says_when_it_ends() -> None:
    book = Ledger(UsageConfig(idle_after=60, idle_below=0.05), start_ns=0)
    for t in range(0, 60, 10):
        step(book, t, 0.0)
    assert spells(book) == []  # 50 s idle: not yet
    for t in range(60, 200, 10):
        step(book, t, 0.0)
    assert spells(book) == [("WARN", "gputally.usage.idle", "k8s.pod ml/a", "allocated")]  # once, not every sample
    step(book, 200, 0.9)
    assert spells(book) == [("INFO", "gputally.usage.idle.end", "k8s.pod ml/a", "allocated")]
    step(book, 210, 0.0)
    step(book, 215, 0.9)
    assert spells(book) == []  # a short spell says nothing


def test_a_process_holding_memory_without_computing_warns_where_nothing_is_allocated() -> None:
    """No PodResources, no GRES: a zombie holding 3 GiB is still caught (issue 18)."""
    book = Ledger(UsageConfig(idle_after=30), start_ns=0)
    holder = {"450@": ProcessReading(owner=(JOB, ()), utilization=0.0, memory=3 * 2**30)}
    for t in range(0, 50, 10):
        step(book, t, 0.0, holders=(), processes=holder)
    events = book.drain_events()
    assert [(e.severity, e.name, str(e.owner), e.body["kind"]) for e in events] == [
        ("WARN", "gputally.usage.idle", "slurm.job 7", "holding")]
    assert "holds 3.0 GiB" in events[0].body["message"] and "without computing" in events[0].body["message"]
    step(book, 50, 0.0, holders=())  # the process exits: the spell ends
    assert spells(book) == [("INFO", "gputally.usage.idle.end", "slurm.job 7", "holding")]


def test_a_busy_owner_raises_nothing() -> None:
    book = Ledger(UsageConfig(idle_after=10), start_ns=0)
    worker = {"1@": ProcessReading(owner=(POD, ()), utilization=0.9, memory=2**30)}
    for t in range(0, 100, 10):
        step(book, t, 0.95, processes=worker)
    assert spells(book) == []


def test_the_recordings_memory_holder_and_the_notebooks_empty_allocation() -> None:
    """On the real time series with the GPU allocated to the notebook's pod: the Slurm job
    holds memory and computes nothing (holding), and after the notebook stops its pod still
    holds the GPU idle (allocated)."""
    requests = asyncio.run(probe_requests(recording(), base_ns=10**18))
    notebook = {"k8s.namespace.name": "ml", "k8s.pod.name": "jupyter-bob-0"}
    attributed = [with_attributes(r, gpu=notebook, processes={
        TRAINER_PID: {"k8s.namespace.name": "ml", "k8s.pod.name": "trainer-0"},
        NOTEBOOK_PID: notebook, HOLDER_PID: {"slurm.job.id": 90210}}) for r in requests]
    rt = runtime(idle_after=5)
    rt.sends_events = True
    feed(rt, attributed)
    batch = rt.take_events()
    assert batch is not None
    found: list[tuple[str, str, str]] = []
    for rl in batch.message.resource_logs:
        resource: dict[str, Any] = {kv.key: kv.value.string_value for kv in rl.resource.attributes}
        for record in (r for sl in rl.scope_logs for r in sl.log_records):
            body = {kv.key: kv.value.string_value for kv in record.body.kvlist_value.values}
            found.append((record.severity_text, resource["gputally.usage.owner.id"], body["kind"]))
            assert resource["hw.id"].startswith("GPU-") and record.event_name == "gputally.usage.idle"
    assert sorted(found) == [("WARN", "90210", "holding"), ("WARN", "ml/jupyter-bob-0", "allocated")]
