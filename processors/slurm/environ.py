"""PID -> job when cgroups say nothing (``proctrack/linuxproc``): the process's Slurm variables.

Only ``SLURM_JOB_ID`` and ``SLURM_STEP_ID`` are taken from ``/proc/PID/environ``; nothing
else of a user's environment is kept or logged. Reading another user's environment needs
``CAP_SYS_PTRACE`` (or root); without it the answer is quietly "unknown", as it is for a
process that has exited.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["STEP_NAMES", "read_slurm_environ"]

STEP_NAMES = {4294967290: "interactive", 4294967291: "batch", 4294967292: "extern"}
"""Slurm's special step IDs (``SLURM_INTERACTIVE_STEP``, ``SLURM_BATCH_SCRIPT``,
``SLURM_EXTERN_CONT``) and the names their cgroups carry."""

_JOB = b"SLURM_JOB_ID="
_STEP = b"SLURM_STEP_ID="


def read_slurm_environ(proc_root: Path, pid: int) -> tuple[int, str | None] | None:
    """``(job ID, step)`` from ``<proc_root>/<pid>/environ``, or ``None`` (no job, gone, not allowed)."""
    try:
        data = (proc_root / str(pid) / "environ").read_bytes()
    except OSError:  # PermissionError, FileNotFoundError, ProcessLookupError: all mean "unknown"
        return None
    job: int | None = None
    step: str | None = None
    for item in data.split(b"\0"):
        if item.startswith(_JOB):
            value = item[len(_JOB) :]
            job = int(value) if value.isdigit() else None
        elif item.startswith(_STEP):
            value = item[len(_STEP) :]
            if value.isdigit():
                number = int(value)
                step = STEP_NAMES.get(number, str(number))
    if job is None:
        return None
    return job, step
