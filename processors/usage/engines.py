"""What an inference engine's resource says: whose engine it is, which GPUs and processes are
its own, and its token and busy-time counters per served model (``docs/accounts.md``, "Engine
points").

An engine resource is named by ``gputally.inference.engine``; its owner is named from its
process attributes by the same ``owners`` rules as a GPU process (``k8s`` and ``slurm`` have
written the pod uid or job id from its cgroup). Of its metrics, accounting reads two
cumulative sums: ``gputally.inference.tokens`` (``gen_ai.token.type`` input/output) and
``gputally.inference.busy.time``, each point of one served model (``gen_ai.request.model``).
Each distinct set of point attributes is one counter series with its own start time, so
that an engine restart (a new start time, a lower value) is seen per series. The histograms
and gauges pass through to the backend untouched: they are read there (dashboards, alerts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .owners import UNATTRIBUTED, Named, OwnerRules, Value

__all__ = [
    "BUSY", "ENGINE", "ENGINE_METRICS", "GPU_IDS", "GPU_PIDS", "MODEL", "TOKENS", "TOKEN_TYPE",
    "EngineDecision", "EngineReading", "Tag", "decide", "hold", "tag_of",
]

ENGINE = "gputally.inference.engine"
GPU_IDS = "gputally.inference.gpu.ids"
GPU_PIDS = "gputally.inference.gpu.pids"
MODEL = "gen_ai.request.model"
TOKEN_TYPE = "gen_ai.token.type"
TOKENS = "tokens"
BUSY = "busy"

ENGINE_METRICS: dict[str, tuple[str, float, int]] = {
    "gputally.inference.tokens": (TOKENS, 1.0, 0),
    "gputally.inference.busy.time": (BUSY, 1.0, 0),
}
"""metric name -> (role, scale, rank), as the GPU tables in ``observe``."""

IDENTITY = ("host.name", "server.address", "server.port", "process.linux.cgroup")
"""With the engine's name, what tells one endpoint from another, and stays the same when its
process restarts (a new pid, a new start time) or its owner's metadata arrives late: the
counters of one endpoint are one series however its attribution changes."""

Tag = tuple[str, str, str, tuple[tuple[str, str], ...]]
"""One counter series of an engine: (role, served model, token type, the point's other attributes)."""


@dataclass(frozen=True, slots=True)
class EngineDecision:
    """What an engine resource's bytes imply, decided once per distinct resource."""

    key: tuple[tuple[str, Value], ...]
    """The endpoint: its engine and `IDENTITY` attributes."""
    engine: str
    owner: Named
    gpus: tuple[str, ...]
    """``hw.id`` of the GPUs its container's processes run on."""
    pids: frozenset[int]
    """Those processes (matched against the GPUs' process resources)."""
    host: str = ""


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One engine resource at one point time: its counter series' (start time, value)."""

    decision: EngineDecision
    time_ns: int
    points: dict[Tag, tuple[int, float]]


def decide(attributes: Mapping[str, Any], rules: OwnerRules) -> EngineDecision | None:
    """The engine a resource names (None: not an engine's)."""
    engine = attributes.get(ENGINE)
    if not isinstance(engine, str) or not engine:
        return None
    gpus = attributes.get(GPU_IDS)
    pids = attributes.get(GPU_PIDS)
    owner = rules.process_owner(attributes)
    if owner[0] is UNATTRIBUTED:
        owner = (UNATTRIBUTED, ())
    host = attributes.get("host.name")
    return EngineDecision(
        key=((ENGINE, engine), *((k, attributes[k]) for k in IDENTITY if isinstance(attributes.get(k), str | int))),
        engine=engine,
        owner=owner,
        gpus=tuple(dict.fromkeys(g for g in gpus if isinstance(g, str) and g)) if isinstance(gpus, tuple) else (),
        pids=frozenset(p for p in pids if isinstance(p, int)) if isinstance(pids, tuple) else frozenset(),
        host=host if isinstance(host, str) else "",
    )


def tag_of(role: str, attributes: Iterable[Any]) -> Tag:
    """The series of a point of ``role`` with ``attributes`` (key/value messages whose string
    value is read: the usage schema's, on both ways of reading a request)."""
    model = token_type = ""
    rest: list[tuple[str, str]] = []
    for kv in attributes:
        if kv.key == MODEL:
            model = kv.value.string_value
        elif kv.key == TOKEN_TYPE:
            token_type = kv.value.string_value
        else:
            rest.append((kv.key, kv.value.string_value))
    return role, model, token_type, tuple(sorted(rest))


def hold(points: dict[Tag, tuple[int, float]], tag: Tag, start_ns: int, value: float) -> None:
    """Keep the first point of a series in one resource and time (as ``observe._hold`` keeps a
    GPU's first source of a role): both ways of reading a request keep the same one. A value
    that is not a count (NaN, infinite, negative) is left out here, so it never moves a series."""
    if tag not in points and math.isfinite(value) and value >= 0:
        points[tag] = (start_ns, value)
