"""The chargeback table: accounts grouped by one dimension, one row per group and a TOTAL.

Accounts that lack the dimension's label are not dropped, so that the TOTAL is every GPU's
observed time: the owner kinds ``unallocated`` (a GPU nobody held: the fleet's idle capacity,
OpenCost's ``__idle__``) and ``unattributed`` (work of processes no rule named) are
rows of their own, ``(unallocated)`` and ``(unattributed)``, whatever the grouping but the
model (a model's row holds all the time and work of its GPUs); any
other account without the label goes to ``(no namespace)``, ``(no job)``... (a Slurm job has
no namespace, a pod no job).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .queries import OWNER_ID, OWNER_KIND, Account

__all__ = ["BY", "Figures", "Row", "Table", "build"]

BY: dict[str, tuple[tuple[str, str], ...]] = {
    "owner": (("owner_kind", OWNER_KIND), ("owner_id", OWNER_ID)),
    "namespace": (("namespace", "k8s_namespace_name"),),
    "pod": (("namespace", "k8s_namespace_name"), ("pod", "k8s_pod_name")),
    "job": (("job", "slurm_job_id"),),
    "user": (("user", "slurm_job_user"),),
    "account": (("account", "slurm_job_account"),),
    "partition": (("partition", "slurm_job_partition"),),
    "model": (("model", "hw_model"),),
}
"""``--by`` -> (column name, Prometheus label) pairs that make a row's key."""

SPECIAL_KINDS = ("unallocated", "unattributed")


@dataclass(slots=True)
class Figures:
    """Sums over accounts: seconds, joules, money per currency."""

    allocated: float = 0.0
    busy: float = 0.0
    idle: float = 0.0
    energy: float = 0.0
    cost: dict[str, float] = field(default_factory=dict)
    gpus: set[str] = field(default_factory=set)
    peak_memory: float | None = None
    """Bytes: the most GPU memory any of the accounts' processes held on one GPU (a maximum,
    not a sum); None when no account emitted a peak."""

    def add(self, account: Account) -> None:
        self.allocated += account.allocated
        self.busy += account.busy
        self.idle += account.idle
        self.energy += account.energy
        if account.peak_memory is not None:
            self.peak_memory = max(self.peak_memory or 0.0, account.peak_memory)
        for currency, amount in account.cost.items():
            self.cost[currency] = self.cost.get(currency, 0.0) + amount
        self.gpus.add(account.hw_id)

    @property
    def allocated_hours(self) -> float:
        return self.allocated / 3600

    @property
    def busy_hours(self) -> float:
        return self.busy / 3600

    @property
    def idle_hours(self) -> float:
        return self.idle / 3600

    @property
    def energy_kwh(self) -> float:
        return self.energy / 3.6e6

    @property
    def efficiency(self) -> float | None:
        """Busy over allocated time; None without allocated time (a process on a GPU others hold).
        Above 1 on a time-sliced GPU: a holder whose process did more than its share of the time."""
        return self.busy / self.allocated if self.allocated > 0 else None


@dataclass(slots=True)
class Row:
    label: str
    """What the table shows: ``ml``, ``slurm.job 4242``, ``(unallocated)``, ``(no namespace)``."""
    group: dict[str, str | None]
    """Column name -> value; None for a special row's missing label."""
    figures: Figures = field(default_factory=Figures)
    special: bool = False


@dataclass(slots=True)
class Table:
    by: str
    columns: tuple[str, ...]
    rows: list[Row]
    total: Figures
    currencies: list[str]
    unattributed: dict[str, float] = field(default_factory=dict)
    """Reason -> seconds of the GPUs' busy time that no rule attributed (`queries.Usage`)."""
    refused: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Reason -> (seconds, joules) refused as impossible, not booked (`queries.Usage`)."""


def _row_of(account: Account, by: str) -> tuple[str, dict[str, str | None], bool]:
    names = BY[by]
    if account.kind in SPECIAL_KINDS and not (by == "model" and account.labels.get("hw_model")):
        # A model's row counts all the work on that model, the unallocated and unattributed too.
        return f"({account.kind})", {name: (account.kind if by == "owner" else None) for name, _ in names}, True
    values = {name: account.labels.get(label) or None for name, label in names}
    if any(v is None for v in values.values()):
        missing = next(name for name, v in values.items() if v is None)
        return f"(no {missing})", values, True
    if by == "owner":
        owner = values["owner_id"]
        namespace, pod = account.labels.get("k8s_namespace_name"), account.labels.get("k8s_pod_name")
        if values["owner_kind"] == "k8s.pod" and namespace and pod:  # keyed by uid, shown by name
            owner = f"{namespace}/{pod}"
        return f"{values['owner_kind']} {owner}", values, False
    return "/".join(str(v) for v in values.values()), values, False


def build(accounts: Iterable[Account], by: str) -> Table:
    """Group ``accounts`` by ``by`` (a key of `BY`). Rows by allocated time (then busy time), the
    special rows last."""
    rows: dict[str, Row] = {}
    total = Figures()
    for account in accounts:
        label, group, special = _row_of(account, by)
        key = f"{label}\0{group.get('owner_id') if by == 'owner' else ''}"  # one row per owner, whatever its name
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(label, group, special=special)
        row.figures.add(account)
        total.add(account)
    ordered: Sequence[Row] = sorted(
        rows.values(), key=lambda r: (r.special, -r.figures.allocated, -r.figures.busy, r.label))
    return Table(by, tuple(name for name, _ in BY[by]), list(ordered), total, sorted(total.cost))
