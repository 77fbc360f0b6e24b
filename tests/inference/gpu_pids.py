"""A recorded GPU whose processes are live ones: the replay's device readings, with each
recorded pid replaced by a real process's pid (which a test may change mid-run, as when an
engine restarts and its new worker takes the GPU).

Only the device side is replayed: the probe reads the processes themselves (cgroup, command
line, sockets) from the real ``/proc``, so discovery and attribution go the real path.
"""

from __future__ import annotations

from typing import Any

from gputally.probes.nvml.replay import ReplaySource

__all__ = ["RemappedReplay"]


def _remap(value: Any, pids: dict[int, int]) -> Any:
    if isinstance(value, dict):
        return {k: (pids.get(v, v) if k == "pid" and isinstance(v, int) else _remap(v, pids)) for k, v in value.items()}
    if isinstance(value, list):
        return [_remap(v, pids) for v in value]
    return value


class RemappedReplay:
    """A :class:`ReplaySource` as a device source, each recorded pid read as ``pids[pid]``."""

    def __init__(self, source: ReplaySource, pids: dict[int, int]) -> None:
        self.source = source
        self.pids = pids
        """recorded pid -> live pid; change it to move a GPU process to another process."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)

    def read(self, gpu: Any, reading: Any) -> Any:
        return _remap(self.source.read(gpu, reading), self.pids)

    def process_utilization(self, gpu: Any, last_seen: int) -> list[dict[str, Any]]:
        remapped: list[dict[str, Any]] = _remap(self.source.process_utilization(gpu, last_seen), self.pids)
        return remapped
