"""Job metadata through pyslurm (Slurm's C API), without a subprocess per lookup.

UNVERIFIED against a running cluster: pyslurm must match the cluster's Slurm major version,
PyPI carries pyslurm 25.11 (and 17.x/18.x), and the tested clusters run Slurm 22.05. The code
follows pyslurm's documented 23.2+ API (``pyslurm.Job.load``, ``pyslurm.Jobs.load``,
``Job.get_resource_layout_per_node``); older pyslurm (``pyslurm.job().find_id``) is not
supported.

``import pyslurm`` without a Slurm config kills the process from C, so the module is imported
only on first use and only after a slurm.conf was found. Calls run in a thread under a timeout;
a call stuck in the C library cannot be interrupted, only abandoned.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from gputally.processors.slurm.config import PyslurmConfig
from gputally.processors.slurm.errors import SlurmError, SlurmUnavailable
from gputally.processors.slurm.gres import parse_index_list
from gputally.processors.slurm.model import JobInfo

from .base import Backend
from .json_jobs import running

__all__ = ["PyslurmBackend"]

ESLURM_INVALID_JOB_ID = 2017
T = TypeVar("T")


class PyslurmBackend(Backend):
    """pyslurm's ``Job``/``Jobs``; see the module docstring."""

    name = "pyslurm"

    def __init__(self, config: PyslurmConfig, *, environ: Mapping[str, str]) -> None:
        self._config = config
        self._conf = config.slurm_conf_in(environ)
        self._module: Any = None

    async def get_job(self, job_id: int) -> JobInfo | None:
        module = await self._pyslurm()

        def load() -> JobInfo | None:
            try:
                job = module.Job.load(job_id)
            except getattr(module, "RPCError", SlurmError) as exc:
                if getattr(exc, "errno", None) == ESLURM_INVALID_JOB_ID:
                    return None
                raise
            return _job(job)

        return await self._call(load)

    async def running_jobs(self) -> list[JobInfo]:
        module = await self._pyslurm()

        def load() -> list[JobInfo]:
            return [info for info in (_job(job) for job in module.Jobs.load().values()) if info is not None]

        return running(await self._call(load))

    async def _call(self, function: Callable[[], T]) -> T:
        try:
            return await asyncio.wait_for(asyncio.to_thread(function), self._config.timeout)
        except TimeoutError:
            raise SlurmUnavailable(f"pyslurm call took longer than {self._config.timeout:g} s") from None
        except SlurmError:
            raise
        except Exception as exc:  # pyslurm.RPCError and anything the C layer raises
            raise SlurmUnavailable(f"pyslurm: {exc.__class__.__name__}: {exc}") from exc

    async def _pyslurm(self) -> Any:
        if self._module is None:
            if not self._conf.is_file():
                raise SlurmError(f"pyslurm needs a Slurm config and {self._conf} does not exist; not importing it")
            try:
                self._module = await asyncio.to_thread(importlib.import_module, "pyslurm")
            except ImportError as exc:
                raise SlurmError(f"pyslurm is not installed: {exc}") from exc
        return self._module


def pyslurm_available(conf: Path) -> bool:
    """Whether ``auto`` may pick pyslurm: installed (found without importing it) and a config exists."""
    from importlib.util import find_spec

    return conf.is_file() and find_spec("pyslurm") is not None and os.access(conf, os.R_OK)


def _job(job: Any) -> JobInfo | None:
    job_id = _int(getattr(job, "id", None))
    if job_id is None:
        return None
    array_job_id = _int(getattr(job, "array_id", None)) or None
    gpus: list[tuple[str, tuple[int, ...]]] = []
    try:
        layout = job.get_resource_layout_per_node() or {}
    except Exception:  # noqa: BLE001 - pending jobs have no layout; an odd pyslurm build should not lose the job
        layout = {}
    for node, resources in layout.items():
        indexes = _gpu_indexes(resources.get("gres") if isinstance(resources, Mapping) else None)
        if indexes:
            gpus.append((str(node), indexes))
    return JobInfo(
        job_id=job_id,
        name=_str(getattr(job, "name", None)),
        user=_str(getattr(job, "user_name", None)),
        uid=_int(getattr(job, "user_id", None)),
        account=_str(getattr(job, "account", None)),
        partition=_str(getattr(job, "partition", None)),
        qos=_str(getattr(job, "qos", None)),
        array_job_id=array_job_id,
        array_task_id=_int(getattr(job, "array_task_id", None)) if array_job_id is not None else None,
        nodes=_str(getattr(job, "allocated_nodes", None)),
        cluster=_str(getattr(job, "cluster", None)),
        state=_str(getattr(job, "state", None)),
        gpus=tuple(gpus),
    )


def _gpu_indexes(gres: Any) -> tuple[int, ...]:
    """GPU indexes from pyslurm's GRES dict, ``{"gpu:a100": {"count": 2, "indexes": "0-1"}}``."""
    if not isinstance(gres, Mapping):
        return ()
    found: set[int] = set()
    for key, value in gres.items():
        if str(key).split(":", 1)[0] != "gpu" or not isinstance(value, Mapping):
            continue
        indexes = value.get("indexes")
        if isinstance(indexes, str):
            found.update(parse_index_list(indexes))
        elif isinstance(indexes, list | tuple):
            found.update(i for i in indexes if isinstance(i, int))
    return tuple(sorted(found))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
