"""Backends at their edges, without a cluster: stand-in commands, a stand-in slurmrestd, a
stand-in pyslurm module. (The real cluster runs the same backends in test_cluster.py.)"""

from __future__ import annotations

import json
import os
import sys
import time
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gputally.processors.slurm import (
    CliBackend,
    CliConfig,
    JobInfo,
    PyslurmBackend,
    PyslurmConfig,
    RestdBackend,
    SlurmError,
    SlurmrestdConfig,
    SlurmUnavailable,
)

TESTDATA = Path(__file__).parent / "testdata"


def command(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


async def test_cli_reads_scontrol_and_squeue(tmp_path: Path) -> None:
    text = TESTDATA / "scontrol_show_job.txt"
    scontrol = command(tmp_path, "scontrol", f"""
case "$1 $2" in
  "show job") grep "^JobId=$5 " {text} || {{ echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }} ;;
  "show config") echo "ClusterName             = from-config" ;;
esac
""")
    squeue = command(tmp_path, "squeue", f'[ "$1 $2" = "--all --json" ] && cat {TESTDATA / "squeue.json"}\n')
    backend = CliBackend(CliConfig(scontrol=scontrol, squeue=squeue), environ={"PATH": os.environ["PATH"]})
    job = await backend.get_job(5)
    assert job is not None and (job.job_id, job.array_task_id, job.cluster) == (5, 0, "from-config")
    assert await backend.get_job(42) is None
    jobs = await backend.running_jobs()
    assert sorted(j.job_id for j in jobs) == [1, 2, 3, 4, 5]
    assert [j.job_id for j in await backend.jobs_on_node("vm")] == [j.job_id for j in jobs]
    assert await backend.jobs_on_node("elsewhere") == []


async def test_cli_failures_are_unavailable(tmp_path: Path) -> None:
    slow = command(tmp_path, "slow", "exec sleep 30\n")
    backend = CliBackend(CliConfig(scontrol=slow, timeout=0.3), environ={})
    started = time.monotonic()
    with pytest.raises(SlurmUnavailable, match=r"took longer than 0\.3 s"):
        await backend.get_job(1)
    assert time.monotonic() - started < 5
    refused = command(
        tmp_path, "refused", 'echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1\n'
    )
    with pytest.raises(SlurmUnavailable, match="Unable to contact slurm controller"):
        await CliBackend(CliConfig(scontrol=refused), environ={}).get_job(1)
    with pytest.raises(SlurmUnavailable, match="cannot run"):
        await CliBackend(CliConfig(scontrol=str(tmp_path / "absent")), environ={}).get_job(1)
    garbage = command(tmp_path, "squeue", "echo not json\n")
    with pytest.raises(SlurmError, match="printed something else"):
        await CliBackend(CliConfig(squeue=garbage), environ={}).running_jobs()


class Restd:
    """A stand-in slurmrestd answering from the captured documents, recording the headers it saw."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self.status = 200

    async def job(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        if self.status != 200:
            return web.Response(status=self.status, text="Authentication failure")
        if request.match_info["id"] == "5":
            return web.Response(text=(TESTDATA / "slurmrestd_job.json").read_text(), content_type="application/json")
        errors = [{"description": "Unable to find JobId", "error_number": 2017, "error": "Invalid job id specified"}]
        return web.json_response({"errors": errors, "jobs": []}, status=500)

    async def jobs(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        if request.headers.get("X-SLURM-USER-TOKEN") == "broken":
            return web.Response(text="<html>proxy error</html>", status=502)
        return web.Response(text=(TESTDATA / "squeue.json").read_text(), content_type="application/json")


@pytest.fixture
async def restd() -> AsyncIterator[tuple[Restd, str]]:
    server = Restd()
    app = web.Application()
    app.router.add_get("/slurm/v0.0.38/job/{id}", server.job)
    app.router.add_get("/slurm/v0.0.38/jobs", server.jobs)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield server, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_restd_token_file_rotation_and_answers(restd: tuple[Restd, str], tmp_path: Path) -> None:
    server, url = restd
    token = tmp_path / "jwt"
    token.write_text("first\n")
    config = SlurmrestdConfig.model_validate({"endpoint": url, "token_file": token, "user": "gputally"})
    backend = RestdBackend(config)
    await backend.start()
    try:
        job = await backend.get_job(5)
        assert job is not None and job.array_job_id == 3
        assert await backend.get_job(6) is None  # 2017: no such job
        assert len(await backend.running_jobs()) == 5
        token.write_text("second\n")
        os.utime(token, (time.time() + 5, time.time() + 5))
        await backend.get_job(5)
        assert [(h["X-SLURM-USER-NAME"], h["X-SLURM-USER-TOKEN"]) for h in server.headers] == [
            ("gputally", "first")] * 3 + [("gputally", "second")]
        server.status = 401
        with pytest.raises(SlurmUnavailable, match="HTTP 401"):
            await backend.get_job(5)
        token.write_text("broken")
        os.utime(token, (time.time() + 10, time.time() + 10))
        with pytest.raises(SlurmUnavailable, match="not JSON"):
            await backend.running_jobs()
    finally:
        await backend.close()
        await backend.close()


async def test_restd_unreachable() -> None:
    config = SlurmrestdConfig.model_validate({"endpoint": "http://127.0.0.1:1", "token": "t", "timeout": 1})
    backend = RestdBackend(config)
    with pytest.raises(SlurmUnavailable, match="not started"):
        await backend.get_job(1)
    await backend.start()
    try:
        with pytest.raises(SlurmUnavailable, match=r"GET http://127\.0\.0\.1:1/slurm/v0\.0\.38/job/1"):
            await backend.get_job(1)
    finally:
        await backend.close()


class _RPCError(Exception):
    def __init__(self, errno: int) -> None:
        super().__init__(f"RPC failed: {errno}")
        self.errno = errno


class _Job:
    """Shaped like pyslurm 23.2+'s ``pyslurm.Job`` (attributes as documented)."""

    def __init__(self, job_id: int, state: str, layout: dict[str, Any], **extra: Any) -> None:
        self.id, self.state, self._layout = job_id, state, layout
        self.name, self.user_name, self.user_id = "train", "alice", 1001
        self.account, self.partition, self.qos, self.cluster = "ml", "h200", "normal", "east"
        self.allocated_nodes, self.array_id, self.array_task_id = "n[1-2]", None, None
        self.__dict__.update(extra)

    def get_resource_layout_per_node(self) -> dict[str, Any]:
        return self._layout


def fake_pyslurm() -> types.ModuleType:
    module = types.ModuleType("pyslurm")
    jobs = {
        7: _Job(7, "RUNNING", {
            "n1": {"cpu_ids": "0-3", "gres": {"gpu:h200": {"count": 2, "indexes": "0-1"}}, "memory": 1},
            "n2": {"gres": {"gpu": {"count": 1, "indexes": "3"}}},
        }),
        8: _Job(8, "PENDING", {}, array_id=8, array_task_id=2),
    }

    class Job:
        @staticmethod
        def load(job_id: int) -> _Job:
            if job_id == 99:
                raise _RPCError(1007)  # some other failure
            if job_id not in jobs:
                raise _RPCError(2017)
            return jobs[job_id]

    class Jobs:
        @staticmethod
        def load() -> dict[int, _Job]:
            return dict(jobs)

    module.Job, module.Jobs, module.RPCError = Job, Jobs, _RPCError  # type: ignore[attr-defined]
    return module


async def test_pyslurm_against_its_documented_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """UNVERIFIED against real pyslurm: checks the mapping of pyslurm 23.2+'s documented API only."""
    conf = tmp_path / "slurm.conf"
    backend = PyslurmBackend(PyslurmConfig(slurm_conf=conf), environ={})
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm())
    with pytest.raises(SlurmError, match="does not exist"):
        await backend.get_job(7)
    conf.write_text("ClusterName=east\n")
    job = await backend.get_job(7)
    assert job == JobInfo(job_id=7, name="train", user="alice", uid=1001, account="ml", partition="h200",
                          qos="normal", nodes="n[1-2]", cluster="east", state="RUNNING",
                          gpus=(("n1", (0, 1)), ("n2", (3,))))
    assert await backend.get_job(5) is None
    with pytest.raises(SlurmUnavailable, match="RPC failed: 1007"):
        await backend.get_job(99)
    assert [j.job_id for j in await backend.running_jobs()] == [7]
    pending = await backend.get_job(8)
    assert pending is not None and (pending.array_job_id, pending.array_task_id) == (8, 2)


def test_captured_documents_are_what_the_parsers_expect() -> None:
    assert json.loads((TESTDATA / "squeue.json").read_text())["meta"]["Slurm"]["release"] == "22.05.8"
