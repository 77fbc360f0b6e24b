"""Pure parsing: hostlists, GRES details, gres.conf, scontrol and JSON output, /proc files."""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from gputally.processors.slurm.backends.cli import parse_scontrol_jobs
from gputally.processors.slurm.backends.json_jobs import job_from_json, jobs_from_json, running
from gputally.processors.slurm.environ import read_slurm_environ
from gputally.processors.slurm.gres import (
    GpuMap,
    GresConf,
    device_minor,
    normalize_bus_id,
    nvidia_minors,
    parse_gres_indexes,
    parse_index_list,
)
from gputally.processors.slurm.hostlist import expand_hostlist
from gputally.processors.slurm.local import Found, LocalProcesses
from gputally.processors.slurm.model import JobInfo

TESTDATA = Path(__file__).parent / "testdata"
H200 = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "nvml" / "h200-two-workloads.json"


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("vm", ["vm"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a[1-2]-ib,b3", ["a1-ib", "a2-ib", "b3"]),
        ("rack[1-2]-n[8-9]", ["rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"]),
        ("nvidia[0-1],nvidia3", ["nvidia0", "nvidia1", "nvidia3"]),
        ("n[9-10]", ["n9", "n10"]),
    ],
)
def test_hostlist(expression: str, names: list[str]) -> None:
    assert expand_hostlist(expression) == names


@pytest.mark.parametrize("bad", ["gpu[1-", "gpu1]", "gpu[a-b]", "gpu[3-1]", "n[0-99999999]"])
def test_bad_hostlist(bad: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(bad)


@pytest.mark.parametrize(
    ("detail", "indexes"),
    [
        ("gpu:2(IDX:0-1)", (0, 1)),
        ("gpu:h200:1(IDX:1)", (1,)),
        ("gpu:a100:3(IDX:0,2-3)", (0, 2, 3)),
        ("gpu:a100:1(IDX:0),gpu:v100:2(IDX:2-3)", (0, 2, 3)),
        ("gpu(IDX:5)", (5,)),
        ("gpu:1(IDX:N/A)", ()),
        ("mps:50(50/100,0/100),gpu:1(IDX:1)", (1,)),
        ("shard:gpu:2(2/4)", ()),
        ("", ()),
    ],
)
def test_gres_indexes(detail: str, indexes: tuple[int, ...]) -> None:
    assert parse_gres_indexes(detail) == indexes


def test_index_list() -> None:
    assert parse_index_list("0-2,5") == (0, 1, 2, 5)
    assert parse_index_list("N/A") == ()


def test_bus_ids_of_nvml_and_the_driver_agree() -> None:
    assert normalize_bus_id("00000000:0F:00.0") == normalize_bus_id("0000:0f:00.0") == "0000:0f:00.0"


def test_device_minor_comes_from_the_file_before_its_name(tmp_path: Path) -> None:
    lying = tmp_path / "nvidia7"
    os.mknod(lying, 0o600 | stat.S_IFCHR, os.makedev(195, 2))
    assert device_minor(str(lying)) == 2
    assert device_minor(str(tmp_path / "nvidia4")) == 4  # not here: the name's number
    assert device_minor("/dev/nvidiactl-gone") is None


def test_nvidia_driver_minors(tmp_path: Path) -> None:
    for bus, minor in {"0000:0f:00.0": 5, "0000:1a:00.0": 3}.items():
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(f"Model: H200\nDevice Minor: \t {minor}\nBus Location: {bus}\n")
    (tmp_path / "0000:99:00.0").mkdir()  # no information file
    assert nvidia_minors(tmp_path) == {"0000:0f:00.0": 5, "0000:1a:00.0": 3}
    assert nvidia_minors(tmp_path / "absent") == {}


GRES_CONF = """
# cluster-wide gres.conf
AutoDetect=off
NodeName=gpu[01-02] Name=gpu Type=a100 File=/dev/nvidia[2-3]
NodeName=gpu[01-02] Name=gpu Type=a100 File=/dev/nvidia0,/dev/nvidia1   # after 2 and 3
NodeName=gpu03 AutoDetect=nvml Name=gpu File=/dev/nvidia[0-1]
NodeName=gpu04 Name=gpu Type=h200 \\
    File=/dev/nvidia1
NodeName=gpu[01-04] Name=mps Count=200
"""


def test_gres_conf_orders_devices_as_written() -> None:
    conf = GresConf.parse(GRES_CONF)
    assert conf.layout("gpu01") == conf.layout("gpu02") == (2, 3, 0, 1)
    assert conf.layout("gpu03") is None  # AutoDetect: NVML order
    assert conf.layout("gpu04") == (1,)
    assert conf.layout("elsewhere") is None


def test_gres_conf_without_node_names_is_a_nodes_own() -> None:
    conf = GresConf.parse("Name=gpu File=/dev/nvidia[1-0]\n")  # bad range: skipped, not fatal
    assert conf.layout("any") is None
    conf = GresConf.parse("Name=gpu File=/dev/nvidia3\nName=gpu File=/dev/nvidia1\n")
    assert conf.layout("any") == (3, 1)
    assert GresConf.parse("AutoDetect=nvml\nName=gpu File=/dev/nvidia[0-1]\n").layout("any") is None


def test_gpu_map_order_of_trust() -> None:
    conf = GresConf.parse("NodeName=n1 Name=gpu File=/dev/nvidia5,/dev/nvidia3\n")
    gpus = GpuMap(gres_conf=conf, driver_minors={"0000:1a:00.0": 3}, local_node="n1")
    # device minor from the probe's hw.name wins over the NVML index
    assert gpus.index("n1", uuid="A", nvml_index=0, bus_id=None, minor=3) == 1
    # the driver's minor by bus id, on the local node only
    assert gpus.index("n1", uuid="A", nvml_index=0, bus_id="00000000:1A:00.0") == 1
    # otherwise minor == NVML index is assumed: 5 is GRES index 0, 0 is in no index
    assert gpus.index("n1", uuid="A", nvml_index=5, bus_id=None) == 0
    assert gpus.index("n1", uuid="A", nvml_index=0, bus_id=None) is None
    # a node gres.conf does not name: GRES index == NVML index
    assert gpus.index("n2", uuid="A", nvml_index=1, bus_id="00000000:1A:00.0") == 1
    # learned from a job's process beats everything
    gpus.learn("n1", "A", 0)
    assert gpus.index("n1", uuid="A", nvml_index=0, bus_id="00000000:1A:00.0", minor=3) == 0
    gpus.learn("n1", "B", 0)  # index 0 is B now: A is forgotten
    assert gpus.index("n1", uuid="A", nvml_index=0, bus_id=None) is None
    assert GpuMap(minors=[3, 5]).index("any", uuid=None, nvml_index=5, bus_id=None) == 1
    never = GpuMap(learn=False)
    never.learn("n1", "A", 3)
    assert never.index("n1", uuid="A", nvml_index=0, bus_id=None) == 0


def test_scontrol_output_of_a_real_cluster() -> None:
    jobs = {job.job_id: job for job in parse_scontrol_jobs((TESTDATA / "scontrol_show_job.txt").read_text())}
    assert sorted(jobs) == [1, 2, 3, 4, 5]
    assert jobs[2] == JobInfo(
        job_id=2, name="j.sh", user="root", uid=0, account="physics", partition="gpu", qos="normal",
        nodes="vm", state="RUNNING", gpus=(("vm", (1,)),),
    )
    assert (jobs[5].array_job_id, jobs[5].array_task_id) == (3, 0)
    assert (jobs[3].array_job_id, jobs[3].array_task_id) == (3, 1)
    assert (jobs[4].user, jobs[4].uid, jobs[4].account, jobs[4].gpus) == ("nobody", 65534, "chemistry", ())
    assert jobs[1].array_job_id is None and jobs[1].array_task_id is None


def test_scontrol_multi_node_detail_and_odd_names() -> None:
    line = (
        "JobId=77 JobName=train big model UserId=alice(1001) GroupId=alice(1001) Account=(null) QOS=normal "
        "JobState=RUNNING Partition=a100 NodeList=gpu[01-03] NumNodes=3 JOB_GRES=gpu:a100:5 "
        "Nodes=gpu[01-02] CPU_IDs=0-3 Mem=1024 GRES=gpu:a100:2(IDX:0-1) "
        "Nodes=gpu03 CPU_IDs=0 Mem=512 GRES=gpu:a100:1(IDX:3) MinCPUsNode=1 Command=/home/alice/run.sh"
    )
    [job] = parse_scontrol_jobs(line + "\n")
    assert job.name == "train big model" and job.user == "alice" and job.uid == 1001
    assert job.account is None
    assert job.gpus == (("gpu01", (0, 1)), ("gpu02", (0, 1)), ("gpu03", (3,)))
    assert job.gpu_indexes("gpu03") == (3,) and job.gpu_indexes("gpu09") == ()
    assert job.node_names() == ["gpu01", "gpu02", "gpu03"]


def test_squeue_json_of_a_real_cluster_matches_scontrol() -> None:
    from_json = {job.job_id: job for job in running(jobs_from_json(json.loads((TESTDATA / "squeue.json").read_text())))}
    from_text = {job.job_id: job for job in parse_scontrol_jobs((TESTDATA / "scontrol_show_job.txt").read_text())}
    assert sorted(from_json) == sorted(from_text)
    for job_id, job in from_json.items():
        assert job.cluster == "gputally-test"
        assert job == replace(from_text[job_id], cluster="gputally-test")


def test_slurmrestd_job_document() -> None:
    document = json.loads((TESTDATA / "slurmrestd_job.json").read_text())
    [job] = jobs_from_json(document)
    assert (job.job_id, job.array_job_id, job.array_task_id) == (5, 3, 0)
    assert (job.account, job.partition, job.cluster) == ("chemistry", "debug", "gputally-test")


def test_newer_openapi_shapes_are_read_too() -> None:
    job = job_from_json({
        "job_id": 9, "array_job_id": {"set": True, "number": 0}, "array_task_id": {"set": False, "number": 0},
        "user_id": 1001, "user_name": "alice", "job_state": ["RUNNING", "COMPLETING"], "nodes": "n[1-2]",
        "gres_detail": ["gpu:1(IDX:2)", "gpu:1(IDX:0)"],
        "job_resources": {"nodes": {"allocation": [{"name": "n2"}, {"name": "n1"}]}},
    })
    assert job is not None
    assert job.gpus == (("n2", (2,)), ("n1", (0,)))
    assert job.array_job_id is None and job.uid == 1001
    assert running([job]) == [job]
    assert running([JobInfo(job_id=1, state="PENDING"), JobInfo(job_id=2)]) == []
    with pytest.raises(ValueError):
        jobs_from_json({"errors": []})


def test_environ_keeps_only_slurm_ids(tmp_path: Path) -> None:
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "environ").write_bytes(b"HOME=/root\0SLURM_JOB_ID=4242\0SECRET=x\0SLURM_STEP_ID=0\0")
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "environ").write_bytes(b"SLURM_JOB_ID=7\0SLURM_STEP_ID=4294967291\0")
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "environ").write_bytes(b"HOME=/root\0")
    assert read_slurm_environ(tmp_path, 10) == (4242, "0")
    assert read_slurm_environ(tmp_path, 11) == (7, "batch")
    assert read_slurm_environ(tmp_path, 12) is None
    assert read_slurm_environ(tmp_path, 13) is None  # gone


def test_environ_permission_denied_is_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "environ").write_bytes(b"SLURM_JOB_ID=1\0")

    def denied(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    with caplog.at_level(logging.DEBUG):
        assert read_slurm_environ(tmp_path, 10) is None
    assert caplog.records == []


def test_local_lookup_of_the_h200_slurm_process(tmp_path: Path) -> None:
    """The real cgroup v2 shape (job 4242, step 0) from the H200 recording, then the
    environment fallback for the same process with a non-Slurm cgroup."""
    facts = json.loads(H200.read_text())["snapshots"][0]["proc_facts"]["628"]
    proc = tmp_path / "628"
    proc.mkdir()
    (proc / "cgroup").write_text(facts["cgroup"])
    env = facts["env_selected"]
    environ = f"SLURM_JOB_ID={env['SLURM_JOB_ID']}\0SLURM_STEP_ID={env['SLURM_STEP_ID']}\0"
    (proc / "environ").write_bytes(environ.encode())
    local = LocalProcesses(tmp_path, ttl=60, max_entries=10)
    assert local.read(628) == Found(4242, "0", None, "cgroup")
    (proc / "cgroup").write_text("0::/user.slice/user-0.slice/session-1.scope\n")
    assert local.read(628) == Found(4242, "0", None, "environ")
    assert local.read(629) is None
