"""gputally's allocated GPU-time per Slurm job against Slurm's own books, on the real cluster
(slurmctld, slurmd, slurmdbd on MariaDB, slurmrestd): jobs of known GRES counts and lengths
run while the real probe replays the node's two GPUs through ``gputally serve`` (``slurm`` ->
``usage`` -> Prometheus). Each job's allocated GPU-seconds must equal ``sacct``'s GPUs x
elapsed within one probe interval per GPU and job boundary, plus the second to which sacct
rounds each boundary; ``gputally report --compare-sacct`` says the same from sacct's own
output, and says MISMATCH (exit 1) when the books disagree."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from harness.prometheus.fixtures import started_prometheus
from harness.prometheus.server import Binaries, Prometheus
from harness.slurm.cluster import SlurmCluster

from tests.books.live import INTERVAL, allocated_seconds, probe, serve_config, start_serve, two_gpu_recording, wait_for
from tests.report.focus_support import read_rows, validate
from tests.report.support import report

JOBS = (("two-gpus", 2, 6), ("one-gpu-long", 1, 5), ("one-gpu-short", 1, 3))
"""(name, GPUs, seconds of sleep). The first holds both GPUs; the other two wait for it and
then run side by side, one GPU each."""
SACCT_FIELDS = "JobIDRaw,JobName,ElapsedRaw,AllocTRES,State"


def bound(gpus: int) -> float:
    """GPU-seconds two job boundaries may be off by: a probe interval and sacct's whole second each."""
    return gpus * 2 * (INTERVAL + 1.0)


def sacct(cluster: SlurmCluster, jobs: list[int], *extra: str) -> str:
    return cluster.run(["sacct", "-X", "-j", ",".join(map(str, jobs)), *extra]).stdout


def finished(cluster: SlurmCluster, jobs: list[int]) -> bool:
    """Every job COMPLETED in the accounting database (slurmdbd has its end time)."""
    lines = sacct(cluster, jobs, "-n", "-P", "-o", "JobIDRaw,State").split()
    return len(lines) == len(jobs) and all(line.endswith("|COMPLETED") for line in lines)


def gpu_holders(cluster: SlurmCluster) -> list[str]:
    """Other tests' jobs that hold GPUs of the session's cluster (tests/processors/slurm keeps
    two for the whole session): ours would wait behind them."""
    out = cluster.run(["squeue", "-h", "-t", "R,CG,PD", "-o", "%i %b"]).stdout
    return [line for line in out.splitlines() if "gpu" in line]


@pytest.fixture(scope="module")
def prom(prometheus_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with started_prometheus(prometheus_binaries, tmp_path_factory.mktemp("books-slurm") / "prometheus") as server:
        yield server


def test_allocated_gpu_seconds_equal_sacct_per_job(slurm_cluster: SlurmCluster, prom: Prometheus,
                                                    tmp_path: Path) -> None:
    cluster = slurm_cluster
    held = gpu_holders(cluster)
    assert not held, f"jobs of other tests hold the cluster's GPUs, ours would queue behind them: {held}"
    recording = tmp_path / "node.json"
    two_gpu_recording(recording, minors=(5, 3))  # the harness's gres.conf devices, in its order
    token = tmp_path / "slurm-token"
    token.write_text(cluster.token("root"))
    slurm = {"slurm": {"backend": "slurmrestd",
                       "slurmrestd": {"endpoint": cluster.restd_url, "user": "root", "token_file": str(token)},
                       "gres": {"conf": str(cluster.gres_conf)}, "cache": {"refresh_interval": "250ms"}}}
    begin = time.time()
    gateway, port = start_serve(serve_config(slurm, prom), tmp_path)
    try:
        with probe(recording, port, cluster.node, tmp_path / "probe.log"):
            time.sleep(3 * INTERVAL)  # the GPUs seen idle before any job
            ids = [cluster.sbatch(f"sleep {seconds}\n", f"--gres=gpu:{gpus}", f"--job-name={name}")
                   for name, gpus, seconds in JOBS]
            wait_for(lambda: finished(cluster, ids), "the jobs to finish in sacct", timeout=90)
            time.sleep(3 * INTERVAL)  # the GPUs seen free again
        assert gateway.stop() == 0, gateway.log_tail()  # its last emit goes out on the way down
    finally:
        gateway.stop()
    end = time.time() + 1
    wait_for(lambda: set(map(str, ids)) <= set(allocated_seconds(prom.url, begin, end, "slurm.job")),
             "the jobs' counters in Prometheus")
    ours = allocated_seconds(prom.url, begin, end, "slurm.job")

    booked = json.loads(sacct(cluster, ids, "--json"))
    parsable = sacct(cluster, ids, "-P", "-o", SACCT_FIELDS)
    theirs = {}
    for line in parsable.splitlines()[1:]:
        job, name, elapsed, tres, _ = line.split("|")
        gpus = next(int(t.split("=")[1]) for t in tres.split(",") if t.startswith("gres/gpu="))
        theirs[job] = (name, gpus, int(elapsed))
    differences = {}
    for job_id, (name, gpus, elapsed) in theirs.items():
        want = dict((n, (g, s)) for n, g, s in JOBS)[name]
        assert gpus == want[0] and elapsed >= want[1], (name, gpus, elapsed)  # what was asked for, as booked
        differences[name] = ours[job_id] - gpus * elapsed
        assert abs(differences[name]) <= bound(gpus), (name, ours[job_id], gpus * elapsed, differences)
    print(f"gputally - sacct, GPU-s per job: {differences}")

    for name, text in (("json", json.dumps(booked)), ("parsable", parsable)):
        source = tmp_path / f"sacct.{name}"
        source.write_text(text)
        compared = report("--prometheus", prom.url, "--start", f"{begin:.3f}", "--end", f"{end:.3f}",
                          "--compare-sacct", str(source), "--tolerance", f"{INTERVAL + 1:g}s")
        assert compared.code == 0, compared.out + compared.err
        assert compared.out.rstrip().endswith("3 jobs agree with sacct within 2 s per GPU and job boundary"), \
            compared.out
        assert all(str(i) in compared.out for i in ids)
    print(compared.out)

    # Books that disagree: sacct saying the first job ran 10 s longer than it did.
    longer = json.loads(json.dumps(booked))
    longer["jobs"][0]["time"]["elapsed"] += 10
    wrong = tmp_path / "sacct-wrong.json"
    wrong.write_text(json.dumps(longer))
    compared = report("--prometheus", prom.url, "--start", f"{begin:.3f}", "--end", f"{end:.3f}",
                      "--compare-sacct", str(wrong), "--tolerance", f"{INTERVAL + 1:g}s")
    assert compared.code == 1 and "MISMATCH" in compared.out and "1 of 3 jobs differ" in compared.out, compared.out

    # The same run as FOCUS rows: the validator passes them, and each job's rows say its GPU-hours.
    exported = report("--prometheus", prom.url, "--start", f"{begin:.3f}", "--end", f"{end:.3f}",
                      "--format", "focus", "--period", "hour")
    assert exported.code == 0, exported.err
    assert validate(exported.out, tmp_path).passed
    hours: dict[str, float] = {}
    for row in read_rows(exported.out):
        if row["x_GputallyOwnerKind"] == "slurm.job":
            hours[row["AllocatedResourceId"]] = hours.get(row["AllocatedResourceId"], 0.0) + float(row["ConsumedQuantity"])
    assert {job: pytest.approx(seconds / 3600, abs=1e-6) for job, seconds in ours.items()} == hours
