"""The per-cycle engine read: every endpoint at once, bounded by one deadline, beside the GPU's.

:class:`EngineCollector` wraps a vendor's collector (NVIDIA, AMD, Gaudi alike). Engines known
from earlier cycles (explicit ones, and discovered endpoints that turned out to be engines) are
read *while* the GPUs are, so in the steady state a cycle costs the slower of the two, not
their sum; once the GPU part is in, discovery (:mod:`.discover`, in a worker thread) finds the
containers of this cycle's GPU processes and any new candidates are tried in what is left of
the deadline. Whatever has not answered by then is given up for this cycle. The GPU part never
waits on, nor fails for, an engine: a failed engine read is one ``gputally.inference.up`` = 0
point, and one WARNING per endpoint per failure episode.

A container's candidates are tried one after the other, best first (:mod:`.discover` ranks
them), until one answers as an engine; its other ports (a worker's internal sockets: vLLM's
hold a dozen) are then never touched. A candidate that is not an engine (it answered no
exposition, or not in time) is remembered and tried again only after a backoff (30 s,
doubling to 15 min), or when its container's processes change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gputally.logthrottle import LogThrottle
from gputally.probes.core.collector import Collector
from gputally.probes.core.counters import CounterStarts
from gputally.probes.core.hints import process_attributes
from gputally.probes.core.model import AttrValue, Cycle, Entity, Point
from gputally.probes.core.procfacts import ProcessInfoSource
from gputally.probes.engines.catalog import UP
from gputally.probes.engines.discover import Container, Discovery
from gputally.probes.engines.model import Connect, Endpoint, EngineReading
from gputally.probes.engines.netns import Namespaces
from gputally.probes.engines.options import ExplicitEndpoint
from gputally.util.once import Once

__all__ = ["EngineCollector", "EngineReads", "Read"]

log = logging.getLogger(__name__)

Read = Callable[[Endpoint, Connect], Awaitable[EngineReading]]
"""One read of one endpoint through ``connect``; raises when it gives no reading."""

_BACKOFF_FIRST_S = 30.0
_BACKOFF_MOST_S = 900.0
_FOUND_EVERY_S = 600.0


@dataclass(eq=False)
class _Target:
    """One endpoint the probe reads, or has tried."""

    endpoint: Endpoint
    container: str | None = None
    """The container it was found in; None for an explicit endpoint."""
    explicit: ExplicitEndpoint | None = None
    engine: str | None = None
    is_engine: bool = False
    """Read every cycle (an explicit endpoint, or a candidate that answered as an engine)."""
    retry_at: float = 0.0
    backoff_s: float = 0.0
    failing: bool = False
    task: asyncio.Task[EngineReading | BaseException] | None = None

    def label(self) -> str:
        e = self.endpoint
        where = f" (pid {e.pid}{', in its network namespace' if e.netns else ''})" if e.pid else ""
        host = f"[{e.host}]" if ":" in e.host else e.host
        return f"{self.engine or 'engine'} at http://{host}:{e.port}{e.path}{where}"


@dataclass
class _Context:
    """What the worker thread found for this cycle: containers, and the explicit endpoints' processes."""

    containers: list[Container] = field(default_factory=list)
    explicit: dict[int, tuple[dict[str, AttrValue], tuple[str, ...], tuple[int, ...]] | None] = field(default_factory=dict)
    """index in the explicit list -> (hints, gpu ids, gpu pids); None: nothing is known of its process."""


class EngineReads:
    """The engine half of a cycle: which endpoints to read, reading them, and their entities."""

    def __init__(
        self,
        read: Read,
        *,
        walker: Discovery,
        processes: ProcessInfoSource,
        node_name: str,
        explicit: Sequence[ExplicitEndpoint] = (),
        discover: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], int] = time.time_ns,
        connect: Callable[[Endpoint], Connect] | None = None,
        warn_every_s: float = 60.0,
        tries_per_cycle: int = 4,
    ) -> None:
        """``walker`` finds containers (and, with ``discover``, their candidates);
        ``connect`` gives the connection opener for an endpoint (default: from inside its
        network namespace where it names one, through a thread of that namespace's own);
        ``warn_every_s``: least time between two WARNINGs of one endpoint (one that flaps);
        ``tries_per_cycle``: most candidates of one container tried per cycle."""
        self._tries = tries_per_cycle
        self._read = read
        self._walker = walker
        self._processes = processes
        self._node = node_name
        self._discover = discover
        self._clock = clock
        self._namespaces = Namespaces()
        self._connect = connect or self._namespaces.connect_for
        self._explicit = [_Target(endpoint=e.endpoint, explicit=e, engine=e.endpoint.engine, is_engine=True)
                          for e in explicit]
        self._found: dict[tuple[str, str, int, str], _Target] = {}
        self._counters = CounterStarts(probe_start_ns=wall())
        self._throttle = LogThrottle(log, interval=warn_every_s, clock=clock)
        self._found_log = LogThrottle(log, interval=_FOUND_EVERY_S, clock=clock)
        """"found" once per endpoint per interval: a container whose GPU process NVML lists only on
        some cycles (an engine idle between requests) loses and finds its engine again."""
        self._once: Once[str] = Once()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gputally-engines")
        self._scanning: asyncio.Future[_Context] | None = None
        self._present: set[str] = set()
        self._identifying: list[asyncio.Task[Any]] = []
        self.engines = 0
        """Engine entities in the last cycle (the runner's summary)."""

    def start(self) -> None:
        """Begin reading the engines already known, before the GPU part of the cycle is in."""
        for target in self._explicit:
            self._begin(target)
        for target in self._found.values():
            if target.is_engine and target.container in self._present:
                self._begin(target)

    async def finish(self, cycle: Cycle, deadline: float) -> list[Entity]:
        """Discover from ``cycle``'s GPU processes, read what is due, and wait until ``deadline``
        (a ``clock`` time) at most; the engines' entities, stamped with counter start times."""
        context = await self._context(cycle, deadline)
        containers = {c.key: c for c in context.containers} if context is not None else {}
        if context is not None:
            self._update(containers)
        wanted = list(self._explicit)
        wanted += [t for t in self._found.values() if t.is_engine and t.container in containers]
        for target in wanted:
            self._begin(target)
        identifying = self._identifications(containers)
        self._identifying = [task for _, task, _ in identifying]
        tasks: list[asyncio.Future[Any]] = [t.task for t in wanted if t.task is not None]
        tasks += [task for _, task, _ in identifying]
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, deadline - self._clock()))
        entities: list[Entity] = []
        for home, task, trying in identifying:
            if not task.done():
                task.cancel()
                if trying:  # the candidate in flight at the deadline: ruled out like one that failed
                    self._rule_out(trying[-1], TimeoutError("no answer within the cycle's engine deadline"))
                continue
            found = task.result()
            if found is not None:
                candidate, reading = found
                entities.append(self._settle(candidate, reading, home, cycle.time_ns))
        for n, target in enumerate(wanted):
            outcome = self._outcome(target)
            container = containers.get(target.container) if target.container is not None else None
            entity: Entity | None
            if target.explicit is not None:
                known = context.explicit.get(n) if context is not None else None
                entity = self._entity(target, outcome, known, cycle.time_ns)
            else:
                entity = self._settle(target, outcome, container, cycle.time_ns)
            if entity is not None:
                entities.append(entity)
        self._counters.stamp(entities, cycle.time_ns)
        self.engines = len(entities)
        return entities

    def abandon(self) -> None:
        """Give up every read in flight (the cycle failed, or the probe stops)."""
        for target in [*self._explicit, *self._found.values()]:
            if target.task is not None:
                target.task.cancel()
                target.task = None
        for task in self._identifying:
            task.cancel()
        self._identifying = []

    async def close(self) -> None:
        self.abandon()
        self._namespaces.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- one cycle's parts ---------------------------------------------------------------

    def _begin(self, target: _Target) -> None:
        if target.task is None:
            target.task = asyncio.ensure_future(self._read_one(target.endpoint))

    async def _read_one(self, endpoint: Endpoint) -> EngineReading | BaseException:
        try:
            return await self._read(endpoint, self._connect(endpoint))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # reported as this endpoint's failure, never the cycle's
            return exc

    def _outcome(self, target: _Target) -> EngineReading | BaseException:
        task, target.task = target.task, None
        assert task is not None
        if not task.done():
            task.cancel()
            return TimeoutError("no answer within the cycle's engine deadline")
        if task.cancelled():
            return TimeoutError("the read was cancelled")
        return task.result()

    async def _context(self, cycle: Cycle, deadline: float) -> _Context | None:
        """This cycle's containers, from a worker thread, within the deadline; None: not in time."""
        if not self._discover and not any(t.endpoint.pid is not None or (t.explicit and t.explicit.cgroup)
                                          for t in self._explicit):
            return _Context(explicit=dict.fromkeys(range(len(self._explicit))))  # nothing to read from /proc
        if self._scanning is not None and not self._scanning.done():
            return None  # the last scan has not returned (a hung /proc read): none this cycle
        processes = cycle.processes()
        loop = asyncio.get_running_loop()
        self._scanning = loop.run_in_executor(self._pool, self._scan, processes)
        try:
            return await asyncio.wait_for(asyncio.shield(self._scanning), timeout=max(0.05, deadline - self._clock()))
        except TimeoutError:
            if self._once.first("slow-scan"):
                log.warning("engine discovery took longer than the cycle's engine deadline; "
                            "discovered engines are left out until it returns")
            return None

    def _scan(self, processes: list[Entity]) -> _Context:
        context = _Context()
        if self._discover:
            context.containers = self._walker.scan(processes)
        for n, target in enumerate(self._explicit):
            context.explicit[n] = self._explicit_context(target, processes)
        self._once.forget("slow-scan")
        return context

    def _explicit_context(self, target: _Target, processes: list[Entity]) -> tuple[dict[str, AttrValue], tuple[str, ...], tuple[int, ...]] | None:
        assert target.explicit is not None
        pid, cgroup = target.endpoint.pid, target.explicit.cgroup
        hints: dict[str, AttrValue] = {}
        members: frozenset[int] | None = None
        if pid is not None:
            facts = self._processes.facts(pid)
            hints = process_attributes(pid, facts)
            if facts is not None and facts.cgroup:
                members = self._walker.members(pid, facts.cgroup)
        if cgroup is not None:
            hints.setdefault("process.linux.cgroup", f"0::{cgroup}")
        if members is None and cgroup is None:
            return (hints, (), ()) if hints else None
        on_gpu = [e for e in processes if _pid(e) in members] if members is not None else \
            [e for e in processes if _under(e, cgroup or "/")]
        ids = tuple(sorted({str(e.attributes["hw.id"]) for e in on_gpu if "hw.id" in e.attributes}))
        return hints, ids, tuple(sorted({p for e in on_gpu if (p := _pid(e)) is not None}))

    def _update(self, containers: dict[str, Container]) -> None:
        """Forget what is no longer there; a container whose processes changed is tried afresh."""
        keep: dict[tuple[str, str, int, str], _Target] = {}
        for key, target in self._found.items():
            container = containers.get(target.container or "")
            if container is None or container.changed and not target.is_engine:
                if target.task is not None:
                    target.task.cancel()
                continue
            if container.changed and target.endpoint not in container.endpoints:
                if target.task is not None:
                    target.task.cancel()
                continue  # an engine that no longer listens there
            keep[key] = target
        for container in containers.values():
            for endpoint in container.endpoints:
                key = (container.key, endpoint.host, endpoint.port, endpoint.path)
                held = keep.get(key)
                if held is None:
                    keep[key] = _Target(endpoint=endpoint, container=container.key)
                elif held.endpoint != endpoint:  # another pid of the container holds it now
                    held.endpoint = endpoint
        self._found = keep
        self._present = set(containers)
        for target in keep.values():
            if target.is_engine and target.container is not None:
                containers[target.container].engine_found = True

    def _identifications(self, containers: dict[str, Container]
                         ) -> list[tuple[Container, asyncio.Task[tuple[_Target, EngineReading] | None], list[_Target]]]:
        """One task per container with no engine yet: its due candidates, best first, tried one
        after the other until one answers as an engine, so a container's other ports (a
        worker's internal sockets) are never touched once its engine is known."""
        now = self._clock()
        started = []
        for key, container in containers.items():
            if container.engine_found:
                continue
            due = [t for e in container.endpoints
                   if (t := self._found.get((key, e.host, e.port, e.path))) is not None
                   and not t.is_engine and t.retry_at <= now][: self._tries]
            if due:
                trying: list[_Target] = []
                started.append((container, asyncio.ensure_future(self._identify(due, trying)), trying))
        return started

    async def _identify(self, candidates: list[_Target], trying: list[_Target]) -> tuple[_Target, EngineReading] | None:
        for target in candidates:
            trying.append(target)
            outcome = await self._read_one(target.endpoint)
            if isinstance(outcome, EngineReading):
                return target, outcome
            self._rule_out(target, outcome)
        return None

    def _rule_out(self, target: _Target, outcome: BaseException) -> None:
        """A candidate that is not an engine: not tried again for a while (backing off)."""
        target.backoff_s = min(_BACKOFF_MOST_S, target.backoff_s * 2 or _BACKOFF_FIRST_S)
        target.retry_at = self._clock() + target.backoff_s
        log.debug("%s is not an engine (%s); trying again in %g s", target.label(), _reason(outcome),
                  target.backoff_s)

    def _settle(self, target: _Target, outcome: EngineReading | BaseException, container: Container | None,
                time_ns: int) -> Entity:
        """A discovered engine's read (or a candidate's that answered as one): its entity."""
        if not target.is_engine:
            assert isinstance(outcome, EngineReading)
            target.is_engine, target.engine = True, outcome.engine
            if container is not None:
                container.engine_found = True
            self._found_log.log(f"{target.container}|{target.label()}", logging.INFO, "found %s in %s",
                                target.label(), target.container)
        known = None
        if container is not None:
            hints = container.hints.get(target.endpoint.pid or -1, {})
            known = (hints, container.gpu_ids, container.gpu_pids)
        return self._entity(target, outcome, known, time_ns)

    def _entity(self, target: _Target, outcome: EngineReading | BaseException,
                known: tuple[dict[str, AttrValue], tuple[str, ...], tuple[int, ...]] | None, time_ns: int) -> Entity:
        endpoint = target.endpoint
        ok = isinstance(outcome, EngineReading)
        if isinstance(outcome, EngineReading):
            target.engine = outcome.engine
            if target.failing:
                log.info("%s answers again", target.label())
                target.failing = False
        else:
            if not target.failing:
                self._throttle.log(f"{id(target)}", logging.WARNING, "%s: %s; reporting gputally.inference.up 0 "
                                   "until it answers", target.label(), _reason(outcome))
            target.failing = True
        attributes: dict[str, AttrValue] = {"host.name": self._node}
        if target.engine:
            attributes["gputally.inference.engine"] = target.engine
        attributes["server.address"] = endpoint.host
        attributes["server.port"] = endpoint.port
        if known is not None:
            hints, gpu_ids, gpu_pids = known
            attributes.update(hints)
            if target.container is not None or gpu_ids or target.explicit is not None and (
                    endpoint.pid is not None or target.explicit.cgroup is not None):
                attributes["gputally.inference.gpu.ids"] = gpu_ids
                attributes["gputally.inference.gpu.pids"] = gpu_pids
        points: list[Point] = []
        histograms = []
        if isinstance(outcome, EngineReading):
            attributes.update(outcome.attributes)
            points = list(outcome.points)
            histograms = list(outcome.histograms)
            if not any(p.metric.name == UP.name for p in points):
                points.append(Point(UP, 1))
        else:
            points = [Point(UP, 0)]
        where = target.container or "explicit"
        started = attributes.get("process.creation.time", "")
        key = f"engine/{where}/{endpoint.host}:{endpoint.port}{endpoint.path}/{endpoint.pid or ''}/{started}"
        return Entity(key=key, kind="engine", attributes=attributes, points=points, histograms=histograms,
                      label=target.label() + ("" if ok else " (no reading)"))


class EngineCollector:
    """A vendor's :class:`~gputally.probes.core.collector.Collector` with the node's engines added to each cycle."""

    def __init__(self, inner: Collector, reads: EngineReads, *, deadline_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``deadline_s``: how long after a cycle starts its engine reads are given up (well
        inside the interval; the GPU part is never held up by them)."""
        self._inner = inner
        self._reads = reads
        self._deadline_s = deadline_s
        self._clock = clock
        self._once: Once[str] = Once()

    @property
    def engines(self) -> int:
        return self._reads.engines

    async def collect(self) -> Cycle:
        started = self._clock()
        self._reads.start()
        try:
            cycle = await self._inner.collect()
        except BaseException:
            self._reads.abandon()
            raise
        try:
            cycle.entities.extend(await self._reads.finish(cycle, started + self._deadline_s))
        except Exception:  # a bug in the engine half costs the engines, never the GPUs
            self._reads.abandon()
            if self._once.first("failed"):
                log.exception("reading the inference engines failed; the GPUs' cycle goes on without them")
            cycle.problems.append("the engine reads failed (see the log)")
        else:
            self._once.forget("failed")
        return cycle

    async def close(self) -> None:
        await self._reads.close()
        await self._inner.close()


def _pid(entity: Entity) -> int | None:
    pid = entity.attributes.get("process.pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else None


def _under(entity: Entity, cgroup: str) -> bool:
    """Whether ``entity``'s process is in ``cgroup`` or below it (any hierarchy)."""
    text = entity.attributes.get("process.linux.cgroup")
    if not isinstance(text, str):
        return False
    prefix = cgroup.rstrip("/") + "/"
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        if path == cgroup or path.startswith(prefix):
            return True
    return False


def _reason(error: BaseException) -> str:
    text = str(error)
    return text if text else type(error).__name__
