"""``--compare-sacct``'s reading of sacct output and its verdict, without a cluster (the real
cluster's output is compared in test_slurm.py): both formats, steps and array tasks, typed
GRES, what counts as a mismatch, and the errors for output it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputally.report import sacct
from gputally.report.errors import UsageError
from gputally.report.queries import Account
from tests.report.support import report

PARSABLE = """JobIDRaw|JobID|ElapsedRaw|AllocTRES|State
41|41|600|billing=8,cpu=8,gres/gpu:h200=4,gres/gpu=4,mem=64G,node=1|COMPLETED
41.batch|41.batch|600|cpu=8,gres/gpu:h200=4,gres/gpu=4,mem=64G,node=1|COMPLETED
43|42_1|90|billing=1,cpu=1,gres/gpu:h200=1,mem=1G,node=1|COMPLETED
44|44|30|billing=1,cpu=1,mem=1G,node=1|COMPLETED
"""
JSON = {"meta": {"Slurm": {"version": {"major": 22, "minor": 5}}}, "errors": [], "jobs": [
    {"job_id": 41, "name": "train", "time": {"elapsed": 600, "start": 1, "end": 601},
     "tres": {"allocated": [{"type": "cpu", "name": None, "id": 1, "count": 8},
                            {"type": "gres", "name": "gpu", "id": 1001, "count": 4},
                            {"type": "gres", "name": "gpu:h200", "id": 1002, "count": 4}], "requested": []}},
    {"job_id": 43, "name": "sweep", "time": {"elapsed": 90},
     "tres": {"allocated": [{"type": "gres", "name": "gpu:h200", "id": 1002, "count": 1}]}},
]}


def account(job: str, seconds: float, gpu: str = "GPU-1") -> Account:
    return Account("gw-0", "slurm.job", job, gpu, {}, allocated=seconds)


def test_both_formats_give_the_same_jobs() -> None:
    parsable = sacct.parse(PARSABLE, "books.txt")
    assert parsable == [sacct.Job("41", 4, 600), sacct.Job("43", 1, 90), sacct.Job("44", 0, 30)]
    assert sacct.parse(json.dumps(JSON), "books.json") == parsable[:2]
    elapsed = "JobID|Elapsed|AllocTRES\n7|1-02:03:04|gres/gpu=2\n8|05:06|gres/gpu=1\n"
    assert sacct.parse(elapsed, "-") == [sacct.Job("7", 2, 93784), sacct.Job("8", 1, 306)]


def test_a_job_past_the_tolerance_or_missing_is_a_mismatch() -> None:
    jobs = sacct.parse(PARSABLE, "books.txt")
    ours = [account("41", 1200), account("41", 1201, "GPU-2"), account("41", 1190, "GPU-3"), account("41", 808, "GPU-4"),
            account("99", 50)]
    agreed = sacct.compare(jobs[:1], ours, tolerance=1.0)
    assert [(line.job_id, line.sacct, line.gputally) for line in agreed.lines] == [("41", 2400, 4399), ("99", None, 50)]
    assert not agreed.ok  # 4399 GPU-s against 2400: one GPU's counter is not the job's time
    close = sacct.compare(jobs[:1], [account("41", 2405), account("99", 50)], tolerance=1.0)
    assert close.ok and close.lines[0].allowed == 8  # 2 boundaries x 1 s x 4 GPUs; job 99 only listed
    text = sacct.render(close)
    assert "not in sacct" in text and text.rstrip().endswith("1 jobs agree with sacct within 1 s per GPU and job "
                                                             "boundary")
    missing = sacct.compare(jobs, [account("41", 2400)], tolerance=1.0)
    assert [(line.job_id, line.ok) for line in missing.lines] == [("41", True), ("43", False)]  # 43 has no counters
    assert "MISMATCH" in sacct.render(missing)


@pytest.mark.parametrize(("text", "says"), [
    ("41|600|gres/gpu=4\n", "expected a header with JobIDRaw"),
    ("JobIDRaw|ElapsedRaw|AllocTRES\n41|six hundred|gres/gpu=4\n", "line 2: cannot read"),
    ("JobIDRaw|ElapsedRaw|AllocTRES\n41|600\n", "line 2 has 2 fields, the header 3"),
    ('{"jobs": [{"name": "x"}]}', "jobs[0] lacks job_id or time.elapsed"),
    ('{"jobs": 3}', 'JSON without a "jobs" list'),
    ("{not json", "not valid JSON"),
])
def test_output_it_cannot_read_is_named(text: str, says: str) -> None:
    with pytest.raises(UsageError, match=r"--compare-sacct books: .*" + says.replace("[", r"\[").replace("]", r"\]")):
        sacct.parse(text, "books")


def test_the_command_reports_a_file_it_cannot_read_before_asking_prometheus(tmp_path: Path) -> None:
    result = report("--prometheus", "http://127.0.0.1:9", "--compare-sacct", str(tmp_path / "nope.json"))
    assert result.code == 2 and result.err == f"gputally: cannot read --compare-sacct {tmp_path / 'nope.json'}: " \
                                              "No such file or directory\n"
    books = tmp_path / "books.txt"
    books.write_text("41|600|gres/gpu=4\n")
    result = report("--prometheus", "http://127.0.0.1:9", "--compare-sacct", str(books))
    assert result.code == 2 and "expected a header" in result.err and result.out == ""
