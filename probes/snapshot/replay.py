"""A snapshot vendor's recording: :class:`SnapshotReplay` serves one as the live source would,
:class:`SnapshotRecorder` writes what a live source read in the same form.

The format is ``{"format", "driver", "snapshots", "proc_facts"}``: the snapshots exactly as
the vendor's live source returned them, the process facts as
:func:`~gputally.probes.core.procfacts.record_of` keeps them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gputally.probes.core.procfacts import ProcessInfoSource, ProcFacts, facts_from_record, record_of
from gputally.probes.snapshot.source import SnapshotSource, VendorUnavailable

__all__ = ["SnapshotRecorder", "SnapshotReplay"]


class SnapshotReplay:
    """Serves a recording (``{"driver", "snapshots", "proc_facts"}``) as the live source would.

    Snapshots are served in turn and the recording starts over after the last; an entry
    ``"unavailable": "message"`` makes ``open`` fail as a node without the vendor stack does.
    Also the :class:`~gputally.probes.core.procfacts.ProcessInfoSource` (from ``proc_facts``).
    """

    def __init__(self, recording: Mapping[str, Any]) -> None:
        snapshots = recording.get("snapshots")
        if not isinstance(snapshots, list) or not snapshots:
            raise ValueError("the recording has no snapshots")
        self.recording = recording
        self._next = 0

    @classmethod
    def from_file(cls, path: Path) -> SnapshotReplay:
        return cls(json.loads(Path(path).read_text()))

    def open(self) -> dict[str, Any]:
        if self.recording.get("unavailable"):
            raise VendorUnavailable(str(self.recording["unavailable"]))
        return dict(self.recording.get("driver") or {})

    def snapshot(self) -> dict[str, Any]:
        snapshots = self.recording["snapshots"]
        snap = snapshots[self._next % len(snapshots)]
        self._next += 1
        if isinstance(snap, Mapping) and snap.get("unavailable"):
            raise VendorUnavailable(str(snap["unavailable"]))
        return json.loads(json.dumps(snap))  # a fresh copy: mappers may not share state with the file

    def close(self) -> None:
        pass

    def facts(self, pid: int) -> ProcFacts | None:
        recorded = (self.recording.get("proc_facts") or {}).get(str(pid))
        return facts_from_record(pid, recorded) if recorded is not None else None


class SnapshotRecorder:
    """Wraps a live source (and its ProcessInfoSource) and writes what each cycle read to ``path``
    in the replay format, rewritten after every cycle."""

    def __init__(self, inner: SnapshotSource, processes: ProcessInfoSource, *, path: Path, fmt: str) -> None:
        self._inner, self._processes, self._path = inner, processes, Path(path)
        self._recording: dict[str, Any] = {
            "format": fmt, "constructed": False, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "driver": {}, "snapshots": [], "proc_facts": {},
        }

    def open(self) -> dict[str, Any]:
        driver = self._inner.open()
        self._recording["driver"] = driver
        return driver

    def snapshot(self) -> dict[str, Any]:
        snap = self._inner.snapshot()
        self._recording["snapshots"].append(snap)
        self._write()
        return snap

    def close(self) -> None:
        self._inner.close()

    def facts(self, pid: int) -> ProcFacts | None:
        facts = self._processes.facts(pid)
        if facts is not None:
            self._recording["proc_facts"][str(pid)] = record_of(facts)
            self._write()
        return facts

    def _write(self) -> None:
        tmp = self._path.with_name(self._path.name + ".tmp")
        tmp.write_text(json.dumps(self._recording, indent=1, default=str))
        os.replace(tmp, self._path)
