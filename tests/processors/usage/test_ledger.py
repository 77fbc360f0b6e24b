"""The ledger's promises, as properties over generated GPU histories (hypothesis):
conservation of time and energy across owners, at-least-once delivery changes nothing
(duplicated, reordered, late samples), counter resets and gaps."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from gputally.processors.usage.config import UsageConfig
from gputally.processors.usage.ledger import Ledger
from gputally.processors.usage.observe import DeviceReading, ProcessReading
from gputally.processors.usage.owners import UNALLOCATED, UNATTRIBUTED, Owner

GPU = "GPU-0"
OWNERS = [Owner("k8s.pod", "ml/a"), Owner("k8s.pod", "ml/b"), Owner("slurm.job", "7")]
MAX_GAP = 30.0


@dataclass(frozen=True)
class Step:
    dt: float
    utilization: float
    energy_step: float
    reset: bool
    holders: tuple[int, ...]
    processes: tuple[tuple[int, float, float], ...]  # (owner index or -1 for none, utilization, memory)


steps = st.lists(
    st.builds(
        Step,
        dt=st.one_of(st.floats(0.1, 20.0), st.just(MAX_GAP + 5.0)),
        utilization=st.one_of(st.just(0.0), st.floats(0.0, 1.0)),
        energy_step=st.floats(0.0, 5000.0),
        reset=st.sampled_from([False] * 9 + [True]),
        holders=st.lists(st.integers(0, 2), max_size=2, unique=True).map(tuple),
        processes=st.lists(
            st.tuples(st.integers(-1, 2), st.one_of(st.just(0.0), st.floats(0.0, 1.0)), st.floats(0.0, 1e10)),
            max_size=3,
        ).map(tuple),
    ),
    min_size=1,
    max_size=25,
)


def history(script: list[Step]) -> tuple[list[tuple[int, DeviceReading, dict[str, ProcessReading]]], float, float]:
    """Readings at increasing times, the observed time and the energy consumed in observed intervals."""
    t, energy = 10**18, 1000.0
    out = []
    observed = consumed = 0.0
    for index, step in enumerate(script):
        before = energy
        if index:
            t += int(step.dt * 1e9)
            # A reset shows as a counter that went down (one that restarts above its old value
            # cannot be told from growth, by us or by any counter reader).
            reset = step.reset and step.energy_step < before
            energy = step.energy_step if reset else energy + step.energy_step
            if step.dt <= MAX_GAP:
                observed += step.dt
                consumed += energy if reset else energy - before
        holders = tuple((OWNERS[i], (("id", OWNERS[i].id),)) for i in step.holders)
        device = DeviceReading(utilization=step.utilization, energy_j=energy, memory=1e9, limit=8e10,
                               allocation=holders, attributes=(("hw.id", GPU),))
        processes = {
            f"{n}@": ProcessReading(owner=(OWNERS[o], ()) if o >= 0 else (UNATTRIBUTED, ()), utilization=u, memory=m)
            for n, (o, u, m) in enumerate(step.processes)
        }
        out.append((t, device, processes))
    return out, observed, consumed


def feed(ledger: Ledger, readings: list[tuple[int, DeviceReading, dict[str, ProcessReading]]]) -> None:
    for t, device, processes in readings:
        ledger.add(GPU, t, device, "", None, arrived=0.0)
        for key, process in processes.items():
            ledger.add(GPU, t, None, key, process, arrived=0.0)


def totals(ledger: Ledger) -> dict[Owner, tuple[float, ...]]:
    device = ledger.devices[GPU]
    return {o: (a.allocated, a.busy, a.idle, a.energy, a.peak_memory) for o, a in device.accounts.items()}


def ledger() -> Ledger:
    return Ledger(UsageConfig(max_gap=MAX_GAP, end_after=10**6, idle_after=60), start_ns=0)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_time_and_energy_are_conserved_across_owners(script: list[Step]) -> None:
    readings, observed, consumed = history(script)
    book = ledger()
    feed(book, readings)
    book.settle(0.0, everything=True)
    device = book.devices[GPU]
    accounts = device.accounts.values()
    assert math.isclose(device.observed, observed, abs_tol=1e-6)
    assert math.isclose(sum(a.allocated for a in accounts), observed, abs_tol=1e-6)
    assert math.isclose(sum(a.energy for a in accounts), consumed, rel_tol=1e-9, abs_tol=1e-6)
    busy = sum(s.utilization * s.dt for s in script[1:] if s.dt <= MAX_GAP)
    assert math.isclose(sum(a.busy for a in accounts), busy, rel_tol=1e-9, abs_tol=1e-6)
    for account in accounts:
        assert account.idle <= account.allocated + 1e-9 and account.busy >= 0 and account.energy >= -1e-9
    gaps = sum(s.dt for s in script[1:] if s.dt > MAX_GAP)
    assert math.isclose(device.unobserved, gaps, abs_tol=1e-6)


@settings(max_examples=100, deadline=None)
@given(steps, st.randoms(use_true_random=False))
def test_duplicated_and_reordered_batches_change_nothing(script: list[Step], rng: random.Random) -> None:
    readings, _, _ = history(script)
    in_order = ledger()
    feed(in_order, readings)
    in_order.settle(0.0, everything=True)

    shuffled = readings * 2  # every batch delivered twice...
    rng.shuffle(shuffled)  # ...in any order, inside the settle window
    messy = ledger()
    feed(messy, shuffled)
    messy.settle(0.0, everything=True)
    assert totals(messy) == totals(in_order)

    feed(messy, readings)  # ...and once more, late: all of it already integrated
    messy.settle(0.0, everything=True)
    assert totals(messy) == totals(in_order)
    assert messy.late >= len(readings)


def test_an_energy_counter_reset_counts_from_zero() -> None:
    book = ledger()
    holder = ((OWNERS[0], ()),)
    for t, energy in ((1, 5000.0), (2, 5600.0), (3, 200.0), (4, 500.0)):  # driver reload between 2 and 3
        book.add(GPU, t * 10**9, DeviceReading(utilization=0.0, energy_j=energy, allocation=holder), "", None,
                 arrived=0.0)
    book.settle(0.0, everything=True)
    assert book.devices[GPU].accounts[OWNERS[0]].energy == 600 + 200 + 300


def test_a_gap_is_unobserved_not_integrated() -> None:
    book = ledger()
    for t, utilization in ((0, 1.0), (10, 1.0), (10 + MAX_GAP + 1, 1.0), (15 + MAX_GAP + 1, 1.0)):
        book.add(GPU, int(t * 1e9), DeviceReading(utilization=utilization, energy_j=None), "", None, arrived=0.0)
    book.settle(0.0, everything=True)
    device = book.devices[GPU]
    assert device.observed == 15 and device.unobserved == MAX_GAP + 1
    assert device.accounts[UNALLOCATED].allocated == 15 and book.gaps == 1


def test_a_sample_waits_for_settle_then_later_ones_are_late() -> None:
    book = Ledger(UsageConfig(settle=2.0), start_ns=0)
    reading = DeviceReading(utilization=0.5, energy_j=None)
    book.add(GPU, 1 * 10**9, reading, "", None, arrived=100.0)
    book.add(GPU, 3 * 10**9, reading, "", None, arrived=100.5)
    book.settle(101.0)
    assert book.devices[GPU].last_ns is None  # nothing settled yet
    book.add(GPU, 2 * 10**9, reading, "", None, arrived=101.0)  # out of order, inside the window
    book.settle(102.6)
    assert book.devices[GPU].last_ns == 3 * 10**9 and book.devices[GPU].observed == 2.0
    book.add(GPU, 2 * 10**9, reading, "", None, arrived=103.0)
    assert book.late == 1


def test_max_owners_evicts_the_longest_unseen() -> None:
    book = Ledger(UsageConfig(max_owners=2, settle=0), start_ns=0)
    for t, owner in enumerate(OWNERS):
        book.add(f"GPU-{t}", t * 10**9, DeviceReading(utilization=0.0, allocation=((owner, ()),)), "", None,
                 arrived=0.0)
        book.settle(0.0)
    assert set(book.owners) == set(OWNERS[1:]) and book.evicted == 1
    assert OWNERS[0] not in book.devices["GPU-0"].accounts


def test_an_older_sample_that_settles_after_a_newer_one_is_late() -> None:
    """The newer sample arrived first and settled first: the older one must not be integrated
    backwards (a negative interval), whatever its own settle deadline."""
    book = Ledger(UsageConfig(settle=1.0), start_ns=0)
    reading = DeviceReading(utilization=1.0, energy_j=None)
    book.add(GPU, 100 * 10**9, reading, "", None, arrived=10.0)
    book.add(GPU, 50 * 10**9, reading, "", None, arrived=10.5)
    book.settle(11.0)  # only the first one is due
    book.settle(11.6)
    book.add(GPU, 110 * 10**9, reading, "", None, arrived=11.6)
    book.settle(20.0)
    device = book.devices[GPU]
    assert device.observed == 10.0 and book.late == 1
    assert all(a.allocated >= 0 and a.busy >= 0 for a in device.accounts.values())
