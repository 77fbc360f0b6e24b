"""The accounting itself: GPU time, busy time, idle time, energy and peak memory per (owner, GPU).

Pure bookkeeping, no I/O and no clock of its own: readings come in with their sample time,
the caller says what time it is. Rules ("Who pays" in docs/usage.md says them for users):

* Time is integrated between consecutive samples of one GPU, by their sample timestamps. A
  sample is held for ``settle`` seconds (so a GPU's processes sent in another request, and
  requests that arrive out of order, are in) and then integrated in time order. A sample no
  newer than the last one integrated changes nothing: duplicates and late requests are
  ignored (and counted). Samples further apart than ``max_gap`` are not integrated: that
  time is unobserved.
* Allocated time: each interval's length, split evenly among the GPU's allocation owners
  (``unallocated`` when nobody holds it), so every GPU's owners add up to its observed time.
* Busy time: utilization x interval, split by the processes' utilization shares (equally
  among the owners of the processes present when none reports a share, equally among the
  allocation owners when no process is known).
* Energy: the GPU's counter delta (a decrease is a reset: the new value is the delta), split
  like busy time while the GPU is busy, to the allocation owners while it is idle.
* Idle time: allocated time during which the owner's utilization of its share was below
  ``idle_below``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import Any

from .config import UsageConfig
from .engines import EngineReading
from .models import Models
from .observe import DeviceReading, Observation, ProcessReading, Sample
from .owners import UNALLOCATED, UNATTRIBUTED, Named, Owner, Value
from .tokens import Serving

__all__ = ["OWNER_ID", "OWNER_KIND", "Account", "Device", "Event", "Ledger", "OwnerState"]

OWNER_KIND = "gputally.usage.owner.kind"
OWNER_ID = "gputally.usage.owner.id"
SERVICE_NAME = "service.name"
SERVICE_INSTANCE = "service.instance.id"

_NS = 1e9
_GIB = float(1 << 30)


@dataclass(slots=True)
class Account:
    """One owner on one GPU: cumulative counters since ``start_ns``."""

    start_ns: int
    allocated: float = 0.0
    busy: float = 0.0
    idle: float = 0.0
    energy: float = 0.0
    present: float = 0.0
    """Time the owner held the GPU or ran on it (the denominator of its mean utilization)."""
    peak_memory: float = 0.0
    idle_since: int | None = None
    """Sample time the current idle spell began (None: not idle)."""
    idle_kind: str = ""
    warned: bool = False
    unattributed: float = 0.0
    """Busy time on the GPU that no rule attributed, while the owner held it or ran on it: its
    own share of it may be in there, so its idle spells and summary notes leave that time out."""
    announced: bool = False
    """Its counters have been sent once (with their 0 at the start time)."""


@dataclass(slots=True)
class OwnerState:
    attributes: dict[str, Value]
    first_ns: int
    last_ns: int
    gpus: set[str] = field(default_factory=set)
    seen_with: tuple[tuple[str, Value], ...] = ()
    """The attributes last merged in: the same tuple again (a cached decision) is not merged anew."""


@dataclass(slots=True)
class Device:
    """One GPU (or MIG device): where integration stands and what it has counted."""

    start_ns: int
    attributes: tuple[tuple[str, Value], ...] = ()
    last_ns: int | None = None
    energy: float | None = None
    limit: float | None = None
    observed: float = 0.0
    unobserved: float = 0.0
    unattributed: dict[str, float] = field(default_factory=dict)
    """Busy time of processes no rule named, by why (`owners.REASONS`): the GPU's work that
    could not be attributed."""
    announced: bool = False
    accounts: dict[Owner, Account] = field(default_factory=dict)
    pending: dict[int, Sample] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Event:
    """An accounting event, sent as an OTLP log record on the owner's (and GPU's) resource."""

    owner: Owner
    hw_id: str | None
    time_ns: int
    severity: str
    """``INFO`` or ``WARN``."""
    name: str
    body: dict[str, Any]
    resource: tuple[tuple[str, Value], ...] = ()
    """The owner's attributes (and its GPU's) when the event happened: the owner may be gone
    by the time the event is sent."""


class Ledger:
    """Every GPU's integration state and every owner's counters."""

    def __init__(self, config: UsageConfig, *, start_ns: int, instance: str = "") -> None:
        self.config = config
        self.instance = instance
        """``service.instance.id`` of every counter and event: which gputally counted them."""
        self.start_ns = start_ns
        """When counters that have no start of their own begin (the service start)."""
        self.devices: dict[str, Device] = {}
        self.owners: dict[Owner, OwnerState] = {}
        self._pending: set[str] = set()
        """GPUs with samples waiting to settle: what `settle` looks at, not every GPU."""
        self._prices: dict[str, float] = {}
        self.events: list[Event] = []
        self.late = 0
        """Samples ignored because their GPU was already integrated past them."""
        self.incomplete = 0
        """Samples dropped because their GPU's own reading never came."""
        self.gaps = 0
        self.evicted = 0
        self.watermark = 0
        """Newest sample time integrated on any GPU (ends owners not seen for ``end_after``)."""
        self.serving = Serving(settle=config.settle, start_ns=start_ns, max_engines=config.max_owners)
        """Inference engines: their series and tokens (`tokens`)."""
        self.models = Models(self.serving, max_gap=config.max_gap)
        """The owners' GPU time per served model (`models`)."""

    # -- intake ----------------------------------------------------------------------------

    def add(
        self, hw_id: str, time_ns: int, device: DeviceReading | None, process_key: str,
        process: ProcessReading | None, *, arrived: float,
    ) -> None:
        """Hold one reading until it is settled; a reading for integrated time is ignored."""
        self.add_all(((hw_id, time_ns, device, {process_key: process} if process is not None else {}),),
                     arrived=arrived)

    def add_all(self, observations: Iterable[Observation], *, arrived: float) -> None:
        """Hold each ``(hw_id, time_ns, device, {process key: process})`` of a request (:meth:`add`;
        the dict is kept); a later reading of the same GPU, time and process replaces an earlier."""
        devices, waiting = self.devices, self._pending
        for hw_id, time_ns, device, processes in observations:
            state = devices.get(hw_id)
            if state is None:
                state = devices[hw_id] = Device(start_ns=self.start_ns)
            if state.last_ns is not None and time_ns <= state.last_ns:
                self.late += len(processes) + (device is not None)  # readings, as a resource each
                continue
            sample = state.pending.get(time_ns)
            if sample is None:
                state.pending[time_ns] = Sample(device, processes, arrived)
                waiting.add(hw_id)
                continue
            if device is not None:
                sample.device = device
            if processes:
                sample.processes.update(processes)

    def add_engines(self, readings: list[EngineReading], *, arrived: float) -> None:
        """Hold engine readings until they are settled (`tokens.Serving.add`)."""
        if readings:
            self.serving.add(readings, arrived=arrived)

    def settle(self, now: float, *, everything: bool = False) -> None:
        """Integrate every held sample that arrived ``settle`` seconds ago (all with ``everything``)."""
        limit = now - self.config.settle
        devices = self.devices
        serving = self.serving.by_gpu
        if self.serving.pending:  # engines first: a GPU interval splits by what they said lately
            self.watermark = max(self.watermark, self.serving.settle(now, everything=everything, see=self._see_all))
        for hw_id in list(self._pending):
            state = devices[hw_id]
            pending = state.pending
            if everything:
                due = list(pending.items())
            else:  # a GPU's samples are held in the order they arrived: the due ones come first
                due = []
                for t, sample in pending.items():
                    if sample.arrived > limit:
                        break
                    due.append((t, sample))
            if len(due) == len(pending):
                pending.clear()
                self._pending.discard(hw_id)
            else:
                for t, _ in due:
                    del pending[t]
            if len(due) > 1:
                due.sort(key=_time_of)
            for t, sample in due:
                if state.last_ns is not None and t <= state.last_ns:
                    self.late += 1  # older than a sample that settled first (it arrived earlier)
                    continue
                if sample.device is None:
                    self.incomplete += 1
                    continue
                if hw_id in serving:
                    self.models.integrate(self._integrate, hw_id, state, t, sample)
                else:
                    self._integrate(hw_id, state, t, sample)
        if not self._pending:
            self._pending = set()  # a set keeps its largest table: iterating it would cost that size

    # -- integration -----------------------------------------------------------------------

    def _integrate(self, hw_id: str, state: Device, t: int, sample: Sample) -> None:
        # The hot path: every GPU sample of every node comes here, so the common case (one
        # holder, its processes on the GPU) runs without a helper call per account.
        reading = sample.device
        assert reading is not None
        if reading.attributes:
            state.attributes = reading.attributes
        if reading.limit is not None:
            state.limit = reading.limit
        previous = state.last_ns
        since = previous if previous is not None else t  # a counter begun now starts here
        see = self._see
        allocation = reading.allocation
        if not allocation:
            holders = [UNALLOCATED]
        elif len(allocation) == 1:
            holders = [see(allocation[0], hw_id, t)]
        else:
            holders = [see(named, hw_id, t) for named in allocation]
        by_owner: dict[Owner, list[float]] = {}  # owner -> [utilization sum, memory sum]
        reasons: dict[str, list[float]] | None = None  # why unattributed -> [utilization sum, processes]
        for process in sample.processes.values():
            owner = see(process.owner, hw_id, t)
            if process.reason:
                if reasons is None:
                    reasons = {}
                counted = reasons.setdefault(process.reason, [0.0, 0.0])
                counted[0] += process.utilization or 0.0
                counted[1] += 1
            totals = by_owner.get(owner)
            if totals is None:
                by_owner[owner] = [process.utilization or 0.0, process.memory or 0.0]
            else:
                totals[0] += process.utilization or 0.0
                totals[1] += process.memory or 0.0
        accounts = state.accounts
        for owner, (_, memory) in by_owner.items():
            account = accounts.get(owner) or _opened(accounts, owner, since)
            if memory > account.peak_memory:
                account.peak_memory = memory
        if not by_owner and len(holders) == 1 and holders[0] is not UNALLOCATED and reading.memory is not None:
            # No process list at all (dcgm-exporter): the GPU's memory is its one holder's.
            account = accounts.get(holders[0]) or _opened(accounts, holders[0], since)
            account.peak_memory = max(account.peak_memory, reading.memory)
        state.last_ns = t
        if t > self.watermark:
            self.watermark = t
        energy_before = state.energy
        if reading.energy_j is not None:
            state.energy = reading.energy_j
        if previous is None:
            return
        dt = (t - previous) / _NS
        if dt > self.config.max_gap:
            state.unobserved += dt
            self.gaps += 1
            self._close_spells(hw_id, state, t, keep=())
            return
        state.observed += dt
        utilization = reading.utilization or 0.0
        busy = (utilization if 0.0 < utilization < 1.0 else 1.0 if utilization >= 1.0 else 0.0) * dt  # NaN: 0
        shares = _shares(busy, by_owner, holders)
        energy = 0.0
        if reading.energy_j is not None and energy_before is not None:
            energy = reading.energy_j - energy_before
            if energy < 0:  # the counter restarted (driver reload): it counts from zero again
                energy = reading.energy_j
        if shares:
            for owner, share in shares.items():
                account = accounts.get(owner) or _opened(accounts, owner, since)
                account.energy += energy * share
                account.busy += busy * share
        else:
            for holder in holders:
                (accounts.get(holder) or _opened(accounts, holder, since)).energy += energy * (1 / len(holders))
        unattributed = 0.0
        if reasons is not None:
            unattributed = busy * shares.get(UNATTRIBUTED, 0.0)
            if unattributed > 0:
                _why(state, unattributed, reasons)
        self._share_time(hw_id, state, accounts, since, previous, t, dt, busy, shares, holders, by_owner,
                         unattributed)

    def _share_time(
        self, hw_id: str, state: Device, accounts: dict[Owner, Account], since: int, previous: int, t: int,
        dt: float, busy: float, shares: dict[Owner, float], holders: list[Owner], by_owner: dict[Owner, list[float]],
        unattributed: float = 0.0,
    ) -> None:
        """Allocated, present and idle time, and the idle spells they start or end. While the
        GPU shows work no rule attributed (``unattributed`` busy seconds), nobody on it is in an
        idle spell: that work may be theirs."""
        idle_below = self.config.idle_below
        per = dt / len(holders)
        judged: list[Owner] = []
        for holder in holders:
            account = accounts.get(holder) or _opened(accounts, holder, since)
            account.allocated += per
            account.present += per
            if holder is UNALLOCATED:
                if busy / dt < idle_below:
                    account.idle += per
                continue
            idle = busy * shares.get(holder, 0.0) / per < idle_below
            if idle:
                account.idle += per
            if unattributed > 0:
                account.unattributed += unattributed
                idle = False
            if idle or account.idle_since is not None:
                self._spell(hw_id, state, holder, account, previous, t, idle, "allocated")
            judged.append(holder)
        for owner, (_, memory) in by_owner.items():
            if owner in holders:
                continue
            account = accounts.get(owner) or _opened(accounts, owner, since)
            account.present += dt
            if memory > 0:
                idle = busy * shares.get(owner, 0.0) / dt < idle_below
                if unattributed > 0 and owner is not UNATTRIBUTED:
                    account.unattributed += unattributed
                    idle = False
                if idle or account.idle_since is not None:
                    self._spell(hw_id, state, owner, account, previous, t, idle, "holding")
                judged.append(owner)
        self._close_spells(hw_id, state, t, keep=judged)

    def _see_all(self, named: Named, hw_ids: tuple[str, ...], t: int) -> Owner:
        """`_see` on each of ``hw_ids`` (an engine's GPUs; none: an engine on no GPU)."""
        for hw_id in hw_ids:
            owner = self._see(named, hw_id, t)
        return owner if hw_ids else self._see(named, None, t)

    def _see(self, named: Named, hw_id: str | None, t: int) -> Owner:
        owner, attributes = named
        state = self.owners.get(owner)
        if state is None:
            if len(self.owners) >= self.config.max_owners:
                self._evict_one()
            state = self.owners[owner] = OwnerState(attributes=dict(attributes), first_ns=t, last_ns=t)
            state.seen_with = attributes
        else:
            if attributes and attributes is not state.seen_with:
                state.attributes.update(attributes)
                state.seen_with = attributes
            if t > state.last_ns:
                state.last_ns = t
            elif t < state.first_ns:
                state.first_ns = t
        if hw_id is not None:
            state.gpus.add(hw_id)
        return owner

    def _evict_one(self) -> None:
        oldest = min(self.owners, key=lambda o: self.owners[o].last_ns)
        self._drop(oldest)
        self.evicted += 1

    def _drop(self, owner: Owner) -> None:
        self.serving.drop_owner(owner)
        self.models.drop_owner(owner)
        state = self.owners.pop(owner)
        for hw_id in state.gpus:
            device = self.devices.get(hw_id)
            if device is not None:
                device.accounts.pop(owner, None)

    # -- idle spells -----------------------------------------------------------------------

    def _spell(
        self, hw_id: str, state: Device, owner: Owner, account: Account, start: int, t: int, idle: bool, kind: str
    ) -> None:
        if idle:
            if account.idle_since is None or account.idle_kind != kind:
                if account.idle_since is not None:
                    self._end_spell(hw_id, owner, account, t)
                account.idle_since, account.idle_kind, account.warned = start, kind, False
            elif not account.warned and (t - account.idle_since) / _NS >= self.config.idle_after:
                account.warned = True
                self.events.append(self._spell_event(hw_id, state, owner, account, t, "WARN", "gputally.usage.idle"))
        elif account.idle_since is not None:
            self._end_spell(hw_id, owner, account, t)

    def _close_spells(self, hw_id: str, state: Device, t: int, *, keep: Collection[Owner]) -> None:
        for owner, account in state.accounts.items():
            if account.idle_since is not None and owner not in keep:
                self._end_spell(hw_id, owner, account, t)

    def _end_spell(self, hw_id: str, owner: Owner, account: Account, t: int) -> None:
        if account.warned:
            state = self.devices[hw_id]
            self.events.append(self._spell_event(hw_id, state, owner, account, t, "INFO", "gputally.usage.idle.end"))
        account.idle_since, account.idle_kind, account.warned = None, "", False

    def _spell_event(
        self, hw_id: str, state: Device, owner: Owner, account: Account, t: int, severity: str, name: str
    ) -> Event:
        assert account.idle_since is not None
        minutes = (t - account.idle_since) / _NS / 60
        gpu = dict(state.attributes).get("hw.model", hw_id)
        if account.idle_kind == "allocated":
            what = f"holds GPU {hw_id} ({gpu}) allocated and idle"
        else:
            what = f"holds {account.peak_memory / _GIB:.1f} GiB on GPU {hw_id} ({gpu}) without computing"
        text = f"{owner} {what} for {minutes:.0f} min" + ("" if severity == "WARN" else "; it is busy or gone now")
        return Event(owner, hw_id, t, severity, name, {
            "message": text, "kind": account.idle_kind, "idle_since_unix_nano": account.idle_since,
            "idle_seconds": round((t - account.idle_since) / _NS, 3),
        }, self.resource_of(owner, state))

    # -- ends ------------------------------------------------------------------------------

    def end_owners(self) -> list[Owner]:
        """Owners not seen for ``end_after`` (sample time): their summary events, then they go."""
        cutoff = self.watermark - int(self.config.end_after * _NS)
        ended = [o for o, s in self.owners.items() if s.last_ns < cutoff and o is not UNALLOCATED]
        for owner in ended:
            state = self.owners[owner]
            for hw_id in sorted(state.gpus):
                account = self.devices[hw_id].accounts.get(owner) if hw_id in self.devices else None
                if account is not None and account.idle_since is not None:
                    self._end_spell(hw_id, owner, account, state.last_ns)
            self.events.append(self.summary(owner))
            self._drop(owner)
        retired = [h for h, d in self.devices.items() if d.last_ns is not None and d.last_ns < cutoff
                   and not d.pending and all(o is UNALLOCATED for o in d.accounts)]
        for hw_id in retired:  # a GPU gone from the fleet (or its node gone quiet): its counters stop
            del self.devices[hw_id]
            self.models.drop_gpu(hw_id)
        self.serving.forget(self.watermark)
        return ended

    def accounts_of(self, owner: Owner) -> Iterator[tuple[str, Device, Account]]:
        state = self.owners.get(owner)
        for hw_id in sorted(state.gpus if state else ()):
            device = self.devices.get(hw_id)
            account = device.accounts.get(owner) if device else None
            if device is not None and account is not None:
                yield hw_id, device, account

    def price(self, device: Device) -> float:
        """The GPU-hour price of the device's model (first matching rule; decided once per model)."""
        model = str(dict(device.attributes).get("hw.model", "")).lower()
        price = self._prices.get(model)
        if price is None:
            price = next((rule.per_gpu_hour for rule in self.config.prices if fnmatch(model, rule.model.lower())),
                         self.config.default_price_per_gpu_hour)
            self._prices[model] = price
        return price

    def cost(self, device: Device, account: Account) -> float:
        return account.allocated / 3600 * self.price(device) + account.energy / 3.6e6 * self.config.energy_price_per_kwh

    def summary(self, owner: Owner) -> Event:
        """The end-of-allocation summary of ``owner`` (jobstats-like, with notes)."""
        state = self.owners[owner]
        thresholds = self.config.summary
        rows = list(self.accounts_of(owner))
        allocated = sum(a.allocated for _, _, a in rows)
        busy = sum(a.busy for _, _, a in rows)
        present = sum(a.present for _, _, a in rows)
        idle = sum(a.idle for _, _, a in rows)
        energy = sum(a.energy for _, _, a in rows)
        cost = sum(self.cost(d, a) for _, d, a in rows)
        held = [(h, d, a) for h, d, a in rows if a.allocated > 0]
        used = [a for _, _, a in held if a.busy / a.allocated >= thresholds.unused_below]
        gpus = held or [(h, d, a) for h, d, a in rows if a.present > 0]
        mean = busy / (allocated or present) if (allocated or present) else 0.0
        peak_row = max(rows, key=lambda r: r[2].peak_memory, default=None)
        unattributed = sum(a.unattributed for _, _, a in rows)
        notes: list[str] = []
        if unattributed > 0:  # some of that work may be its own: it is not called idle
            notes.append(f"{unattributed / 3600:.3f} GPU-h of work on its GPUs could not be attributed")
        elif held and len(used) < len(held):
            notes.append(f"used {len(used)} of {len(held)} allocated GPUs")
        if gpus and mean < thresholds.low_utilization and not unattributed:
            notes.append(f"mean utilization {mean * 100:.0f} % on {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}")
        if peak_row is not None and peak_row[1].limit and peak_row[2].peak_memory / peak_row[1].limit < thresholds.low_memory:
            notes.append(f"peak memory {peak_row[2].peak_memory / _GIB:.0f} GiB of {peak_row[1].limit / _GIB:.0f} GiB")
        body: dict[str, Any] = {
            "message": f"{owner} ended: {len(gpus)} GPU(s), {allocated / 3600:.3f} GPU-h allocated, "
                       f"{busy / 3600:.3f} busy, {energy / 3.6e6:.3f} kWh" + (f"; {'; '.join(notes)}" if notes else ""),
            "gpus": len(gpus),
            "wall_time_seconds": round((state.last_ns - state.first_ns) / _NS, 3),
            "allocated_gpu_hours": allocated / 3600,
            "busy_gpu_hours": busy / 3600,
            "mean_utilization": mean,
            "idle_share": idle / allocated if allocated else 0.0,
            "unattributed_gpu_hours": unattributed / 3600,
            "peak_memory_bytes": int(peak_row[2].peak_memory) if peak_row else 0,
            "energy_kwh": energy / 3.6e6,
            "cost": cost,
            "currency": self.config.currency,
            "notes": notes,
        }
        return Event(owner, None, state.last_ns, "INFO", "gputally.usage.summary", body, self.resource_of(owner, None))

    def resource_of(self, owner: Owner | None, device: Device | None) -> tuple[tuple[str, Value], ...]:
        """The attributes of an (owner, GPU) resource: the owner's, its kind and id, the GPU's."""
        attributes: dict[str, Value] = {}
        if owner is not None:
            state = self.owners.get(owner)
            if state is not None:
                attributes.update(state.attributes)
            attributes[OWNER_KIND] = owner.kind
            attributes[OWNER_ID] = owner.id
        if device is not None:
            attributes.update(device.attributes)
        if self.instance:
            attributes[SERVICE_NAME] = "gputally"
            attributes[SERVICE_INSTANCE] = self.instance
        return tuple(sorted(attributes.items()))

    def drain_events(self) -> list[Event]:
        events, self.events = self.events, []
        return events


def _why(state: Device, unattributed: float, reasons: dict[str, list[float]]) -> None:
    """Split the GPU's unattributed busy seconds among the reasons, by their processes'
    utilization (by their number when none reports one)."""
    weight = 0 if sum(u for u, _ in reasons.values()) > 0 else 1
    total = sum(counted[weight] for counted in reasons.values())
    for reason, counted in reasons.items():
        state.unattributed[reason] = state.unattributed.get(reason, 0.0) + unattributed * counted[weight] / total


def _opened(accounts: dict[Owner, Account], owner: Owner, since: int) -> Account:
    """A new account for ``owner`` on this GPU, counting from ``since``."""
    account = accounts[owner] = Account(start_ns=since)
    return account


def _time_of(item: tuple[int, Sample]) -> int:
    return item[0]


def _shares(busy: float, by_owner: dict[Owner, list[float]], holders: list[Owner]) -> dict[Owner, float]:
    """Who did the GPU's busy time: by process utilization, else by process presence, else the holders."""
    if busy <= 0:
        return {}
    if len(by_owner) == 1:  # one owner runs on it (the common case): all of it
        for owner in by_owner:
            return {owner: 1.0}
    weights = {owner: totals[0] for owner, totals in by_owner.items() if totals[0] > 0}
    total = sum(weights.values())
    if total > 0:
        return {owner: weight / total for owner, weight in weights.items()}
    owners = list(by_owner) or holders
    return {owner: 1 / len(owners) for owner in owners}
