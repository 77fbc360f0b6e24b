"""Readings a GPU cannot have produced: refused before they are booked, counted and warned.

The ledger books what the readings say; this module says which parts of an interval no GPU
can have done, so that those parts are held out of the books (and shown as refused, per GPU
and why) while the rest of the interval is booked exactly as it would have been. The rules
(the README's "Refused readings" says them for users):

* ``energy_over_power_limit``: an energy delta above what the GPU can draw in the interval,
  ``limit x (MARGIN_FACTOR x dt + MARGIN_SECONDS)``. The limit is the highest power limit the
  GPU reports (the probes' ``gputally.gpu.power.limit``: enforced, and the most it may be
  set to; dcgm's ``DCGM_FI_DEV_*POWER*LIMIT*``), else :data:`MODEL_BOUNDS` by ``hw.model``,
  else none (then no energy is refused). The margin covers the energy being read a little
  before or after the sample's timestamp and the short excursions above the limit a GPU
  makes. The interval's energy is refused; its time and busy time are booked.
* ``energy_counter_reset``: the counter went down (a driver reload, a GPU reset). Its new
  value is what the GPU used since it restarted, inside the interval: that is booked (what
  the energy before the restart was, nobody counted). It is refused only where even that is
  more than the GPU could draw in the whole interval (a counter fault, not a restart).
* ``busy_over_wall``: a utilization above 100 %. The interval is booked as fully busy (the
  most any reading can mean) and the excess, ``(utilization - 1) x dt``, is refused.
* ``clock_backwards``: a reading stamped before the GPU's last one, whose energy counter is
  past every value the GPU has shown: a new reading on a clock that went back (an NTP step),
  not a late copy of an old one. The GPU's integration starts again from it (nothing before
  it is booked twice, nothing after it is lost); the interval across the jump has no length on
  any clock and is not booked: its energy is refused. Without an energy counter a reading
  behind the GPU's clock cannot be told from a late one, and is ignored as late.

Each refusal is counted (:attr:`Plausibility.counts`, the ``gputally_usage_refused_total``
self-metric) and added to its GPU's :class:`Refused` (the ``gputally.usage.refused.*``
counters). The first of each cause on each GPU leaves a warning in :attr:`Plausibility.warnings`
for the runtime to log: the ledger does no I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fnmatch import fnmatch

__all__ = [
    "MARGIN_FACTOR", "MARGIN_SECONDS", "MODEL_BOUNDS", "REASONS", "Plausibility", "Refused",
]

ENERGY_OVER_POWER_LIMIT = "energy_over_power_limit"
ENERGY_COUNTER_RESET = "energy_counter_reset"
BUSY_OVER_WALL = "busy_over_wall"
CLOCK_BACKWARDS = "clock_backwards"
REASONS = (ENERGY_OVER_POWER_LIMIT, ENERGY_COUNTER_RESET, BUSY_OVER_WALL, CLOCK_BACKWARDS)
"""Every ``gputally.usage.refused.reason``, in the order the README lists them."""

MARGIN_FACTOR = 1.2
MARGIN_SECONDS = 1.0
"""Energy allowed in an interval of ``dt`` seconds: ``limit x (MARGIN_FACTOR x dt + MARGIN_SECONDS)``.
A recorded H200 at its 700 W limit showed 717 W over a 2.02 s interval (its energy read a few
ms off the sample time); at 2 s this allows 2,380 J, at 60 s 51 kJ."""

MODEL_BOUNDS: tuple[tuple[str, float], ...] = (
    ("nvidia gb300*", 1400.0), ("nvidia b300*", 1400.0), ("nvidia gb200*", 1200.0), ("nvidia b200*", 1200.0),
    ("nvidia h200*", 700.0), ("nvidia h100*", 700.0), ("nvidia h800*", 700.0), ("nvidia h20*", 500.0),
    ("nvidia a100*", 500.0), ("nvidia a800*", 500.0), ("nvidia l40*", 350.0), ("nvidia l4", 75.0),
    ("*mi355x*", 1400.0), ("*mi325x*", 1000.0), ("*mi300x*", 750.0), ("*mi250*", 560.0),
    ("*gaudi3*", 900.0), ("*hl-325*", 900.0), ("*gaudi2*", 600.0), ("*hl-225*", 600.0),
)
"""Where a GPU reports no power limit (dcgm-exporter's default counters): the highest limit
any board of the model family ships with (glob on ``hw.model``, lower case, first match).
Conservative on purpose: it only has to catch what no such GPU can do."""

_WARNED_LIMIT = 100_000
_UNKNOWN = object()
_UTILIZATION_SLACK = 1e-9
"""Utilizations are whole percent (NVML, dcgm) or ratios: 100 % read as 1.0000000001 is 100 %."""


@dataclass(slots=True)
class Refused:
    """What one GPU's readings claimed that was not booked, for one reason (cumulative)."""

    time: float = 0.0
    """Seconds: busy time above wall time."""
    energy: float = 0.0
    """Joules: energy above the power bound, a reset counter's impossible value, a jump's."""
    count: int = 0
    """Intervals (readings) refused."""
    announced: bool = False
    """Sent once (with its 0 at the GPU's start time)."""


class Plausibility:
    """The checks of one ledger: counts per reason, and who has been warned about what."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        """Refusals by reason, since the start (a self-metric)."""
        self.warnings: list[str] = []
        """One line per (GPU, reason) the first time it happens, for the runtime to log."""
        self._warned: set[tuple[str, str]] = set()
        self._models: dict[str, object] = {}

    # -- bounds --------------------------------------------------------------------------

    def power_bound(self, power_limit: float | None, attributes: tuple[tuple[str, object], ...]) -> float | None:
        """Watts no reading of this GPU can average above: its own limit, else its model's
        (``hw.model`` among its attributes), else None."""
        if power_limit is not None and power_limit > 0:
            return power_limit
        model = next((v for k, v in attributes if k == "hw.model"), "")
        key = str(model).lower()
        bound = self._models.get(key, _UNKNOWN)
        if bound is _UNKNOWN:
            bound = self._models[key] = next((w for glob, w in MODEL_BOUNDS if key and fnmatch(key, glob)), None)
        return bound if isinstance(bound, float) else None

    @staticmethod
    def energy_bound(watts: float, dt: float) -> float:
        return watts * (MARGIN_FACTOR * dt + MARGIN_SECONDS)

    # -- the checks (called by the ledger) ------------------------------------------------

    def energy(self, hw_id: str, refused: dict[str, Refused], before: float, now: float, dt: float,
               watts: float | None) -> float:
        """The joules to book for an interval whose counter went from ``before`` to ``now``."""
        delta = now - before
        reason = ENERGY_OVER_POWER_LIMIT
        if delta < 0:  # the counter restarted: it counts from zero again
            delta, reason = now, ENERGY_COUNTER_RESET
            if watts is None or delta <= self.energy_bound(watts, dt):
                self._refuse(hw_id, refused, reason, 0.0, 0.0,
                             f"GPU {hw_id}: its energy counter went down from {before:.0f} J to {now:.0f} J "
                             f"(a driver reload or a GPU reset): booked {now:.0f} J, what it counted since; "
                             "what it used before the restart in that interval was never counted")
                return delta
        if watts is None or delta <= self.energy_bound(watts, dt):
            return delta
        self._refuse(hw_id, refused, reason, 0.0, delta,
                     f"GPU {hw_id}: refused {delta:.0f} J in {dt:.3f} s ({delta / dt if dt else float('inf'):.0f} W "
                     f"from a GPU limited to {watts:.0f} W); that interval's energy is not booked")
        return 0.0

    def busy(self, hw_id: str, refused: dict[str, Refused], utilization: float, dt: float) -> float:
        """The utilization to book for a reading above 100 %: 100 %, the excess refused."""
        if utilization <= 1.0 + _UTILIZATION_SLACK:
            return 1.0
        self._refuse(hw_id, refused, BUSY_OVER_WALL, (utilization - 1.0) * dt, 0.0,
                     f"GPU {hw_id}: utilization {utilization * 100:.0f} %: booked {dt:.3f} s busy "
                     f"in {dt:.3f} s and refused the rest")
        return 1.0

    def backwards(self, hw_id: str, refused: dict[str, Refused], time_ns: int, last_ns: int,
                  energy: float | None, last_energy: float | None, highest: float | None) -> bool:
        """Whether a reading behind the GPU's last one is a new reading on a clock that went
        back (its energy counter is past every value seen), rather than a late copy."""
        if energy is None or highest is None or last_energy is None or energy <= highest:
            return False
        self._refuse(hw_id, refused, CLOCK_BACKWARDS, 0.0, energy - last_energy,
                     f"GPU {hw_id}: its clock went back {(last_ns - time_ns) / 1e9:.3f} s (its energy counter "
                     "went on): integrating again from that reading; the interval across the jump "
                     f"({energy - last_energy:.0f} J) is not booked")
        return True

    def _refuse(self, hw_id: str, refused: dict[str, Refused], reason: str, time: float, energy: float,
                warning: str) -> None:
        entry = refused.get(reason)
        if entry is None:
            entry = refused[reason] = Refused()
        entry.time += time
        entry.energy += energy
        entry.count += 1
        self.counts[reason] += 1
        key = (hw_id, reason)
        if key not in self._warned:
            if len(self._warned) >= _WARNED_LIMIT:
                self._warned.clear()
            self._warned.add(key)
            self.warnings.append(f"{warning} [{reason}; warned once per GPU and cause, "
                                 "counted in gputally_usage_refused_total]")

    def drain_warnings(self) -> list[str]:
        warnings, self.warnings = self.warnings, []
        return warnings
