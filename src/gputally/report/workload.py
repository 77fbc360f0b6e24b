"""One workload's view (``gputally report job 4242``, ``report pod ml/trainer-0``): who, where,
when, one line per GPU, and notes like the usage processor's end-of-allocation summary.

Utilization is busy over allocated time. A GPU the workload ran on without holding it (its
process on a GPU allocated to someone else) has no allocated time, so no utilization: it is
shown as ``-`` and noted. The notes' thresholds default to the processor's ``summary`` keys
(`gputally.processors.usage.config.SummaryConfig`), so the report and the summary event agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .queries import Account, Usage
from .table import Figures

__all__ = ["GIB", "GpuLine", "Thresholds", "Workload", "build"]

GIB = float(1 << 30)
OWNER_LABELS = ("slurm_", "k8s_", "gputally_k8s_", "gputally_usage_owner_")
"""The labels that describe the owner (the rest describe a GPU: they go on its line)."""
KINDS = {"job": "slurm.job", "pod": "k8s.pod"}
"""The view's word -> ``gputally_usage_owner_kind``."""


@dataclass(frozen=True, slots=True)
class Thresholds:
    low_utilization: float = 0.15
    unused_below: float = 0.01
    low_memory: float = 0.25


@dataclass(slots=True)
class GpuLine:
    """The workload on one GPU (summed over gputally instances, should it have moved)."""

    hw_id: str
    index: str
    model: str
    host: str
    figures: Figures = field(default_factory=Figures)
    peak_memory: float | None = None
    memory_limit: float | None = None

    @property
    def utilization(self) -> float | None:
        return self.figures.efficiency


@dataclass(slots=True)
class Workload:
    kind: str
    id: str
    labels: dict[str, str]
    first_seen: float | None
    last_seen: float | None
    hosts: list[str]
    gpus: list[GpuLine]
    total: Figures
    currencies: list[str]
    notes: list[str]


def _gib(value: float) -> str:
    return f"{value / GIB:.1f}" if value < 10 * GIB else f"{value / GIB:.0f}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def notes(gpus: list[GpuLine], thresholds: Thresholds, held_by: set[str] | None = None) -> list[str]:
    """What an operator should look at, in the summary event's words. ``held_by``: the GPUs
    someone held in the range (None: not known), so a GPU the workload ran on without holding
    it is said to be others' only when it was."""
    out: list[str] = []
    held = [g for g in gpus if g.figures.allocated > 0]
    unused = [g for g in held if g.figures.busy / g.figures.allocated < thresholds.unused_below]
    if unused:
        out.append(f"did not use {len(unused)} of {len(held)} allocated GPU{'' if len(held) == 1 else 's'}")
    allocated = sum(g.figures.allocated for g in held)
    if held:
        mean = sum(g.figures.busy for g in held) / allocated
        if mean < thresholds.low_utilization:
            out.append(f"mean utilization {mean * 100:.0f} % on {_plural(len(held), 'GPU')}")
    guests = [g for g in gpus if g.figures.allocated == 0]
    others = [g for g in guests if held_by is None or g.hw_id in held_by]
    if others:
        out.append(f"ran on {_plural(len(others), 'GPU')} allocated to others: no allocated time, so no utilization")
    if len(others) < len(guests):
        out.append(f"ran on {_plural(len(guests) - len(others), 'GPU')} nobody had allocated: no allocated time, "
                   "so no utilization")
    peak = max((g for g in gpus if g.peak_memory is not None), key=lambda g: g.peak_memory or 0.0, default=None)
    if peak is not None and peak.peak_memory is not None and peak.memory_limit:
        if peak.peak_memory / peak.memory_limit < thresholds.low_memory:
            out.append(f"peak memory {_gib(peak.peak_memory)} GiB of {_gib(peak.memory_limit)} GiB: "
                       "a smaller MIG profile would do")
    return out


def build(kind: str, owner: str, usage: Usage, *, limits: dict[str, float],
          seen: tuple[float, float] | None, thresholds: Thresholds, held: set[str] | None = None) -> Workload:
    """The view of ``owner`` (of ``kind``: ``slurm.job`` or ``k8s.pod``) from its accounts."""
    lines: dict[str, GpuLine] = {}
    labels: dict[str, str] = {}
    total = Figures()
    account: Account
    for account in usage.accounts:
        labels.update({k: v for k, v in account.labels.items() if k.startswith(OWNER_LABELS)})
        line = lines.get(account.hw_id)
        if line is None:
            host = account.labels.get("host_name") or account.labels.get("k8s_node_name") or ""
            line = lines[account.hw_id] = GpuLine(
                account.hw_id, account.labels.get("gputally_gpu_index", ""), account.labels.get("hw_model", ""), host,
                memory_limit=limits.get(account.hw_id))
        line.figures.add(account)
        if account.peak_memory is not None:
            line.peak_memory = max(line.peak_memory or 0.0, account.peak_memory)
        total.add(account)
    gpus = sorted(lines.values(), key=lambda g: (g.host, _index(g.index), g.hw_id))
    hosts = sorted({g.host for g in gpus if g.host})
    first, last = seen if seen is not None else (None, None)
    return Workload(kind, owner, labels, first, last, hosts, gpus, total, sorted(total.cost), notes(gpus, thresholds, held))


def _index(index: str) -> tuple[int, str]:
    """GPU 10 after GPU 9; MIG indices (``0/1``) by their text."""
    return (int(index), "") if index.isdigit() else (1 << 30, index)
