"""The share of each owner's GPU time that served each model.

For every GPU interval the ledger integrates on a GPU that engines list, each owner's own
increase of allocated time, busy time and energy on that GPU (what ``ledger`` booked, after
every rule and check it applies) is split among the (served model, engine) pairs of that
owner's engines on the GPU, with one set of shares:

1. between engines: the utilization, in the GPU's sample, of each engine's GPU processes
   (``gputally.inference.gpu.pids`` against the GPU's process resources); else each engine's
   own busy time over its latest interval (``gputally.inference.busy.time``); else evenly;
2. between the models of one engine: each model's busy time over the engine's latest
   interval; else evenly.

An engine counts on a GPU while its latest reading lists the GPU and is no further than
``max_gap`` from the GPU's sample. So per GPU and interval, an owner's model accounts add up
to its own allocated time, busy time, energy and cost there (cost is linear in allocated time
and energy); an owner with no engine on the GPU has none. Allocated time goes by the same
shares as busy time: an idle interval is split evenly among the models being served.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .observe import Sample
from .owners import Owner
from .tokens import Engine, Serving

__all__ = ["ModelAccount", "ModelKey", "Models"]

ModelKey = tuple[Owner, str, str, str]
"""(owner, served model, engine, hw.id)."""


@dataclass(slots=True)
class ModelAccount:
    """One owner's GPU time that served one model on one engine, on one GPU, since ``start_ns``."""

    start_ns: int
    allocated: float = 0.0
    busy: float = 0.0
    energy: float = 0.0
    announced: bool = False


class Models:
    """The model accounts, booked from the GPU intervals of GPUs that engines list."""

    def __init__(self, serving: Serving, *, max_gap: float) -> None:
        self.serving = serving
        self.max_gap_ns = int(max_gap * 1e9)
        self.accounts: dict[ModelKey, ModelAccount] = {}

    def integrate(self, integrate: Callable[[str, Any, int, Sample], None], hw_id: str, device: Any, t: int,
                  sample: Sample) -> None:
        """Run the ledger's ``integrate`` for one GPU sample, then split what it booked for
        each owner among that owner's served models."""
        before = {owner: (a.allocated, a.busy, a.energy) for owner, a in device.accounts.items()}
        since = device.last_ns if device.last_ns is not None else t
        integrate(hw_id, device, t, sample)
        utilization: dict[int, float] | None = None
        for owner, account in device.accounts.items():
            allocated, busy, energy = before.get(owner, (0.0, 0.0, 0.0))
            increase = (account.allocated - allocated, account.busy - busy, account.energy - energy)
            if not any(increase):
                continue
            engines = self._engines(owner, hw_id, t)
            if not engines:
                continue
            if utilization is None:
                utilization = _by_pid(sample)
            for (model, engine), share in _shares(engines, utilization).items():
                key = (owner, model, engine, hw_id)
                booked = self.accounts.get(key)
                if booked is None:
                    booked = self.accounts[key] = ModelAccount(start_ns=since)
                booked.allocated += increase[0] * share
                booked.busy += increase[1] * share
                booked.energy += increase[2] * share

    def _engines(self, owner: Owner, hw_id: str, t: int) -> list[Engine]:
        found = []
        for key in self.serving.by_gpu.get(hw_id, ()):
            engine = self.serving.engines[key]
            if (engine.owner == owner and engine.last_ns is not None and engine.models
                    and abs(t - engine.last_ns) <= self.max_gap_ns):
                found.append(engine)
        found.sort(key=lambda e: e.decision.key)  # the same shares whatever the set's order
        return found

    def drop_owner(self, owner: Owner) -> None:
        for key in [k for k in self.accounts if k[0] == owner]:
            del self.accounts[key]

    def drop_gpu(self, hw_id: str) -> None:
        for key in [k for k in self.accounts if k[3] == hw_id]:
            del self.accounts[key]


def _by_pid(sample: Sample) -> dict[int, float]:
    """The GPU's process utilization in the sample, by pid (process keys are ``pid@creation``)."""
    out: dict[int, float] = {}
    for key, process in sample.processes.items():
        pid = key.split("@", 1)[0]
        if pid.isdigit() and process.utilization:
            out[int(pid)] = out.get(int(pid), 0.0) + max(process.utilization, 0.0)
    return out


def _even(count: int) -> list[float]:
    return [1 / count] * count


def _normed(weights: list[float]) -> list[float] | None:
    total = sum(weights)
    return [w / total for w in weights] if total > 0 else None


def _shares(engines: list[Engine], utilization: dict[int, float]) -> dict[tuple[str, str], float]:
    """(served model, engine) -> share of the owner's increase (adding up to 1)."""
    between = (_normed([sum(utilization.get(p, 0.0) for p in e.decision.pids) for e in engines])
               or _normed([sum(e.busy_rate.values()) for e in engines])
               or _even(len(engines)))
    out: dict[tuple[str, str], float] = {}
    for engine, share in zip(engines, between, strict=True):
        if share <= 0:
            continue
        models = engine.models
        within = _normed([engine.busy_rate.get(m, 0.0) for m in models]) or _even(len(models))
        for model, part in zip(models, within, strict=True):
            key = (model, engine.decision.engine)
            out[key] = out.get(key, 0.0) + share * part
    return out
