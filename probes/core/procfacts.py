"""What /proc says about a GPU process, for every vendor's probe: the facts, the interface that
serves them, and their form in a recording (``proc_facts``).

Live, :class:`~gputally.probes.core.hints.ProcFs` reads a (host) proc root; a replay serves the
recording's ``proc_facts`` through :func:`facts_from_record`, which a recorder wrote with
:func:`record_of`. One recorded form for NVIDIA, AMD and Gaudi recordings alike.
"""

from __future__ import annotations

import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["ProcFacts", "ProcessInfoSource", "facts_from_record", "record_of"]


@dataclass(frozen=True)
class ProcFacts:
    """What /proc says about one process; any part may be missing (permissions, races)."""

    pid: int
    cgroup: str | None = None
    """Text of /proc/PID/cgroup, unparsed (the processors parse it)."""
    comm: str | None = None
    exe: str | None = None
    """Target of /proc/PID/exe."""
    uid: int | None = None
    """Effective uid (second field of the ``Uid:`` line)."""
    owner: str | None = None
    """User name for ``uid``."""
    start_time: float | None = None
    """Process start, seconds since the epoch: with the pid it names the process uniquely."""


class ProcessInfoSource(Protocol):
    """Facts about GPU processes, for attribution hints."""

    def facts(self, pid: int) -> ProcFacts | None:
        """What is known about ``pid``; None when it has gone."""


def facts_from_record(pid: int, recorded: Mapping[str, Any]) -> ProcFacts:
    """The facts a recording keeps for ``pid``; the owner is looked up from the uid when the
    recording does not name it (recordings made before owners were kept)."""
    uid: int | None = None
    for line in recorded.get("status_uid", []):
        if line.startswith("Uid:"):
            parts = line.split()
            uid = int(parts[2]) if len(parts) > 2 else None
    owner = recorded.get("owner")
    if owner is None and uid is not None:
        try:
            owner = pwd.getpwuid(uid).pw_name
        except KeyError:
            owner = None
    start = recorded.get("start_time")
    return ProcFacts(
        pid=pid,
        cgroup=recorded.get("cgroup"),
        comm=recorded.get("comm"),
        exe=recorded.get("exe"),
        uid=uid,
        owner=owner,
        start_time=float(start) if start is not None else None,
    )


def record_of(facts: ProcFacts) -> dict[str, Any]:
    """``facts`` as a recording keeps them (the inverse of :func:`facts_from_record`); the uid as
    the ``Uid:`` line of /proc/PID/status, so recordings read like the file they came from."""
    out: dict[str, Any] = {"cgroup": facts.cgroup, "comm": facts.comm}
    for key in ("exe", "owner", "start_time"):
        if getattr(facts, key) is not None:
            out[key] = getattr(facts, key)
    if facts.uid is not None:
        out["status_uid"] = [f"Uid:\t{facts.uid}\t{facts.uid}\t{facts.uid}\t{facts.uid}"]
    return out
