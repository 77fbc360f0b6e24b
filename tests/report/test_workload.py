"""``gputally report job JOBID`` / ``report pod NAMESPACE/NAME`` on the fed Prometheus: who,
where, when, one line per GPU, and the notes with their thresholds."""

from __future__ import annotations

import math

from tests.report.support import CURRENCY, Fed, report
from tests.processors.usage.series import GPU, readings

GIB = 2**30


def test_job_view(fed: Fed) -> None:
    want = fed.scene.expected()[str(fed.scene.job)]
    job = str(fed.scene.job)
    command = ["job", job, "--prometheus", fed.url, "--since", "1h"]
    result = report(*command)
    assert result.code == 0 and result.err == "", result.err
    print(f"$ gputally report {' '.join(command)}\n{result.out}")
    lines = result.out.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert lines[0].startswith(f"usage of slurm.job {job}, ")
    assert lines[2] == f"Slurm job {job} (holder) on cluster gputally-test"
    assert lines[3] == "  user root  account physics  partition gpu"
    assert lines[4] == f"  hosts {fed.scene.node}"
    assert lines[5].startswith("  seen ") and lines[6].startswith("  1 GPU: 0.0 GPU-h allocated")
    gpu_line = next(line for line in lines if line.startswith("0 "))
    limit = readings(fed.scene.requests)[0].memory_limit
    assert gpu_line.split()[1:3] == ["NVIDIA", "H200"]
    assert f"{want['peak'] / GIB:.1f}/{limit / GIB:.1f}" in gpu_line.split()
    assert lines[lines.index("notes:") + 1:] == [
        "  - ran on 1 GPU allocated to others: no allocated time, so no utilization",
        f"  - peak memory {want['peak'] / GIB:.1f} GiB of {limit / GIB:.0f} GiB: a smaller MIG profile would do",
    ]


def test_job_view_as_json(fed: Fed) -> None:
    want = fed.scene.expected()[str(fed.scene.job)]
    body = report("job", str(fed.scene.job), *fed.args("--format", "json")).json()
    assert (body["owner_kind"], body["owner_id"]) == ("slurm.job", str(fed.scene.job))
    assert body["labels"]["slurm_job_account"] == "physics" and body["hosts"] == [fed.scene.node]
    assert "hw_id" not in body["labels"] and body["labels"]["gputally_usage_owner_kind"] == "slurm.job"
    (gpu,) = body["gpus"]
    assert (gpu["hw_id"], gpu["index"], gpu["model"], gpu["host"]) == (GPU, "0", "NVIDIA H200", fed.scene.node)
    assert gpu["peak_memory_bytes"] == want["peak"]
    assert gpu["memory_limit_bytes"] == readings(fed.scene.requests)[0].memory_limit
    assert gpu["utilization"] is None and gpu["allocated_gpu_hours"] == 0 == body["total"]["energy_kwh"]
    assert body["first_seen"] <= body["last_seen"] and body["start"] <= body["first_seen"]


def test_pod_views_and_their_notes(fed: Fed) -> None:
    ns = fed.scene.namespace
    want = fed.scene.expected()
    limit = readings(fed.scene.requests)[0].memory_limit
    command = ["pod", f"{ns}/trainer-0", "--prometheus", fed.url, "--since", "1h"]
    trainer = report(*command)
    assert trainer.code == 0, trainer.err
    print(f"$ gputally report {' '.join(command)}\n{trainer.out}")
    lines = trainer.out.splitlines()
    assert lines[2] == f"Pod {ns}/trainer-0 (StatefulSet trainer)" and lines[3].startswith("  uid ")
    counters = want[fed.scene.trainer]
    assert lines[lines.index("notes:") + 1:] == [
        f"  - peak memory {counters['peak'] / GIB:.0f} GiB of {limit / GIB:.0f} GiB: a smaller MIG profile would do"]
    gpu_line = next(line for line in lines if line.startswith("0 "))
    assert f"{counters['busy'] / counters['allocated'] * 100:.0f}%" in gpu_line.split()

    notebook = f"{ns}/jupyter-bob-0"
    counters = want[fed.scene.notebook]
    mean = counters["busy"] / counters["allocated"]
    body = report("pod", notebook, *fed.args("--format", "json")).json()
    assert math.isclose(body["gpus"][0]["utilization"], mean, rel_tol=1e-9)
    assert math.isclose(body["total"]["cost"][CURRENCY], fed.expected_cost(counters), rel_tol=1e-9)
    assert body["notes"] == [f"mean utilization {mean * 100:.0f} % on 1 GPU",
                             f"peak memory {counters['peak'] / GIB:.1f} GiB of {limit / GIB:.0f} GiB: "
                             "a smaller MIG profile would do"]
    # The thresholds are flags: the notebook's 6 % is "unused" below 10 %, low only below 15 %.
    body = report("pod", notebook, *fed.args("--format", "json", "--unused-below", "0.1", "--low-utilization",
                                             "0.05", "--low-memory", "0.01")).json()
    assert body["notes"] == ["did not use 1 of 1 allocated GPU"]
