"""The cgroup parser: a table of real shapes, properties over generated paths, and a fuzz pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputally.cgroup.parse import CgroupInfo, parse_cgroup

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "nvml"
UID = "6ee8558e-a273-417d-9a57-57f3c7773bd4"
UID_ = UID.replace("-", "_")
CID = "2cbbbe2a9f38fa2255006fd6faed661a55f92bf6f924aae08261634ab5ff0f67"

K8S = "kubernetes"
TABLE: list[tuple[str, str, dict[str, object]]] = [
    ("v2 systemd containerd burstable (H200 fixture)",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     {"kind": K8S, "runtime": "containerd", "container_id": CID, "pod_uid": UID, "qos_class": "burstable"}),
    ("v2 systemd guaranteed", f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
     {"kind": K8S, "runtime": "containerd", "container_id": CID, "pod_uid": UID, "qos_class": "guaranteed"}),
    ("v2 systemd besteffort crio",
     f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{CID}.scope",
     {"kind": K8S, "runtime": "crio", "container_id": CID, "pod_uid": UID, "qos_class": "besteffort"}),
    ("crio conmon is the pod, not a container",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{CID}.scope",
     {"kind": K8S, "runtime": "crio", "container_id": None, "pod_uid": UID}),
    ("cri-dockerd systemd",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope",
     {"kind": K8S, "runtime": "docker", "container_id": CID, "pod_uid": UID}),
    ("v1 cgroupfs burstable, many controllers",
     f"12:pids:/kubepods/burstable/pod{UID}/{CID}\n11:memory:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n0::/\n",
     {"kind": K8S, "runtime": None, "container_id": CID, "pod_uid": UID, "qos_class": "burstable"}),
    ("v1 cgroupfs guaranteed", f"4:cpu,cpuacct:/kubepods/pod{UID}/{CID}",
     {"kind": K8S, "container_id": CID, "pod_uid": UID, "qos_class": "guaranteed"}),
    ("pod cgroup without container (sandbox level)", f"0::/kubepods/besteffort/pod{UID}",
     {"kind": K8S, "container_id": None, "pod_uid": UID, "qos_class": "besteffort"}),
    ("kind: nested kubelet slice",
     f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
     {"kind": K8S, "runtime": "containerd", "container_id": CID, "pod_uid": UID, "qos_class": "burstable"}),
    ("kind: cgroupfs inside a docker node",
     f"0::/docker/{'f' * 64}/kubelet/kubepods/burstable/pod{UID}/{CID}",
     {"kind": K8S, "container_id": CID, "pod_uid": UID, "qos_class": "burstable"}),
    ("plain docker container, systemd", f"0::/system.slice/docker-{CID}.scope",
     {"kind": "container", "runtime": "docker", "container_id": CID, "pod_uid": None}),
    ("plain docker container, cgroupfs v1", f"9:memory:/docker/{CID}",
     {"kind": "container", "runtime": "docker", "container_id": CID, "pod_uid": None}),
    ("system service", "0::/system.slice/nvidia-persistenced.service", {"kind": "system", "pod_uid": None}),
    ("user session", "0::/user.slice/user-1000.slice/session-3.scope", {"kind": "user", "pod_uid": None}),
    ("root", "0::/", {"kind": "unknown"}),
    ("slurm v2 step 0 (H200 fixture)", "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n",
     {"kind": "slurm", "slurm_job_id": 4242, "slurm_step": "0", "slurm_task": 0, "slurm_uid": None}),
    ("slurm v2 batch", "0::/system.slice/slurmstepd.scope/job_17/step_batch/user/task_0",
     {"kind": "slurm", "slurm_job_id": 17, "slurm_step": "batch"}),
    ("slurm v2 extern", "0::/system.slice/slurmstepd.scope/job_17/step_extern/user/task_special",
     {"kind": "slurm", "slurm_job_id": 17, "slurm_step": "extern", "slurm_task": None}),
    ("slurm v2 interactive", "0::/system.slice/slurmstepd.scope/job_9/step_interactive/user",
     {"kind": "slurm", "slurm_step": "interactive"}),
    ("slurm v1 with node name, freezer and cpuset lines",
     "10:freezer:/slurm_node1/uid_1000/job_55/step_batch\n5:cpuset:/slurm_node1/uid_1000/job_55/step_batch\n2:memory:/user.slice\n",
     {"kind": "slurm", "slurm_job_id": 55, "slurm_step": "batch", "slurm_uid": 1000}),
    ("slurm v1 plain root with task", "7:devices:/slurm/uid_0/job_4242/step_3/task_1",
     {"kind": "slurm", "slurm_job_id": 4242, "slurm_step": "3", "slurm_task": 1, "slurm_uid": 0}),
    ("job_ outside slurm is not slurm", "0::/system.slice/job_12.service", {"kind": "system"}),
    ("empty", "", {"kind": "unknown"}),
]


@pytest.mark.parametrize(("text", "expected"), [(t, e) for _, t, e in TABLE], ids=[n for n, _, _ in TABLE])
def test_real_shapes(text: str, expected: dict[str, object]) -> None:
    info = parse_cgroup(text)
    for key, value in expected.items():
        assert getattr(info, key) == value, key


def test_every_fixture_process_is_recognised() -> None:
    seen = {}
    for name in ("h200-two-workloads.json", "h200-three-workloads-timeseries.json"):
        for pid, facts in json.loads((FIXTURES / name).read_text())["snapshots"][0]["proc_facts"].items():
            seen[pid] = parse_cgroup(facts["cgroup"])
    assert seen["628"].slurm_job_id == 4242 and seen["450"].slurm_job_id == 90210
    assert seen["629"].pod_uid == UID
    assert (seen["448"].qos_class, seen["448"].runtime) == ("guaranteed", "containerd")
    assert (seen["449"].qos_class, seen["449"].runtime) == ("burstable", "crio")


uids = st.uuids().map(str)
container_ids = st.binary(min_size=32, max_size=32).map(bytes.hex)
qos_classes = st.sampled_from(["guaranteed", "burstable", "besteffort"])


@st.composite
def kubernetes_lines(draw: st.DrawFn) -> tuple[str, str, str, str]:
    uid, cid, qos = draw(uids), draw(container_ids), draw(qos_classes)
    driver = draw(st.sampled_from(["systemd", "cgroupfs", "kind"]))
    level = "" if qos == "guaranteed" else f"-{qos}"
    if driver == "cgroupfs":
        path = f"/kubepods{'' if qos == 'guaranteed' else '/' + qos}/pod{uid}/{cid}"
    else:
        prefix = "kubelet-" if driver == "kind" else ""
        scope = draw(st.sampled_from(["cri-containerd", "crio", "docker"]))
        path = (f"{'/kubelet.slice' if prefix else ''}/{prefix}kubepods.slice"
                f"{'' if qos == 'guaranteed' else f'/{prefix}kubepods{level}.slice'}"
                f"/{prefix}kubepods{level}-pod{uid.replace('-', '_')}.slice/{scope}-{cid}.scope")
    hierarchy = draw(st.sampled_from(["0::", "11:memory:", "1:name=systemd:", "4:cpu,cpuacct:"]))
    return f"{hierarchy}{path}\n", uid, cid, qos


@given(kubernetes_lines())
def test_generated_kubernetes_paths_round_trip(case: tuple[str, str, str, str]) -> None:
    line, uid, cid, qos = case
    info = parse_cgroup(line)
    assert (info.kind, info.pod_uid, info.container_id, info.qos_class) == ("kubernetes", uid, cid, qos)


@given(st.integers(1, 2**31), st.sampled_from(["0", "12", "batch", "extern", "interactive"]), st.integers(0, 65535))
def test_generated_slurm_paths_round_trip(job: int, step: str, uid: int) -> None:
    v1 = parse_cgroup(f"5:freezer:/slurm/uid_{uid}/job_{job}/step_{step}/task_0\n")
    v2 = parse_cgroup(f"0::/system.slice/slurmstepd.scope/job_{job}/step_{step}/user/task_0\n")
    assert (v1.slurm_job_id, v1.slurm_step, v1.slurm_uid) == (job, step, uid)
    assert (v2.slurm_job_id, v2.slurm_step, v2.slurm_uid) == (job, step, None)


@settings(max_examples=500)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=400))
def test_fuzz_any_text_gives_an_answer(text: str) -> None:
    info = parse_cgroup(text)
    assert isinstance(info, CgroupInfo)
    assert info.pod_uid is None or len(info.pod_uid) == 36
    assert info.container_id is None or len(info.container_id) == 64


@settings(max_examples=300)
@given(st.lists(st.sampled_from(["kubepods.slice", "kubepods", f"pod{UID}", f"kubepods-pod{UID_}.slice", CID,
                                 f"crio-{CID}.scope", "slurm", "job_1", "step_0", "uid_1", "docker", "..", ""]),
                max_size=8))
def test_fuzz_shuffled_components(components: list[str]) -> None:
    info = parse_cgroup("0::/" + "/".join(components))
    if info.kind == "kubernetes":
        assert info.pod_uid == UID


def test_explain_cgroup_prints_every_key() -> None:
    text = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope"
    gputally = str(Path(sys.executable).parent / "gputally")
    result = subprocess.run([gputally, "explain-cgroup", text], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == {
        "runtime": "containerd", "container_id": CID, "pod_uid": UID, "qos_class": "burstable",
        "slurm_job_id": None, "slurm_step": None, "slurm_uid": None,
    }
    slurm = subprocess.run([gputally, "explain-cgroup", "-"], input="7:devices:/slurm/uid_0/job_4242/step_batch\n",
                           capture_output=True, text=True, check=True)
    assert json.loads(slurm.stdout)["slurm_step"] == "batch"


HUGE = "9" * 5000


@pytest.mark.parametrize(("text", "expected"), [
    (f"0::/slurm/uid_{HUGE}/job_7/step_0", {"kind": "slurm", "slurm_job_id": 7, "slurm_uid": None}),
    (f"0::/slurm/uid_1000/job_{HUGE}/step_0", {"kind": "unknown", "slurm_job_id": None, "slurm_uid": None}),
    ("0::/slurm/uid_1000/job_4294967296/step_0", {"kind": "unknown", "slurm_job_id": None}),
    ("0::/slurm/uid_4294967295/job_4294967295/step_4294967295/task_4294967296",
     {"kind": "slurm", "slurm_job_id": 4294967295, "slurm_uid": 4294967295, "slurm_step": "4294967295",
      "slurm_task": None}),
    (f"0::/slurm/uid_1/job_2/step_{HUGE}/task_{HUGE}", {"kind": "slurm", "slurm_step": None, "slurm_task": None}),
])
def test_huge_numeric_ids_are_no_match(text: str, expected: dict[str, object]) -> None:
    info = parse_cgroup(text)
    assert {key: getattr(info, key) for key in expected} == expected


def test_explain_cgroup_with_a_5000_digit_job_id_prints_no_match() -> None:
    gputally = str(Path(sys.executable).parent / "gputally")
    result = subprocess.run([gputally, "explain-cgroup", "-"], input=f"7:devices:/slurm/uid_0/job_{HUGE}/step_0\n",
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["slurm_job_id"] is None
