"""Job metadata from Slurm's own commands, for a gateway that has them and a slurm.conf.

* ``scontrol show job -d --oneliner <id>``: one job, running or finished within
  ``MinJobAge``, with its GRES indexes per node. ``scontrol --json`` does not exist in 22.05.
* ``squeue --all --json``: every job at once (Slurm 22.05 ignores ``-j`` with ``--json``,
  so it is filtered here), for the periodic GPU allocation refresh.

Commands are fixed argument lists run without a shell, with a timeout after which they are
killed. The cluster name, which ``scontrol show job`` does not print, comes once from
``scontrol show config``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Mapping
from dataclasses import replace

from gputally.processors.slurm.config import CliConfig
from gputally.processors.slurm.errors import SlurmError, SlurmUnavailable
from gputally.processors.slurm.gres import parse_gres_indexes
from gputally.processors.slurm.hostlist import expand_hostlist
from gputally.processors.slurm.model import JobInfo

from .base import Backend, first
from .json_jobs import jobs_from_json, running

__all__ = ["CliBackend", "parse_scontrol_jobs"]

_KEY = re.compile(r"\s+(?=[A-Za-z][\w:/]*=)")
_USER = re.compile(r"^(?P<name>[^(]*)\((?P<uid>\d+)\)$")
_CLUSTER = re.compile(r"^ClusterName\s*=\s*(\S+)", re.MULTILINE)
_NOT_FOUND = "Invalid job id"


class CliBackend(Backend):
    """``scontrol`` and ``squeue`` as subprocesses; see the module docstring."""

    name = "cli"

    def __init__(self, config: CliConfig, *, environ: Mapping[str, str]) -> None:
        self._config = config
        env = dict(environ)
        if config.slurm_conf is not None:
            env["SLURM_CONF"] = str(config.slurm_conf)
        self._env = env
        self._cluster: str | None = None

    async def get_job(self, job_id: int) -> JobInfo | None:
        code, out, err = await self._run(self._config.scontrol, "show", "job", "-d", "--oneliner", str(job_id))
        if code != 0:
            if _NOT_FOUND in err:
                return None
            raise SlurmUnavailable(f"scontrol show job {job_id} exited {code}: {_first_line(err)}")
        job = first(parse_scontrol_jobs(out), job_id)
        if job is None:
            return None
        cluster = await self._cluster_name()
        if cluster and job.cluster is None:
            job = replace(job, cluster=cluster)
        return job

    async def running_jobs(self) -> list[JobInfo]:
        code, out, err = await self._run(self._config.squeue, "--all", "--json")
        if code != 0:
            raise SlurmUnavailable(f"squeue --json exited {code}: {_first_line(err)}")
        try:
            jobs = jobs_from_json(json.loads(out))
        except ValueError as exc:
            raise SlurmError(f"squeue --json printed something else: {exc}") from exc
        return running(jobs)

    async def _cluster_name(self) -> str | None:
        if self._cluster is None:
            code, out, _ = await self._run(self._config.scontrol, "show", "config")
            match = _CLUSTER.search(out) if code == 0 else None
            if match:
                self._cluster = match.group(1)
        return self._cluster

    async def _run(self, program: str, *args: str) -> tuple[int, str, str]:
        try:
            process = await asyncio.create_subprocess_exec(
                program, *args, env=self._env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise SlurmUnavailable(f"cannot run {program}: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(process.communicate(), self._config.timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise SlurmUnavailable(f"{program} {' '.join(args)} took longer than {self._config.timeout:g} s") from None
        except BaseException:  # cancelled: leave no child behind
            if process.returncode is None:
                process.kill()
                await process.wait()
            raise
        assert process.returncode is not None
        return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def parse_scontrol_jobs(text: str) -> list[JobInfo]:
    """Jobs from ``scontrol show job -d --oneliner`` (one line per job)."""
    jobs = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("JobId="):
            job = _parse_line(line)
            if job is not None:
                jobs.append(job)
    return jobs


def _parse_line(line: str) -> JobInfo | None:
    pairs: list[tuple[str, str]] = []
    for token in _KEY.split(line):
        key, _, value = token.partition("=")
        pairs.append((key, value.strip()))
    fields = dict(pairs)  # the first occurrence matters only for per-node detail, read below
    job_id = _int(fields.get("JobId"))
    if job_id is None:
        return None
    user, uid = None, None
    match = _USER.match(fields.get("UserId", ""))
    if match:
        user, uid = match.group("name") or None, int(match.group("uid"))
    array_job_id = _int(fields.get("ArrayJobId"))
    gpus: list[tuple[str, tuple[int, ...]]] = []
    nodes_expr: str | None = None
    for key, value in pairs:  # "Nodes=gpu[01-02] CPU_IDs=0-3 Mem=0 GRES=gpu:2(IDX:0-1)", once per layout
        if key == "Nodes":
            nodes_expr = value
        elif key == "GRES" and nodes_expr:
            indexes = parse_gres_indexes(value)
            if indexes:
                with contextlib.suppress(ValueError):  # an unreadable node list: no GPUs from it
                    gpus.extend((node, indexes) for node in expand_hostlist(nodes_expr))
            nodes_expr = None
    return JobInfo(
        job_id=job_id,
        name=_text(fields.get("JobName")),
        user=user,
        uid=uid,
        account=_text(fields.get("Account")),
        partition=_text(fields.get("Partition")),
        qos=_text(fields.get("QOS")),
        array_job_id=array_job_id,
        array_task_id=_int(fields.get("ArrayTaskId")) if array_job_id is not None else None,
        nodes=_text(fields.get("NodeList")),
        state=_text(fields.get("JobState")),
        gpus=tuple(gpus),
    )


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _text(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "N/A") else value


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "no message")

