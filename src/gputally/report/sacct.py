"""``report --compare-sacct``: gputally's allocated GPU-time per Slurm job against Slurm's own
accounting (``sacct``), job by job.

Slurm's accounting database keeps, for every job, the GPUs it was allocated (``AllocTRES``'s
``gres/gpu=N``) and how long it ran (``ElapsedRaw``, whole seconds). A job's allocated
GPU-seconds are therefore N x elapsed, and gputally's ``gputally.usage.allocated.time`` of
that job, summed over its GPUs, should say the same. They differ by how finely each side sees
the job's start and end: gputally integrates between probe samples, so each boundary can be
off by one probe interval (plus the ``slurm`` processor's allocation refresh), and ``sacct``
rounds each boundary to the second. ``--tolerance`` (per GPU and per boundary) says how much
is accepted.

Input, either (the file, or ``-`` for stdin):

* ``sacct --json`` (Slurm 21.08+): ``jobs[].job_id``, ``jobs[].time.elapsed``,
  ``jobs[].tres.allocated[]`` with ``type`` ``gres`` and ``name`` ``gpu``;
* ``sacct -X -P -o JobIDRaw,ElapsedRaw,AllocTRES`` (parsable, with its header line; any order
  of these columns, ``JobID`` and ``Elapsed`` accepted instead).

Job steps (``123.batch``) are skipped: a job's allocation is its own line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import UsageError
from .queries import Account

__all__ = ["Comparison", "Job", "compare", "parse", "render"]


@dataclass(frozen=True, slots=True)
class Job:
    """One job as ``sacct`` books it."""

    job_id: str
    gpus: int
    elapsed: float
    """Seconds."""

    @property
    def gpu_seconds(self) -> float:
        return self.gpus * self.elapsed


@dataclass(frozen=True, slots=True)
class Line:
    job_id: str
    gpus: int
    sacct: float | None
    """GPU-seconds per sacct; None for a job sacct does not list."""
    gputally: float | None
    """GPU-seconds per gputally; None for a job without usage counters."""
    allowed: float

    @property
    def difference(self) -> float:
        return (self.gputally or 0.0) - (self.sacct or 0.0)

    @property
    def ok(self) -> bool:
        if self.sacct is None:  # outside the sacct file's jobs: shown, never a mismatch
            return True
        return abs(self.difference) <= self.allowed


@dataclass(frozen=True, slots=True)
class Comparison:
    lines: list[Line]
    tolerance: float

    @property
    def ok(self) -> bool:
        return all(line.ok for line in self.lines)


_ELAPSED = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")


def _elapsed(text: str) -> float:
    """``[D-][HH:]MM:SS`` (sacct's Elapsed) in seconds."""
    match = _ELAPSED.match(text.strip())
    if not match:
        raise ValueError(text)
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)


def _tres_gpus(text: str) -> int:
    """``gres/gpu=N`` of an AllocTRES string (the typed ``gres/gpu:h200=N`` when the untyped
    count is absent)."""
    counts: dict[str, int] = {}
    for item in text.split(","):
        key, _, value = item.strip().partition("=")
        if key.startswith("gres/gpu") and value:
            counts[key] = int(value)
    if "gres/gpu" in counts:
        return counts["gres/gpu"]
    return sum(counts.values())


def _json_jobs(body: Any, source: str) -> list[Job]:
    if not isinstance(body, Mapping) or not isinstance(body.get("jobs"), list):
        raise UsageError(f"--compare-sacct {source}: JSON without a \"jobs\" list: is it `sacct --json`?")
    jobs = []
    for index, job in enumerate(body["jobs"]):
        try:
            job_id = str(int(job["job_id"]))
            elapsed = float(job["time"]["elapsed"])
            allocated = job.get("tres", {}).get("allocated", []) or []
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"--compare-sacct {source}: jobs[{index}] lacks job_id or time.elapsed ({exc!r})") from exc
        gpus = {str(t.get("name")): int(t.get("count", 0)) for t in allocated
                if isinstance(t, Mapping) and t.get("type") == "gres" and str(t.get("name", "")).startswith("gpu")}
        jobs.append(Job(job_id, gpus["gpu"] if "gpu" in gpus else sum(gpus.values()), elapsed))
    return jobs


def _parsable_jobs(text: str, source: str) -> list[Job]:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = [h.strip() for h in lines[0].rstrip("|").split("|")]
    where = {name: i for i, name in enumerate(header)}
    id_column = "JobIDRaw" if "JobIDRaw" in where else "JobID" if "JobID" in where else None
    if id_column is None or "AllocTRES" not in where or not {"ElapsedRaw", "Elapsed"} & set(where):
        raise UsageError(f"--compare-sacct {source}: expected a header with JobIDRaw (or JobID), ElapsedRaw (or "
                         "Elapsed) and AllocTRES: run `sacct -X -P -o JobIDRaw,ElapsedRaw,AllocTRES` (without -n)")
    jobs = []
    for number, line in enumerate(lines[1:], 2):
        cells = line.rstrip("|").split("|")
        if len(cells) < len(header):
            raise UsageError(f"--compare-sacct {source}: line {number} has {len(cells)} fields, the header {len(header)}")
        job_id = cells[where[id_column]].strip()
        if "." in job_id:  # a step
            continue
        try:
            elapsed = (float(cells[where["ElapsedRaw"]]) if "ElapsedRaw" in where
                       else _elapsed(cells[where["Elapsed"]]))
            gpus = _tres_gpus(cells[where["AllocTRES"]])
        except ValueError as exc:
            raise UsageError(f"--compare-sacct {source}: line {number}: cannot read {exc}") from exc
        jobs.append(Job(job_id, gpus, elapsed))
    return jobs


def parse(text: str, source: str) -> list[Job]:
    """The jobs in ``sacct --json`` or ``sacct -P`` output. Raises `UsageError` naming what is
    wrong with it."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"--compare-sacct {source}: not valid JSON ({exc})") from exc
        return _json_jobs(body, source)
    return _parsable_jobs(text, source)


def compare(jobs: Sequence[Job], accounts: Iterable[Account], *, tolerance: float) -> Comparison:
    """Each sacct job with GPUs, or with gputally allocated time, against gputally's figure;
    then gputally's jobs that sacct does not list. ``tolerance`` is seconds per GPU and per
    job boundary."""
    ours: dict[str, float] = {}
    for account in accounts:
        if account.kind == "slurm.job":
            ours[account.owner] = ours.get(account.owner, 0.0) + account.allocated
    lines = []
    listed = set()
    for job in jobs:
        listed.add(job.job_id)
        if job.gpus == 0 and not ours.get(job.job_id):
            continue
        lines.append(Line(job.job_id, job.gpus, job.gpu_seconds, ours.get(job.job_id),
                          allowed=2 * tolerance * max(job.gpus, 1)))
    for job_id in sorted(set(ours) - listed, key=_job_order):
        if ours[job_id] > 0:
            lines.append(Line(job_id, 0, None, ours[job_id], allowed=0.0))
    return Comparison(lines, tolerance)


def _job_order(job_id: str) -> tuple[int, str]:
    return (int(job_id), "") if job_id.isdigit() else (0, job_id)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def render(comparison: Comparison) -> str:
    """The table, and a line saying whether the books agree."""
    headers = ["job", "GPUs", "sacct GPU-s", "gputally GPU-s", "difference", "allowed", ""]
    rows = [[line.job_id, str(line.gpus) if line.sacct is not None else "-", _seconds(line.sacct),
             _seconds(line.gputally), f"{line.difference:+,.1f}", _seconds(line.allowed) if line.sacct is not None
             else "-", ("ok" if line.ok else "MISMATCH") if line.sacct is not None else "not in sacct"]
            for line in comparison.lines]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    text = ["  ".join(c.ljust(widths[i]) if i in (0, 6) else c.rjust(widths[i]) for i, c in enumerate(r)).rstrip()
            for r in [headers, *rows]]
    bad = sum(1 for line in comparison.lines if not line.ok)
    checked = sum(1 for line in comparison.lines if line.sacct is not None)
    verdict = (f"{checked} jobs agree with sacct within {comparison.tolerance:g} s per GPU and job boundary"
               if bad == 0 else f"{bad} of {checked} jobs differ from sacct by more than "
                                f"{comparison.tolerance:g} s per GPU and job boundary")
    return "\n".join([*text, "", verdict]) + "\n"
