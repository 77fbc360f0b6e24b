"""The PromQL behind the report, and how the usage counters become figures for a time range.

The counters (``processors/usage/emit.py``) are cumulative sums stamped at each emit. What a
range owes is, for every (owner, GPU), the counter's increase over the range. Three facts
about how they reach Prometheus rule out the obvious queries:

* One (owner, GPU) can have several series: its first emits may go out before the owner's
  metadata (``slurm_job_account``, ``gputally_k8s_owner_name``...) is known, and then the
  label set grows. The grown series starts at the old one's cumulative value. Summing the
  series' values counts the first part twice.
* A gputally restart without ``storage`` starts every counter again at 0 (same series: a
  reset); a restart with ``storage`` continues them, after a gap as long as the outage.
* ``increase(m[range])`` extrapolates: when a series begins or ends inside the range it is
  stretched by up to half its average sample interval, so a finished job is charged for time
  after its end (measured once on the three-workload replay: ``increase(...[5m])`` says
  11.46 s of allocated time where the trainer's counter says 9.17 s, +25 %). A chargeback
  must not extrapolate.

So the figures are computed without extrapolation, from a few instant queries per chunk of
the range (default a day), and per *logical counter*: the series of one (``instance``,
``gputally_usage_owner_kind``, ``gputally_usage_owner_id``, ``hw_id``, and for cost
``gputally_usage_currency``), merged by taking the highest value (a grown label set's series
is never below the one it continues; an HA pair's duplicates are equal):

1. Its value at the range's start: ``last_over_time(m[lookback])`` at the start (default one
   day back), or 0 when it has no sample then (it began in the range).
2. For each chunk ``(a, b]``: ``last_over_time(m[b-a])`` and ``resets(m[b-a]) > 0`` at ``b``.
   A counter without a reset, whose value did not go down from the carried one, increased by
   its last value minus the carried one: exact, however the label set grew.
3. A counter with a reset (or whose merged value went down: a restart whose first emits went
   to an older label set) is looked at again in the two halves of the chunk, and so on, down
   to windows of 15 minutes, where its raw samples (``m{...}[15m]``) are summed the way
   ``increase`` does without extrapolating: each rise, and after a drop the new value.
4. Peak memory: ``max_over_time(gputally_usage_memory_peak_bytes[b-a])``, the most of the
   chunks. The GPU's memory for the workload view: ``max_over_time(hw_gpu_memory_limit_bytes
   {hw_id=~...}[b-a+lookback])`` at the end of the last chunk the owner was seen in.

``instance`` (gputally's ``service.instance.id``, its host name unless configured) is part of
the key: a GPU that moves to another gputally (scale-out) starts a new counter there.

Where this is still wrong: a counter whose last sample before the start is older than
``lookback`` (a gputally with ``storage`` down that long across the start) is counted from 0;
a restart without ``storage`` whose new counter passes the old value before either is seen
in one window under a different label set loses the old value. The counters are stamped when
emitted (every ``emit_interval``), so a range's edges are as sharp as that interval.

Cost: per chunk, 2 queries for each of the 5 counters and 1 for peak memory, each reading the
chunk's samples of the matching series once; plus 5 for the start. A reset adds about 4
queries per halving for the owners concerned.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .prometheus import Prometheus, Sample
from .timerange import Range

__all__ = [
    "COUNTERS", "CURRENCY", "HW_ID", "INSTANCE", "MEMORY_LIMIT", "OWNER_ID", "OWNER_KIND", "PEAK", "REASON",
    "UNATTRIBUTED",
    "Account", "Selector", "Usage", "duration_text", "fetch", "first_and_last_seen", "held_by_others", "memory_limits",
    "usage_series_exist",
]

COUNTERS: dict[str, str] = {
    "allocated": "gputally_usage_allocated_time_seconds_total",
    "busy": "gputally_usage_busy_time_seconds_total",
    "idle": "gputally_usage_idle_time_seconds_total",
    "energy": "gputally_usage_energy_joules_total",
    "cost": "gputally_usage_cost_total",
}
"""Field of `Account` -> Prometheus name (Prometheus 3's default OTLP translation, see
tests/harness/prometheus/README.md)."""
PEAK = "gputally_usage_memory_peak_bytes"
MEMORY_LIMIT = "hw_gpu_memory_limit_bytes"
OBSERVED = "gputally_usage_observed_time_seconds_total"
OWNER_KIND = "gputally_usage_owner_kind"
OWNER_ID = "gputally_usage_owner_id"
HW_ID = "hw_id"
INSTANCE = "instance"
CURRENCY = "gputally_usage_currency"
UNATTRIBUTED = "gputally_usage_unattributed_time_seconds_total"
"""Per GPU: busy time of processes no rule named, by ``REASON`` (no_cgroup, no_metadata)."""
REASON = "gputally_usage_unattributed_reason"

RAW_WINDOW = 900.0
"""Windows this short (or shorter) with a reset are summed from raw samples (15 samples per
series at the default 60 s emit interval)."""
OWNER_REGEX_LIMIT = 200
"""Narrowing a re-query to more owners than this costs more in the regex than it saves."""

AccountKey = tuple[str, str, str, str]
"""(instance, owner kind, owner id, hw id)."""
CounterKey = tuple[str, ...]
"""An account key and, for cost, the currency (for the unattributed time, the reason); other
readers (``served``) key theirs wider."""


def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal (Go escapes, which JSON's are)."""
    return json.dumps(value, ensure_ascii=False)


def _regex_escape(value: str) -> str:
    """RE2 needs only its metacharacters escaped (Python's re.escape also escapes '-', which is fine
    for RE2, and ' ', which is not)."""
    return "".join("\\" + c if c in r"\.+*?()|[]{}^$" else c for c in value)


@dataclass(frozen=True, slots=True)
class Selector:
    """Label matchers every usage query carries: none for the fleet's table, the owner for a
    workload's view."""

    equal: tuple[tuple[str, str], ...] = ()

    def render(self, owners: Iterable[str] | None = None) -> str:
        """``{k="v",...}``; with ``owners`` also ``gputally_usage_owner_id=~"a|b"``."""
        matchers = [f"{key}={promql_string(value)}" for key, value in self.equal]
        if owners is not None:
            pattern = "|".join(_regex_escape(o) for o in sorted(set(owners)))
            matchers.append(f"{OWNER_ID}=~{promql_string(pattern)}")
        return "{" + ",".join(matchers) + "}"


def duration_text(seconds: float) -> str:
    """``seconds`` as a PromQL duration."""
    return _duration(seconds)


def _duration(seconds: float) -> str:
    """A range selector's duration in milliseconds (PromQL takes no fractions)."""
    return f"{max(1, round(seconds * 1000))}ms"


def _account_key(labels: dict[str, str]) -> AccountKey:
    return (labels.get(INSTANCE, ""), labels.get(OWNER_KIND, ""), labels.get(OWNER_ID, ""), labels.get(HW_ID, ""))


def _counter_key(labels: dict[str, str], extra: str = CURRENCY) -> CounterKey:
    return (*_account_key(labels), labels.get(extra, ""))


@dataclass(slots=True)
class Account:
    """One owner on one GPU over the range (as one gputally instance counted it)."""

    instance: str
    kind: str
    owner: str
    hw_id: str
    labels: dict[str, str] = field(default_factory=dict)
    """Every label its series carried (the grown label set's values win)."""
    allocated: float = 0.0
    """Seconds."""
    busy: float = 0.0
    idle: float = 0.0
    energy: float = 0.0
    """Joules."""
    cost: dict[str, float] = field(default_factory=dict)
    """Currency -> amount."""
    peak_memory: float | None = None
    """Bytes; None when no peak was emitted in the range."""


@dataclass(slots=True)
class Usage:
    """Every account with a counter sample in the range."""

    range: Range
    accounts: list[Account]
    seen: list[tuple[float, float]]
    """The chunks in which any counter had a sample (the workload view's first/last seen)."""
    unattributed: dict[str, float] = field(default_factory=dict)
    """Reason -> seconds of the GPUs' busy time no rule attributed (asked for the table only;
    empty when the counter is not there: a gputally from before it)."""


class _Counter:
    """One counter name's logical counters over the range: value carried to the chunk's start,
    and the increase so far."""

    def __init__(self, client: Prometheus, name: str, selector: Selector, labels: dict[Any, dict[str, str]],
                 extra: str = CURRENCY, *, key: Callable[[dict[str, str], str], CounterKey] = _counter_key,
                 width: int = 4):
        self.client = client
        self.name = name
        self.extra = extra
        """The label that, beside the account's, tells this counter's series apart."""
        self.key = key
        self.width = width
        """How much of a key names the account (its labels are kept per account)."""
        self.selector = selector
        self.labels = labels
        self.carry: dict[CounterKey, float] = {}
        self.total: dict[CounterKey, float] = {}

    def start(self, at: float, lookback: float) -> None:
        for key, value in self._merged(self.client.vector(
                f"last_over_time({self.name}{self.selector.render()}[{_duration(lookback)}])", at), keep=False).items():
            self.carry[key] = value

    def window(self, a: float, b: float, only: set[CounterKey] | None = None) -> bool:
        """Add the increase in ``(a, b]``; True when any series had a sample there."""
        owners = None if only is None or len({k[2] for k in only}) > OWNER_REGEX_LIMIT else {k[2] for k in only}
        selector = self.selector.render(owners)
        span = _duration(b - a)
        lasts = self._merged(self.client.vector(f"last_over_time({self.name}{selector}[{span}])", b), keep=only is None)
        reset = self._merged(self.client.vector(f"resets({self.name}{selector}[{span}]) > 0", b), keep=False)
        if only is not None:
            lasts = {k: v for k, v in lasts.items() if k in only}
        flagged = {k for k in lasts if k in reset or lasts[k] < self.carry.get(k, 0.0)}
        for key, last in lasts.items():
            if key not in flagged:
                self.total[key] = self.total.get(key, 0.0) + last - self.carry.get(key, 0.0)
                self.carry[key] = last
        if flagged:
            if b - a <= RAW_WINDOW:
                self._raw(a, b, flagged)
            else:
                middle = a + (b - a) / 2
                self.window(a, middle, flagged)
                self.window(middle, b, flagged)
        return bool(lasts)

    def _raw(self, a: float, b: float, keys: set[CounterKey]) -> None:
        """Sum the samples of ``keys`` in ``(a, b]`` one by one: each rise, and after a drop the new value."""
        owners = {k[2] for k in keys} if len({k[2] for k in keys}) <= OWNER_REGEX_LIMIT else None
        points: dict[CounterKey, list[tuple[float, float]]] = {}
        for series in self.client.matrix(f"{self.name}{self.selector.render(owners)}[{_duration(b - a)}]", b):
            key = self.key(series.labels, self.extra)
            if key in keys:
                points.setdefault(key, []).extend(series.points)
        for key, samples in points.items():
            previous = self.carry.get(key, 0.0)
            added = 0.0
            for _, value in sorted(samples, key=lambda p: p[0]):
                added += value - previous if value >= previous else value
                previous = value
            self.total[key] = self.total.get(key, 0.0) + added
            self.carry[key] = previous

    def _merged(self, samples: Sequence[Sample], *, keep: bool) -> dict[CounterKey, float]:
        """The highest value per logical counter; with ``keep`` the series' labels are remembered."""
        out: dict[CounterKey, float] = {}
        for sample in samples:
            key = self.key(sample.labels, self.extra)
            out[key] = max(out.get(key, sample.value), sample.value)
            if keep:
                labels = self.labels.setdefault(key[:self.width], {})
                labels.update({k: v for k, v in sample.labels.items() if v and k != "__name__"})
        return out


def fetch(client: Prometheus, rng: Range, *, selector: Selector = Selector(), chunk: float = 86400.0,
          lookback: float = 86400.0, progress: Callable[[int, int, float], None] | None = None,
          unattributed: bool = False) -> Usage:
    """Every account's increase over ``rng`` (see the module docstring for how), chunk by chunk;
    ``progress(done, total, chunk_end)`` after each chunk. With ``unattributed``, also the
    GPUs' unattributed busy time by reason (the same way, 2 more queries per chunk)."""
    labels: dict[AccountKey, dict[str, str]] = {}
    counters = {field_: _Counter(client, name, selector, labels) for field_, name in COUNTERS.items()}
    if unattributed:
        counters["unattributed"] = _Counter(client, UNATTRIBUTED, Selector(), {}, extra=REASON)
    for counter in counters.values():
        counter.start(rng.start, lookback)
    peaks: dict[AccountKey, float] = {}
    seen: list[tuple[float, float]] = []
    total = rng.count(chunk)
    for done, (a, b) in enumerate(rng.chunks(chunk), 1):
        any_sample = False
        for field_, counter in counters.items():
            sampled = counter.window(a, b)
            any_sample = any_sample or (sampled and field_ != "unattributed")
        for sample in client.vector(f"max_over_time({PEAK}{selector.render()}[{_duration(b - a)}])", b):
            key = _account_key(sample.labels)
            peaks[key] = max(peaks.get(key, sample.value), sample.value)
        if any_sample:
            seen.append((a, b))
        if progress is not None:
            progress(done, total, b)
    accounts: dict[tuple[str, ...], Account] = {key: Account(*key, labels=dict(values)) for key, values in labels.items()}
    why: dict[str, float] = {}
    for field_, counter in counters.items():
        for counter_key, value in counter.total.items():
            if field_ == "unattributed":
                why[counter_key[4]] = why.get(counter_key[4], 0.0) + value
                continue
            account = accounts.get(counter_key[:4])
            if account is None:
                continue
            if field_ == "cost":
                currency = counter_key[4]
                account.cost[currency] = account.cost.get(currency, 0.0) + value
            else:
                setattr(account, field_, getattr(account, field_) + value)
    for key, peak in peaks.items():
        if key in accounts:
            accounts[key].peak_memory = peak
    ordered = sorted(accounts.values(), key=lambda acc: (acc.kind, acc.owner, acc.hw_id, acc.instance))
    return Usage(rng, ordered, seen, why)


def first_and_last_seen(client: Prometheus, selector: Selector, usage: Usage) -> tuple[float, float] | None:
    """The first and last emit of the allocated-time counter in the range (raw samples of the
    first and last chunk that had any)."""
    if not usage.seen:
        return None
    name = COUNTERS["allocated"]
    times: list[float] = []
    for a, b in {usage.seen[0], usage.seen[-1]}:
        for series in client.matrix(f"{name}{selector.render()}[{_duration(b - a)}]", b):
            times.extend(t for t, _ in series.points)
    return (min(times), max(times)) if times else None


def memory_limits(client: Prometheus, usage: Usage, *, lookback: float) -> dict[str, float]:
    """hw_id -> the GPU's memory in bytes, from the probe's ``hw.gpu.memory.limit`` in the last
    chunk the accounts were seen and ``lookback`` before it (the probe stamps its samples with
    their own time, which may be before the range); GPUs without it are left out."""
    gpus = sorted({account.hw_id for account in usage.accounts if account.hw_id})
    if not gpus or not usage.seen:
        return {}
    a, b = usage.seen[-1]
    pattern = promql_string("|".join(_regex_escape(g) for g in gpus))
    out: dict[str, float] = {}
    for sample in client.vector(f"max by ({HW_ID}) (max_over_time({MEMORY_LIMIT}{{{HW_ID}=~{pattern}}}"
                                f"[{_duration(b - a + lookback)}]))", b):
        out[sample.labels.get(HW_ID, "")] = sample.value
    return out


def held_by_others(client: Prometheus, rng: Range, hw_ids: Iterable[str]) -> set[str]:
    """Which of ``hw_ids`` someone held in the range: an owner (not ``unallocated`` or
    ``unattributed``) whose allocated time on it grew there. A workload's GPU it ran on without
    holding it was either someone else's or nobody's."""
    gpus = sorted(set(hw_ids))
    if not gpus:
        return set()
    name = COUNTERS["allocated"]
    matchers = (f"{{{HW_ID}=~{promql_string('|'.join(_regex_escape(g) for g in gpus))},"
                f'{OWNER_KIND}!~"unallocated|unattributed"}}')
    window = _duration(rng.end - rng.start)
    found = client.vector(f"group by ({HW_ID}) ((max_over_time({name}{matchers}[{window}]) - "
                          f"min_over_time({name}{matchers}[{window}])) > 0)", rng.end)
    return {sample.labels.get(HW_ID, "") for sample in found}


def usage_series_exist(client: Prometheus, at: float, lookback: float) -> bool:
    """Whether any GPU's usage counters reached Prometheus in the ``lookback`` before ``at``
    (the per-GPU observed-time counter: the fewest series)."""
    return bool(client.vector(f"count(last_over_time({OBSERVED}[{_duration(lookback)}]))", at))
