"""Attribution hints: what /proc says about a GPU process, as OTLP resource attributes.

The probe does no Kubernetes or Slurm lookups: it ships the raw facts (cgroup text, owner,
executable, start time) and the processors at the gateway turn them into ``k8s.*`` and
``slurm.*``. Reading happens under a configurable proc root (``/host/proc`` in a container
with the host's /proc mounted); a process that exits mid-read loses its hints, nothing more.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from pathlib import Path
from typing import Any

from gputally.probes.core.procfacts import ProcFacts

__all__ = ["ProcFs", "process_attributes"]

log = logging.getLogger(__name__)


def process_attributes(pid: int, facts: ProcFacts | None) -> dict[str, Any]:
    """Resource attributes for a GPU process: ``process.pid`` always, the rest when known."""
    attributes: dict[str, Any] = {"process.pid": pid}
    if facts is None:
        return attributes
    if facts.cgroup is not None:
        attributes["process.linux.cgroup"] = facts.cgroup.rstrip("\n")
    name = os.path.basename(facts.exe) if facts.exe else facts.comm
    if name:
        attributes["process.executable.name"] = name
    if facts.owner is not None:
        attributes["process.owner"] = facts.owner
    if facts.uid is not None:
        attributes["process.user.id"] = facts.uid
    if facts.start_time is not None:
        start = dt.datetime.fromtimestamp(facts.start_time, tz=dt.UTC)
        attributes["process.creation.time"] = start.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return attributes


class ProcFs:
    """:class:`~gputally.probes.core.procfacts.ProcessInfoSource` reading ``root`` (``/proc`` or a host mount).

    User names come from ``passwd`` (the host's, next to a host proc mount), re-read when the
    file changes; a uid without an entry is reported as its number.
    """

    def __init__(self, root: Path = Path("/proc"), *, passwd: Path | None = None) -> None:
        self.root = Path(root)
        if passwd is None:
            passwd = Path("/etc/passwd") if self.root == Path("/proc") else self.root.parent / "etc" / "passwd"
        self._passwd = passwd
        self._users: dict[int, str] = {}
        self._users_mtime: float | None = None
        self._clock_ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._boot_time: float | None = None

    def facts(self, pid: int) -> ProcFacts | None:
        base = self.root / str(pid)
        try:
            cgroup = (base / "cgroup").read_text()
            stat = (base / "stat").read_text()
            status = (base / "status").read_text()
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            return None  # the process exited: no hints this cycle
        except OSError as exc:
            log.debug("pid %d: cannot read %s: %s", pid, base, exc)
            return None
        comm, start_ticks = _parse_stat(stat)
        uid = _effective_uid(status)
        try:
            exe: str | None = os.readlink(base / "exe")
        except OSError:  # permission (ptrace rules) or gone: fall back to comm
            exe = None
        boot = self._boot()
        start = boot + start_ticks / self._clock_ticks if boot is not None and start_ticks is not None else None
        return ProcFacts(
            pid=pid,
            cgroup=cgroup,
            comm=comm,
            exe=exe.removesuffix(" (deleted)") if exe else None,
            uid=uid,
            owner=self._user(uid) if uid is not None else None,
            start_time=start,
        )

    def _boot(self) -> float | None:
        if self._boot_time is None:
            try:
                for line in (self.root / "stat").read_text().splitlines():
                    if line.startswith("btime "):
                        self._boot_time = float(line.split()[1])
                        break
            except (OSError, ValueError, IndexError) as exc:
                log.warning("cannot read the boot time from %s/stat (%s): processes get no start time", self.root, exc)
                self._boot_time = None
        return self._boot_time

    def _user(self, uid: int) -> str:
        try:
            mtime = self._passwd.stat().st_mtime
        except OSError:
            return str(uid)
        if mtime != self._users_mtime:
            self._users = _read_passwd(self._passwd)
            self._users_mtime = mtime
        return self._users.get(uid, str(uid))


def _parse_stat(text: str) -> tuple[str | None, int | None]:
    """``comm`` and ``starttime`` (field 22, clock ticks after boot) from /proc/PID/stat.

    comm may hold spaces and parentheses, so fields are counted from the last ``)``.
    """
    open_paren, close_paren = text.find("("), text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        return None, None
    comm = text[open_paren + 1 : close_paren]
    rest = text[close_paren + 2 :].split()
    # rest[0] is field 3 (state), so field 22 is rest[19].
    try:
        return comm, int(rest[19])
    except (IndexError, ValueError):
        return comm, None


def _effective_uid(status: str) -> int | None:
    for line in status.splitlines():
        if line.startswith("Uid:"):
            parts = line.split()
            try:
                return int(parts[2])
            except (IndexError, ValueError):
                return None
    return None


def _read_passwd(path: Path) -> dict[int, str]:
    users: dict[int, str] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return users
    for line in lines:
        parts = line.split(":")
        if len(parts) >= 3 and parts[2].isdigit():
            users.setdefault(int(parts[2]), parts[0])
    return users
