"""The engines' series and the token and model accounts on disk, inside the ledger's file
(``storage``): so that after a restart each series continues from its saved value (nothing
counted twice, nothing lost) and the counters keep their start times."""

from __future__ import annotations

from typing import Any

from .engines import EngineDecision
from .ledger import Ledger
from .models import ModelAccount, Models
from .owners import Owner, owner
from .tokens import Engine, Series, Serving, TokenAccount

__all__ = ["restore", "saved"]


def _pairs(items: Any) -> tuple[tuple[str, Any], ...]:
    return tuple((str(k), v) for k, v in items)


def _owner(entry: Any) -> Owner:
    return owner(str(entry[0]), str(entry[1]))


def saved(ledger: Ledger) -> dict[str, Any]:
    """What `restore` reads back (JSON types only)."""
    serving = ledger.serving
    return {
        "forgotten_ns": serving.forgotten_ns,
        "engines": [
            {
                "key": list(e.decision.key), "engine": e.decision.engine,
                "owner": [e.decision.owner[0].kind, e.decision.owner[0].id, list(e.decision.owner[1])],
                "gpus": list(e.decision.gpus), "pids": sorted(e.decision.pids), "host": e.decision.host,
                "last_ns": e.last_ns, "models": list(e.models), "busy_rate": e.busy_rate,
                "series": [[list(tag[:3]), list(tag[3]), s.start_ns, s.value, s.last_ns] for tag, s in e.series.items()],
            }
            for e in serving.engines.values() if e.last_ns is not None
        ],
        "tokens": [[k[0].kind, k[0].id, k[1], k[2], a.start_ns, a.input, a.output, a.host, list(a.gpus), a.announced]
                   for k, a in serving.tokens.items()],
        "models": [[k[0].kind, k[0].id, k[1], k[2], k[3], a.start_ns, a.allocated, a.busy, a.energy, a.announced]
                   for k, a in ledger.models.accounts.items()],
    }


def restore(ledger: Ledger, state: Any, *, start_ns: int) -> tuple[Serving, Models]:
    """The ledger's serving part from `saved`'s output (None: a file from before engines), for
    counters that began at ``start_ns``. Raises ValueError, KeyError, TypeError or IndexError
    on a file that is not that."""
    serving = Serving(settle=ledger.config.settle, start_ns=start_ns, max_engines=ledger.config.max_owners)
    models = Models(serving, max_gap=ledger.config.max_gap)
    if state is None:
        return serving, models
    serving.forgotten_ns = int(state["forgotten_ns"])
    for entry in state["engines"]:
        kind, owner_id, attributes = entry["owner"]
        decision = EngineDecision(
            key=_pairs(entry["key"]), engine=str(entry["engine"]),
            owner=(owner(str(kind), str(owner_id)), _pairs(attributes)),
            gpus=tuple(str(g) for g in entry["gpus"]), pids=frozenset(int(p) for p in entry["pids"]),
            host=str(entry["host"]),
        )
        engine = Engine(decision, owner=decision.owner[0], last_ns=int(entry["last_ns"]),
                        models=tuple(str(m) for m in entry["models"]),
                        busy_rate={str(m): float(r) for m, r in entry["busy_rate"].items()})
        for head, rest, start_ns, value, last_ns in entry["series"]:
            role, model, token_type = (str(v) for v in head)
            tag = (role, model, token_type, tuple((str(k), str(v)) for k, v in rest))
            engine.series[tag] = Series(int(start_ns), float(value), int(last_ns))
        serving.engines[decision.key] = engine
        for hw_id in decision.gpus:
            serving.by_gpu.setdefault(hw_id, set()).add(decision.key)
    for kind, owner_id, model, engine_name, start_ns, input_, output, host, gpus, announced in state["tokens"]:
        serving.tokens[(_owner([kind, owner_id]), str(model), str(engine_name))] = TokenAccount(
            start_ns=int(start_ns), input=float(input_), output=float(output), host=str(host),
            gpus=tuple(str(g) for g in gpus), announced=bool(announced))
    for kind, owner_id, model, engine_name, hw_id, start_ns, allocated, busy, energy, announced in state["models"]:
        models.accounts[(_owner([kind, owner_id]), str(model), str(engine_name), str(hw_id))] = ModelAccount(
            start_ns=int(start_ns), allocated=float(allocated), busy=float(busy), energy=float(energy),
            announced=bool(announced))
    return serving, models
