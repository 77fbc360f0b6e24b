"""Engines in the ledger: their counter series, and the tokens each owner's served models produced.

Pure bookkeeping beside :class:`~.ledger.Ledger` (which owns one :class:`Serving`): engine
readings come in with their point time and are held ``settle`` seconds like GPU samples, then
integrated in time order, per engine endpoint. Rules:

* A series (engine endpoint, served model, token type or busy time) is cumulative. Its increase
  is the new value minus the last one, or, on a reset (a new start time, or a value below the
  last: an engine restart), the new value: what the new run counted. So a restart loses
  nothing and counts nothing twice.
* A reading no newer than the engine's last one (a duplicate, a retry, a late request) changes
  nothing: the counter is cumulative, the newer value already holds it.
* A series seen for the first time counts its whole value if it started (its start time)
  after the ledger's own counters began and after any series was last forgotten; otherwise
  (it was counting before anyone here counted, or it may be one forgotten and seen again) its
  first value is only the base of the next increase. Series are forgotten one day after their
  engine was last seen.
* Tokens are booked to the engine's owner (named from its process attributes by the
  ``owners`` rules), per (owner, served model, engine), input and output apart.

How GPU time is split among the served models is :mod:`.models`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .engines import BUSY, TOKENS, EngineDecision, EngineReading, Tag
from .owners import Named, Owner, Value

__all__ = ["FORGET_AFTER_NS", "Engine", "Series", "Serving", "TokenAccount", "TokenKey"]

FORGET_AFTER_NS = 86_400 * 10**9
"""How long an engine's series are kept after it was last seen: an engine back within it
(a probe or node outage) continues its series exactly."""
TOKEN_TYPES = ("input", "output")
_NS = 1e9

TokenKey = tuple[Owner, str, str]
"""(owner, served model, engine)."""


@dataclass(slots=True)
class Series:
    """Where one cumulative series of an engine stands."""

    start_ns: int
    value: float
    last_ns: int


@dataclass(slots=True)
class _Held:
    decision: EngineDecision
    points: dict[Tag, tuple[int, float]]
    arrived: float


@dataclass(slots=True)
class Engine:
    """One engine endpoint: its latest resource, its series, what it served lately."""

    decision: EngineDecision
    owner: Owner | None = None
    last_ns: int | None = None
    series: dict[Tag, Series] = field(default_factory=dict)
    models: tuple[str, ...] = ()
    """The served models of its latest reading."""
    busy_rate: dict[str, float] = field(default_factory=dict)
    """Served model -> the engine's busy seconds per second over its latest interval."""
    pending: dict[int, _Held] = field(default_factory=dict)


@dataclass(slots=True)
class TokenAccount:
    """One owner's tokens of one served model on one engine, since ``start_ns``."""

    start_ns: int
    input: float = 0.0
    output: float = 0.0
    host: str = ""
    gpus: tuple[str, ...] = ()
    """The engine's GPUs, latest reading (their model goes on the counters)."""
    announced: bool = False


class Serving:
    """Every engine's series, and the token accounts they feed."""

    def __init__(self, *, settle: float, start_ns: int, max_engines: int = 100_000) -> None:
        self.settle_s = settle
        self.max_engines = max_engines
        """Beyond it the longest-unseen engine is forgotten (as if a day had passed)."""
        self.start_ns = start_ns
        """When the ledger's counters began: a new series that started later counts in full."""
        self.forgotten_ns = 0
        """The latest time a forgotten series was seen: a new series must have started after it."""
        self.engines: dict[tuple[tuple[str, Value], ...], Engine] = {}
        self.by_gpu: dict[str, set[tuple[tuple[str, Value], ...]]] = {}
        """hw.id -> the engines whose latest reading lists it."""
        self.tokens: dict[TokenKey, TokenAccount] = {}
        self.late = 0
        self.resets = 0
        self.evicted = 0
        self._pending: set[tuple[tuple[str, Value], ...]] = set()

    @property
    def pending(self) -> bool:
        """Whether readings wait to be settled."""
        return bool(self._pending)

    # -- intake ----------------------------------------------------------------------------

    def add(self, readings: Iterable[EngineReading], *, arrived: float) -> None:
        """Hold each reading until it is settled; one for an engine's integrated time is ignored."""
        for reading in readings:
            key = reading.decision.key
            engine = self.engines.get(key)
            if engine is None:
                if len(self.engines) >= self.max_engines:
                    self._forget_oldest()
                engine = self.engines[key] = Engine(reading.decision)
            if engine.last_ns is not None and reading.time_ns <= engine.last_ns:
                self.late += 1
                continue
            held = engine.pending.get(reading.time_ns)
            if held is None:
                engine.pending[reading.time_ns] = _Held(reading.decision, dict(reading.points), arrived)
                self._pending.add(key)
            else:  # the same engine and time in another resource or request: the later one's points win
                held.decision = reading.decision
                held.points.update(reading.points)

    def settle(self, now: float, *, everything: bool, see: Callable[[Named, tuple[str, ...], int], Owner]) -> int:
        """Integrate the readings that arrived ``settle`` seconds ago (all with ``everything``);
        ``see`` names an owner seen at a time on GPUs. The newest time integrated (0: none)."""
        limit = now - self.settle_s
        newest = 0
        for key in list(self._pending):
            engine = self.engines[key]
            due = sorted(t for t, held in engine.pending.items() if everything or held.arrived <= limit)
            for t in due:
                held = engine.pending.pop(t)
                if engine.last_ns is not None and t <= engine.last_ns:
                    self.late += 1
                    continue
                self._integrate(key, engine, t, held, see)
                newest = max(newest, t)
            if not engine.pending:
                self._pending.discard(key)
        return newest

    # -- integration -----------------------------------------------------------------------

    def _integrate(self, key: Any, engine: Engine, t: int, held: _Held,
                   see: Callable[[Named, tuple[str, ...], int], Owner]) -> None:
        decision = held.decision
        self._place(key, engine, decision)
        owner = engine.owner = see(decision.owner, decision.gpus, t)
        dt = (t - engine.last_ns) / _NS if engine.last_ns is not None else 0.0
        models: dict[str, None] = {}
        busy: dict[str, float] = {}
        for tag, (start_ns, value) in held.points.items():
            role, model, token_type, _ = tag
            models[model] = None
            series = engine.series.get(tag)
            delta = self._increase(series, start_ns, value)
            if series is None:
                engine.series[tag] = Series(start_ns, value, t)
                since = start_ns if start_ns > 0 else t
            else:
                since = series.last_ns
                series.start_ns, series.value, series.last_ns = start_ns or series.start_ns, value, t
            if delta <= 0:
                continue
            if role == TOKENS and token_type in TOKEN_TYPES:
                account = self.tokens.get((owner, model, decision.engine))
                if account is None:
                    account = self.tokens[(owner, model, decision.engine)] = TokenAccount(start_ns=since)
                if token_type == "input":
                    account.input += delta
                else:
                    account.output += delta
                account.host, account.gpus = decision.host, decision.gpus
            elif role == BUSY:
                busy[model] = busy.get(model, 0.0) + delta
        engine.models = tuple(models)
        engine.busy_rate = {m: b / dt for m, b in busy.items()} if dt > 0 else {}
        engine.last_ns = t

    def _increase(self, series: Series | None, start_ns: int, value: float) -> float:
        """What a series counted since its last reading (see the module docstring)."""
        if series is None:
            counted_from = max(self.start_ns, self.forgotten_ns)
            return value if start_ns > 0 and start_ns >= counted_from else 0.0
        if (start_ns and series.start_ns and start_ns != series.start_ns) or value < series.value:
            self.resets += 1
            return value
        return value - series.value

    def _place(self, key: Any, engine: Engine, decision: EngineDecision) -> None:
        """Keep `by_gpu` on the GPUs of the engine's latest resource."""
        old = engine.decision
        if old is not decision and old.gpus != decision.gpus:
            for hw_id in old.gpus:
                self._unlist(hw_id, key)
        engine.decision = decision
        for hw_id in decision.gpus:
            self.by_gpu.setdefault(hw_id, set()).add(key)

    def _unlist(self, hw_id: str, key: Any) -> None:
        engines = self.by_gpu.get(hw_id)
        if engines is not None:
            engines.discard(key)
            if not engines:
                del self.by_gpu[hw_id]

    # -- ends ------------------------------------------------------------------------------

    def drop_owner(self, owner: Owner) -> None:
        """An owner has ended: its token accounts go (their last values went out)."""
        for key in [k for k in self.tokens if k[0] == owner]:
            del self.tokens[key]

    def forget(self, watermark: int) -> None:
        """Forget the engines not seen for `FORGET_AFTER_NS` before ``watermark``."""
        cutoff = watermark - FORGET_AFTER_NS
        for key, engine in list(self.engines.items()):
            if engine.pending or engine.last_ns is None or engine.last_ns >= cutoff:
                continue
            self._forget(key, engine)

    def _forget(self, key: Any, engine: Engine) -> None:
        self.forgotten_ns = max(self.forgotten_ns, engine.last_ns or 0)
        for hw_id in engine.decision.gpus:
            self._unlist(hw_id, key)
        self._pending.discard(key)
        del self.engines[key]

    def _forget_oldest(self) -> None:
        key = min(self.engines, key=lambda k: self.engines[k].last_ns or 0)
        self._forget(key, self.engines[key])
        self.evicted += 1
