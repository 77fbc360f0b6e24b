"""A real cgroup shaped like a Kubernetes pod's container, in every mounted hierarchy.

The kubelet's cgroupfs driver puts a container of a Burstable pod at
``kubepods/burstable/pod<uid>/<64-hex container id>`` in each hierarchy; gputally reads that
path back from ``/proc/PID/cgroup`` (src/gputally/cgroup/parse.py). `PodCgroup.create` makes
those folders in every cgroup v1 hierarchy mounted (controllers and named ones such as
``name=systemd``) and in a cgroup2 one if mounted, each *below the test process's own cgroup
there*, as a nested kubelet would: the tests' processes stay inside whatever accounting or
clean-up the machine keeps on the test run (here: a per-run memory cgroup), and the path
still names the pod. Needs root. `remove` kills what is left inside and removes the folders,
the empty ``kubepods``/``burstable`` above them too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CgroupError", "Hierarchy", "PodCgroup", "hierarchies"]


class CgroupError(RuntimeError):
    """A pod cgroup could not be made, entered or removed."""


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy and this process's own cgroup in it."""

    name: str
    """Its controllers as /proc/self/cgroup names them (``memory``, ``cpu,cpuacct``,
    ``name=systemd``), or ``""`` for cgroup2."""
    own: Path
    """The folder of this process's cgroup in it."""


def _own_cgroups() -> dict[frozenset[str], str]:
    """This process's cgroup path per hierarchy, keyed by its controller names (empty: v2)."""
    paths: dict[frozenset[str], str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths[frozenset(filter(None, parts[1].split(",")))] = parts[2]
    return paths


def hierarchies() -> list[Hierarchy]:
    """Every cgroup hierarchy mounted here (from /proc/self/mountinfo), each once."""
    own = _own_cgroups()
    found: dict[str, Hierarchy] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        dash = fields.index("-")
        fstype, options = fields[dash + 1], set(fields[dash + 3].split(","))
        root, mountpoint = fields[3], Path(fields[4])
        if fstype == "cgroup2":
            key: frozenset[str] = frozenset()
        elif fstype == "cgroup":
            key = next((k for k in own if k and k <= options), frozenset())
            if not key:
                continue
        else:
            continue
        if key not in own:
            continue
        name = ",".join(sorted(key))
        relative = os.path.relpath(own[key], root) if root != "/" else own[key].lstrip("/")
        if relative.startswith(".."):
            continue  # this process's cgroup is outside what this mount shows
        found.setdefault(name, Hierarchy(name, mountpoint / relative if relative != "." else mountpoint))
    if not found:
        raise CgroupError("no cgroup hierarchy is mounted (/proc/self/mountinfo)")
    return sorted(found.values(), key=lambda h: h.name)


def _mkdir(path: Path, hierarchy: Hierarchy) -> None:
    """Make ``path`` (one level); a cpuset must be given CPUs and memory nodes before a process
    can join it, so a new one copies its parent's."""
    with contextlib.suppress(FileExistsError):
        path.mkdir()
    if "cpuset" in hierarchy.name.split(","):
        for knob in ("cpuset.cpus", "cpuset.mems"):
            mine = path / knob
            if mine.exists() and not mine.read_text().strip():
                mine.write_text((path.parent / knob).read_text())


@dataclass(frozen=True)
class PodCgroup:
    """One container's cgroup, in every hierarchy (`create`; `remove` when done)."""

    pod_uid: str
    container_id: str
    qos: str
    directories: tuple[Path, ...]
    """The container's folder in each hierarchy."""

    @classmethod
    def create(cls, *, qos: str = "burstable", pod_uid: str | None = None, container_id: str | None = None) -> PodCgroup:
        """Make ``kubepods/<qos>/pod<uid>/<container id>`` below this process's cgroup in each
        hierarchy (new random ids unless given)."""
        pod_uid = pod_uid or str(uuid.uuid4())
        container_id = container_id or secrets.token_hex(32)
        levels = ["kubepods", *([qos] if qos != "guaranteed" else []), f"pod{pod_uid}", container_id]
        made: list[Path] = []
        try:
            for hierarchy in hierarchies():
                for attempt in range(5):  # another test may remove an empty parent meanwhile
                    try:
                        path = hierarchy.own
                        for level in levels:
                            path = path / level
                            _mkdir(path, hierarchy)
                        break
                    except FileNotFoundError:
                        if attempt == 4:
                            raise
                made.append(path)
        except OSError as exc:
            cls(pod_uid, container_id, qos, tuple(made)).remove()
            raise CgroupError(f"cannot make the pod cgroup {'/'.join(levels)}: {exc} (the engine tests run as root)") from exc
        return cls(pod_uid, container_id, qos, tuple(made))

    @property
    def path(self) -> str:
        """The pod-shaped tail every hierarchy's path ends with."""
        qos = [self.qos] if self.qos != "guaranteed" else []
        return "/".join(["kubepods", *qos, f"pod{self.pod_uid}", self.container_id])

    @property
    def procs_files(self) -> list[Path]:
        """The ``cgroup.procs`` of each hierarchy: write a pid to each to move it in."""
        return [d / "cgroup.procs" for d in self.directories]

    def pids(self) -> set[int]:
        """Every process inside (the union over hierarchies: a process is in all or none)."""
        pids: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(FileNotFoundError):
                pids.update(int(p) for p in procs.read_text().split())
        return pids

    def kill_all(self, timeout: float = 10.0) -> None:
        """SIGKILL every process inside until none is left (or ``timeout`` passes)."""
        deadline = time.monotonic() + timeout
        while pids := self.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise CgroupError(f"processes {sorted(pids)} are still in {self.path} after SIGKILL")
            time.sleep(0.05)

    def remove(self) -> None:
        """Kill what is left inside, then remove the container's and the pod's folders, and
        ``kubepods``/``<qos>`` where now empty (a busy one holds someone else's pod). Safe to
        call twice."""
        self.kill_all()
        above = 2 if self.qos != "guaranteed" else 1
        for directory in self.directories:
            for path in (directory, directory.parent):
                if not _rmdir(path, tries=250):  # an exited process stays listed a moment
                    raise CgroupError(f"cannot remove {path}: still busy")
            path = directory.parent
            for _ in range(above):
                path = path.parent
                if not _rmdir(path, tries=1):
                    break


def _rmdir(path: Path, *, tries: int) -> bool:
    """Remove an empty cgroup folder: True when gone (or never there), False while busy."""
    for _ in range(tries):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                raise CgroupError(f"cannot remove {path}: {exc}") from exc
            time.sleep(0.02)
    return False
