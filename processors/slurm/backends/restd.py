"""Job metadata from slurmrestd over HTTP with JWT auth: for a central gateway with no Slurm
installed, which is what a Deployment next to the cluster looks like.

* ``GET /slurm/<version>/job/<id>``: one job (an array's ID answers with all its tasks, so the
  one asked for is picked). An unknown job is HTTP 500 with ``error_number`` 2017
  (``ESLURM_INVALID_JOB_ID``) in ``errors``.
* ``GET /slurm/<version>/jobs``: every job, for the periodic GPU allocation refresh.

Headers ``X-SLURM-USER-NAME`` and ``X-SLURM-USER-TOKEN`` carry the identity; tokens come from
``scontrol token`` (or the site's JWT issuer). Slurm 22.05 answers a bad token with HTTP 500
and ``error_number`` -1 ("Unable to find JobId"), not 401, so that reads as "unavailable"
rather than "no such job".
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from gputally.processors.slurm.config import SlurmrestdConfig
from gputally.processors.slurm.errors import SlurmError, SlurmUnavailable
from gputally.processors.slurm.model import JobInfo
from gputally.tls.client import client_ssl_context

from .base import Backend, first
from .json_jobs import job_from_json, jobs_from_json, running

__all__ = ["RestdBackend"]

ESLURM_INVALID_JOB_ID = 2017


class RestdBackend(Backend):
    """slurmrestd's OpenAPI; see the module docstring."""

    name = "slurmrestd"

    def __init__(self, config: SlurmrestdConfig) -> None:
        self._config = config
        self._base = f"{config.endpoint.rstrip('/')}/slurm/{config.api_version}"
        self._session: aiohttp.ClientSession | None = None
        self._ssl = client_ssl_context(config.tls, key="slurmrestd.tls") if config.tls is not None else None
        self._token_file = _TokenFile(config.token_file) if config.token_file is not None else None

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._config.timeout),
                connector=aiohttp.TCPConnector(limit=4, ssl=self._ssl if self._ssl is not None else True),
            )

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def get_job(self, job_id: int) -> JobInfo | None:
        document = await self._get(f"/job/{job_id}", not_found_ok=True)
        if document is None:
            return None
        jobs = document.get("jobs")
        if not isinstance(jobs, list):
            raise SlurmError(f"slurmrestd answered job {job_id} without a 'jobs' list")
        return first((j for j in map(job_from_json, jobs) if j is not None), job_id)

    async def running_jobs(self) -> list[JobInfo]:
        document = await self._get("/jobs", not_found_ok=False)
        assert document is not None
        try:
            return running(jobs_from_json(document))
        except ValueError as exc:
            raise SlurmError(f"slurmrestd /jobs: {exc}") from exc

    async def _get(self, path: str, *, not_found_ok: bool) -> dict[str, Any] | None:
        if self._session is None:
            raise SlurmUnavailable("slurmrestd backend is not started")
        headers = {"X-SLURM-USER-NAME": self._config.user, "X-SLURM-USER-TOKEN": await self._token()}
        url = self._base + path
        try:
            async with self._session.get(url, headers=headers) as response:
                body = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise SlurmUnavailable(f"GET {url}: {exc.__class__.__name__}: {exc}") from exc
        try:
            document = json.loads(body) if body else {}
        except ValueError:
            document = None
        if not isinstance(document, dict):
            raise SlurmUnavailable(f"GET {url}: HTTP {status}, not JSON: {body[:200]!r}")
        errors = [e for e in document.get("errors") or [] if isinstance(e, dict)]
        if not_found_ok and any(e.get("error_number") == ESLURM_INVALID_JOB_ID for e in errors):
            return None
        if status != 200 or errors:
            detail = "; ".join(str(e.get("description") or e.get("error")) for e in errors)
            detail = detail or body[:200].decode(errors="replace")
            raise SlurmUnavailable(f"GET {url}: HTTP {status}: {detail}")
        return document

    async def _token(self) -> str:
        if self._token_file is not None:
            return await asyncio.to_thread(self._token_file.read)
        assert self._config.token is not None
        return self._config.token.get_secret_value()


class _TokenFile:
    """A token file, re-read when its modification time changes (rotation)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mtime: float | None = None
        self._token = ""

    def read(self) -> str:
        try:
            mtime = self.path.stat().st_mtime
            if mtime != self._mtime:
                self._token = self.path.read_text().strip()
                self._mtime = mtime
        except OSError as exc:
            raise SlurmUnavailable(f"cannot read the slurmrestd token file {self.path}: {exc}") from exc
        return self._token


