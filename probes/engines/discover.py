"""Finding engines from the GPU's own processes: their containers, and what those listen on.

The process on a GPU is often not the one serving metrics (vLLM runs an API server, an engine
core and a worker; only the API server listens), so discovery works per *container*: the
cgroup a GPU process is in names it (a pod's container, a Slurm job, a systemd service), its
``cgroup.procs`` (the whole subtree: a job's steps, a container's own sub-cgroups) name every
process in it, and their listening TCP sockets (:mod:`.procnet`, in each process's own network
namespace) are the candidate endpoints. Which candidate is an engine is the collector's to find
out, by reading it.

Candidates are ranked, best first: a listener not held by a GPU process, on every address or
a non-loopback one, on a port outside the kernel's ephemeral range (so configured, not picked
by the kernel), then by port; vLLM's API server comes before the dozen loopback ports its worker
holds. Cost: one ``cgroup.procs`` read per container per cycle (the cgroup text of each GPU process is
parsed once, and cached); the fds and TCP tables are scanned only when a container's set of
processes changed, or, while none of its candidates is an engine yet, every ``rescan_s``
(an engine listens only once its model is loaded). Blocking: the collector runs
:meth:`Discovery.scan` in a worker thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gputally.cgroup.parse import parse_cgroup
from gputally.probes.core.hints import process_attributes
from gputally.probes.core.model import AttrValue, Entity
from gputally.probes.core.procfacts import ProcessInfoSource, ProcFacts
from gputally.probes.engines.model import Endpoint
from gputally.probes.engines.procnet import Listener, NetnsId, listening, netns_id, own_netns, socket_inodes
from gputally.util.once import Once

__all__ = ["Container", "Discovery", "endpoint_of", "unit_of"]

log = logging.getLogger(__name__)

_PREFERRED = ("pids", "memory", "cpu,cpuacct", "cpu", "devices", "name=systemd")
"""cgroup v1 hierarchies to read ``cgroup.procs`` from, in this order, where several name the
same path (in a pod they all do)."""
_ANCESTORS = 3
"""A process in the root cgroup (no container): it, and this many of its parents."""


@dataclass(frozen=True, slots=True)
class Unit:
    """A container as discovery sees it: a cgroup directory, or (no cgroup) a process and its parents."""

    key: str
    """``cgroup:<hierarchy>:<path>`` or ``pid:<pid>``."""
    directory: Path | None
    pid: int


@dataclass
class Container:
    """One container that has a process on a GPU this cycle, and what it listens on."""

    key: str
    pids: frozenset[int]
    gpu_ids: tuple[str, ...]
    """``hw.id`` of each GPU (or MIG device) one of its processes is on this cycle."""
    gpu_pids: tuple[int, ...]
    """Its processes that are on a GPU this cycle."""
    endpoints: list[Endpoint] = field(default_factory=list)
    hints: dict[int, dict[str, AttrValue]] = field(default_factory=dict)
    """The listening process's resource attributes, by pid."""
    changed: bool = True
    """Its processes changed since the last cycle (or it is new): forget what its candidates were."""
    scanned_at: float = 0.0
    engine_found: bool = False
    """Set by the collector: one of its endpoints is an engine, so an unchanged container is not rescanned."""


def unit_of(cgroup: str, pid: int, cgroup_root: Path, *, v2: bool) -> Unit:
    """The container of a process whose ``/proc/PID/cgroup`` reads ``cgroup``.

    Kubernetes: the container's cgroup (below the pod's); Slurm: the job's (every step);
    anything else: the process's own cgroup, unless that is the root, which is no container:
    then the process and its parents."""
    info = parse_cgroup(cgroup)
    chosen = _line_for(cgroup, info.path, cgroup_root, v2=v2)
    if chosen is None:
        return Unit(key=f"pid:{pid}", directory=None, pid=pid)
    hierarchy, path = chosen
    components = [c for c in path.split("/") if c]
    while components and components[0] == "..":  # seen from inside a cgroup namespace (a probe in a pod,
        components.pop(0)                         # cgroup v2): what follows the ..s is the path from the root
    cut = len(components)
    if info.kind == "kubernetes" and info.pod_uid:
        uid_forms = (info.pod_uid, info.pod_uid.replace("-", "_"))
        pod = next((i for i, c in enumerate(components) if any(f"pod{u}" in c for u in uid_forms)), None)
        if pod is not None:
            cut = min(cut, pod + 2)  # the container's cgroup
    elif info.kind == "slurm" and info.slurm_job_id is not None:
        job = next((i for i, c in enumerate(components) if c == f"job_{info.slurm_job_id}"), None)
        if job is not None:
            cut = job + 1
    relative = "/".join(components[:cut])
    base = cgroup_root if v2 and hierarchy == "" else cgroup_root / _mount_name(hierarchy)
    return Unit(key=f"cgroup:{hierarchy}:/{relative}", directory=base / relative, pid=pid)


def _mount_name(hierarchy: str) -> str:
    if hierarchy == "":
        return "unified"  # cgroup v2 beside v1 (hybrid)
    return hierarchy.removeprefix("name=")


def _line_for(cgroup: str, path: str | None, cgroup_root: Path, *, v2: bool) -> tuple[str, str] | None:
    """The hierarchy whose path is the most telling one, where it is mounted; None for the root."""
    if not path or path == "/":
        return None
    lines: dict[str, str] = {}
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].strip() == path:
            lines.setdefault(parts[1], path)
    if v2 and "" in lines:
        return "", path
    ordered = [h for h in _PREFERRED if h in lines] + [h for h in lines if h not in _PREFERRED and h]
    for hierarchy in ordered:
        if (cgroup_root / _mount_name(hierarchy)).is_dir():
            return hierarchy, path
    if "" in lines and (cgroup_root / "unified").is_dir():
        return "", path
    return None


def endpoint_of(listener: Listener, *, proc_root: Path, own: NetnsId | None) -> Endpoint:
    """Where to read a listener: a wildcard address is read on loopback, from inside the
    listener's own network namespace unless it is the probe's."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(listener.host, listener.host)
    netns = None if own is not None and listener.netns == own else str(proc_root / str(listener.pid) / "ns" / "net")
    return Endpoint(host=host, port=listener.port, pid=listener.pid, netns=netns)


class Discovery:
    """What each GPU process's container listens on; remembers containers between cycles."""

    def __init__(
        self,
        *,
        processes: ProcessInfoSource,
        proc_root: Path = Path("/proc"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        rescan_s: float = 30.0,
        max_pids: int = 512,
        max_endpoints: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``max_pids``: most processes of one container looked at; ``max_endpoints``: most
        candidate endpoints per container (a container listening on more is not just an engine)."""
        self._processes = processes
        self._proc_root = Path(proc_root)
        self._cgroup_root = Path(cgroup_root)
        self._v2 = (self._cgroup_root / "cgroup.controllers").exists()
        self._rescan_s = rescan_s
        self._max_pids = max_pids
        self._max_endpoints = max_endpoints
        self._clock = clock
        self._own = own_netns()
        self._ephemeral = _ephemeral_range(self._proc_root)
        self._units: dict[str, Unit] = {}
        """cgroup text (and pid, for the root cgroup) -> its unit: parsed once."""
        self._containers: dict[str, Container] = {}
        self._once: Once[str] = Once()

    def scan(self, processes: Iterable[Entity]) -> list[Container]:
        """The containers of this cycle's GPU processes, each with its candidate endpoints.
        A container no longer on a GPU is forgotten."""
        members: dict[str, tuple[Unit, list[Entity]]] = {}
        for process in processes:
            pid = process.attributes.get("process.pid")
            if not isinstance(pid, int) or isinstance(pid, bool):
                continue
            unit = self._unit(pid, process.attributes.get("process.linux.cgroup"))
            members.setdefault(unit.key, (unit, []))[1].append(process)
        now = self._clock()
        tables: dict[NetnsId, dict[int, tuple[str, int]]] = {}
        found: dict[str, Container] = {}
        for key, (unit, entities) in members.items():
            gpu_ids = tuple(sorted({str(e.attributes["hw.id"]) for e in entities if "hw.id" in e.attributes}))
            gpu_pids = tuple(sorted({int(p) for e in entities if isinstance(p := e.attributes.get("process.pid"), int)}))
            pids = self._pids(unit)
            last = self._containers.get(key)
            if last is not None and last.pids == pids and (last.engine_found or now - last.scanned_at < self._rescan_s):
                last.gpu_ids, last.gpu_pids, last.changed = gpu_ids, gpu_pids, False
                found[key] = last
                continue
            container = Container(key=key, pids=pids, gpu_ids=gpu_ids, gpu_pids=gpu_pids, scanned_at=now,
                                  changed=last is None or last.pids != pids)
            if last is not None and not container.changed:
                container.engine_found = last.engine_found
            self._listen(container, tables)
            found[key] = container
        self._containers = found
        if len(self._units) > 4 * len(found) + 1024:
            self._units.clear()  # processes came and went: parse again
        return list(found.values())

    def members(self, pid: int, cgroup: str) -> frozenset[int]:
        """Every process of the container of ``pid`` (whose cgroup text is ``cgroup``)."""
        return self._pids(self._unit(pid, cgroup))

    def _unit(self, pid: int, cgroup: AttrValue | None) -> Unit:
        text = cgroup if isinstance(cgroup, str) else ""
        unit = self._units.get(text)
        if unit is None or unit.directory is None and unit.pid != pid:
            unit = unit_of(text, pid, self._cgroup_root, v2=self._v2)
            self._units[text] = unit
        return unit

    def _pids(self, unit: Unit) -> frozenset[int]:
        """Every process of the unit: its cgroup subtree's ``cgroup.procs``, or the process and its parents."""
        if unit.directory is None:
            return frozenset(self._ancestry(unit.pid))
        try:
            text = (unit.directory / "cgroup.procs").read_text()
        except OSError as exc:
            if not isinstance(exc, FileNotFoundError) and self._once.first(f"procs:{unit.key}"):
                log.warning("engine discovery: cannot read the processes of %s (%s): its engines are not found",
                            unit.directory, exc)
            return frozenset({unit.pid})  # the container went (or is unreadable): its GPU process at least
        pids = {unit.pid, *_numbers(text)}
        top = str(unit.directory)
        for directory, subdirectories, _ in os.walk(top):  # sub-cgroups (a job's steps); one that goes is skipped
            subdirectories.sort()
            if directory == top:
                continue
            if len(pids) >= self._max_pids:
                break
            try:
                pids.update(_numbers((Path(directory) / "cgroup.procs").read_text()))
            except OSError:
                continue
        return frozenset(sorted(pids)[: self._max_pids])

    def _ancestry(self, pid: int) -> list[int]:
        chain = [pid]
        for _ in range(_ANCESTORS):
            try:
                stat = (self._proc_root / str(chain[-1]) / "stat").read_text()
                parent = int(stat[stat.rfind(")") + 2 :].split()[1])
            except (OSError, ValueError, IndexError):
                break
            if parent <= 1:
                break
            chain.append(parent)
        return chain

    def _listen(self, container: Container, tables: dict[NetnsId, dict[int, tuple[str, int]]]) -> None:
        """Fill ``container``'s endpoints and their processes' hints from its processes' sockets."""
        held: dict[NetnsId, list[tuple[int, set[int]]]] = {}
        for pid in sorted(container.pids):
            try:
                inodes = socket_inodes(self._proc_root, pid)
                if not inodes:
                    continue
                namespace = netns_id(self._proc_root, pid)
            except FileNotFoundError:
                continue  # exited mid-walk
            except PermissionError as exc:
                if self._once.first("permission"):
                    log.warning("engine discovery: %s: cannot list pid %d's sockets (%s); the probe needs root "
                                "with CAP_SYS_PTRACE (and hostPID in a pod) to find engines", self._proc_root, pid, exc)
                continue
            except OSError:
                continue
            held.setdefault(namespace, []).append((pid, inodes))
        listeners: dict[tuple[str, int], Listener] = {}
        for namespace, holders in held.items():
            table = tables.get(namespace)
            if table is None:
                table = self._table(holders)
                tables[namespace] = table
            for pid, inodes in holders:
                for inode in inodes & table.keys():
                    host, port = table[inode]
                    known = listeners.get((host, port))
                    if known is None or pid < known.pid:
                        listeners[(host, port)] = Listener(host=host, port=port, inode=inode, pid=pid, netns=namespace)
        gpu = set(container.gpu_pids)
        low, high = self._ephemeral
        chosen = sorted(listeners.values(), key=lambda item: (
            item.pid in gpu,                       # an engine's server is seldom its GPU worker (vLLM, TGI)
            _loopback(item.host),                  # a served port is usually on every address or the pod IP
            low <= item.port <= high,              # a port chosen by the kernel is an internal socket
            item.port, item.host,
        ))
        if len(chosen) > self._max_endpoints and self._once.first(f"many:{container.key}"):
            log.warning("engine discovery: %s listens on %d ports; only the lowest %d are tried",
                        container.key, len(chosen), self._max_endpoints)
        for listener in chosen[: self._max_endpoints]:
            container.endpoints.append(endpoint_of(listener, proc_root=self._proc_root, own=self._own))
            if listener.pid not in container.hints:
                container.hints[listener.pid] = process_attributes(listener.pid, self._facts(listener.pid))

    def _table(self, holders: list[tuple[int, set[int]]]) -> dict[int, tuple[str, int]]:
        for pid, _ in holders:  # any process of the namespace will do; the first may have exited
            try:
                return listening(self._proc_root, pid)
            except OSError:
                continue
        return {}

    def _facts(self, pid: int) -> ProcFacts | None:
        try:
            return self._processes.facts(pid)
        except Exception:  # hints are best effort
            log.debug("pid %d: its /proc facts could not be read", pid, exc_info=True)
            return None


def _loopback(host: str) -> bool:
    return host.startswith("127.") or host == "::1"


def _ephemeral_range(proc_root: Path) -> tuple[int, int]:
    """The ports the kernel hands out to sockets bound to port 0 (``ip_local_port_range``)."""
    try:
        low, high = (proc_root / "sys" / "net" / "ipv4" / "ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _numbers(text: str) -> set[int]:
    """The pids of a ``cgroup.procs`` (0: a process outside the reader's pid namespace)."""
    return {int(word) for word in text.split() if word.isdigit() and word != "0"}
