"""``report --by served-model``: what each owner's served models produced, and what it cost.

Reads the ``usage`` processor's served-model counters (``docs/accounts.md``, "Usage
accounts"): ``gputally.usage.tokens`` per (owner, served model, engine), and per (owner,
served model, engine, GPU) ``gputally.usage.model.allocated.time``, ``.busy.time``,
``.energy``, ``.cost`` and ``.busy.cost``. Each counter's increase over the range is taken
the way `queries` takes the chargeback counters' (label sets that grow, resets, chunks), and
rows are owner x served model x GPU model (``hw.model``). Per row, with T = input + output
tokens:

* GPU-seconds per 1M tokens, allocated basis: model allocated time / T x 1e6; busy basis:
  model busy time / T x 1e6;
* joules per 1M tokens: model energy / T x 1e6;
* cost per 1M tokens, allocated basis: ``model.cost`` / T x 1e6 (allocated hours x price +
  kWh x energy price); busy basis: ``model.busy.cost`` / T x 1e6 (busy hours x price + kWh x
  energy price: what the tokens cost had the GPU been paid only while it computed).

Tokens of an engine on GPUs of one model meet the GPU time on GPUs of that model; tokens of
an engine on no known GPU (``hw.model`` unknown) make a row of their own, with no GPU time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .prometheus import Prometheus
from .queries import CURRENCY, HW_ID, INSTANCE, OWNER_ID, OWNER_KIND, CounterKey, Selector, _Counter
from .timerange import Range

__all__ = ["COUNTERS", "TOKENS", "Row", "Served", "fetch"]

MODEL = "gen_ai_request_model"
ENGINE = "gputally_inference_engine"
TOKEN_TYPE = "gen_ai_token_type"
GPU_MODEL = "hw_model"
TOKENS = "gputally_usage_tokens_total"
COUNTERS: dict[str, str] = {
    "allocated": "gputally_usage_model_allocated_time_seconds_total",
    "busy": "gputally_usage_model_busy_time_seconds_total",
    "energy": "gputally_usage_model_energy_joules_total",
    "cost": "gputally_usage_model_cost_total",
    "busy_cost": "gputally_usage_model_busy_cost_total",
}
"""Field of `Row` -> Prometheus name of the model counters."""
PER = 1e6


def _key(labels: dict[str, str], extra: str) -> CounterKey:
    """(instance, owner kind, owner id, hw id, served model, engine, the extra label)."""
    return (labels.get(INSTANCE, ""), labels.get(OWNER_KIND, ""), labels.get(OWNER_ID, ""), labels.get(HW_ID, ""),
            labels.get(MODEL, ""), labels.get(ENGINE, ""), labels.get(extra, ""))


@dataclass(slots=True)
class Row:
    """One owner's served model on GPUs of one model, over the range."""

    kind: str
    owner: str
    model: str
    gpu_model: str
    label: str = ""
    """The owner as shown: ``k8s.pod ns/name`` (pods are keyed by uid), ``slurm.job 4242``."""
    input: float = 0.0
    output: float = 0.0
    allocated: float = 0.0
    busy: float = 0.0
    energy: float = 0.0
    cost: dict[str, float] = field(default_factory=dict)
    busy_cost: dict[str, float] = field(default_factory=dict)
    engines: set[str] = field(default_factory=set)

    @property
    def tokens(self) -> float:
        return self.input + self.output

    def per_million(self, value: float) -> float | None:
        """``value`` per 1M tokens; None without tokens."""
        return value / self.tokens * PER if self.tokens > 0 else None

    def add(self, other: Row) -> None:
        self.input += other.input
        self.output += other.output
        self.allocated += other.allocated
        self.busy += other.busy
        self.energy += other.energy
        for mine, theirs in ((self.cost, other.cost), (self.busy_cost, other.busy_cost)):
            for currency, amount in theirs.items():
                mine[currency] = mine.get(currency, 0.0) + amount
        self.engines |= other.engines


@dataclass(slots=True)
class Served:
    range: Range
    rows: list[Row]
    total: Row
    currencies: list[str]


def _owner_label(kind: str, owner: str, labels: dict[str, str]) -> str:
    namespace, pod = labels.get("k8s_namespace_name"), labels.get("k8s_pod_name")
    if kind == "k8s.pod" and namespace and pod:
        return f"{kind} {namespace}/{pod}"
    return f"{kind} {owner}" if kind not in ("unattributed", "unallocated") else f"({kind})"


def fetch(client: Prometheus, rng: Range, *, chunk: float, lookback: float,
          progress: Callable[[int, int, float], None] | None = None) -> Served:
    """Every served-model account's increase over ``rng``, as rows."""
    labels: dict[tuple[str, ...], dict[str, str]] = {}
    counters = {"tokens": _Counter(client, TOKENS, Selector(), labels, TOKEN_TYPE, key=_key, width=6)}
    for field_, name in COUNTERS.items():
        counters[field_] = _Counter(client, name, Selector(), labels, CURRENCY, key=_key, width=6)
    for counter in counters.values():
        counter.start(rng.start, lookback)
    total = rng.count(chunk)
    for done, (a, b) in enumerate(rng.chunks(chunk), 1):
        for counter in counters.values():
            counter.window(a, b)
        if progress is not None:
            progress(done, total, b)
    rows: dict[tuple[str, str, str, str], Row] = {}
    for field_, counter in counters.items():
        for key, value in counter.total.items():
            account = labels.get(key[:6], {})
            kind, owner, model = key[1], key[2], key[4]
            gpu_model = account.get(GPU_MODEL, "")
            row = rows.get((kind, owner, model, gpu_model))
            if row is None:
                row = rows[(kind, owner, model, gpu_model)] = Row(kind, owner, model, gpu_model)
            shown = _owner_label(kind, owner, account)
            if not row.label or "/" in shown:  # a pod's name, once any of its series carried it
                row.label = shown
            row.engines.add(key[5])
            if field_ == "tokens":
                if key[6] == "input":
                    row.input += value
                elif key[6] == "output":
                    row.output += value
            elif field_ in ("cost", "busy_cost"):
                money = row.cost if field_ == "cost" else row.busy_cost
                money[key[6]] = money.get(key[6], 0.0) + value
            else:
                setattr(row, field_, getattr(row, field_) + value)
    ordered = sorted(rows.values(), key=lambda r: (-r.tokens, -r.allocated, r.label, r.model, r.gpu_model))
    everything = Row("", "", "", "", label="TOTAL")
    for row in ordered:
        everything.add(row)
    currencies = sorted(set(everything.cost) | set(everything.busy_cost))
    return Served(rng, ordered, everything, currencies)
