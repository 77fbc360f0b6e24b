"""Attribution hints read from a fake host proc root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gputally.probes.core.hints import ProcFs, process_attributes
from gputally.probes.core.procfacts import ProcFacts

BTIME = 1_795_970_000
CGROUP = "0::/kubepods.slice/kubepods-pod3a5b7c9d_1e2f.slice/cri-containerd-abab.scope\n"


def fake_process(root: Path, pid: int, *, comm: str = "python3", start_ticks: int = 304578, uid: int = 1000,
                 exe: str | None = "/opt/venv/bin/python3.11") -> Path:
    base = root / str(pid)
    base.mkdir(parents=True)
    (base / "cgroup").write_text(CGROUP)
    fields = ["S", "1", str(pid), "0", "-1", "4194304"] + ["0"] * 13 + [str(start_ticks), "3133440"]
    (base / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (base / "status").write_text(f"Name:\t{comm}\nPPid:\t1\nUid:\t{uid + 1}\t{uid}\t{uid}\t{uid}\nGid:\t0\t0\t0\t0\n")
    if exe is not None:
        os.symlink(exe, base / "exe")
    return base


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host root: ``proc/`` with a boot time, ``etc/passwd`` beside it."""
    proc = tmp_path / "host" / "proc"
    proc.mkdir(parents=True)
    (proc / "stat").write_text(f"cpu  1 2 3 4\nbtime {BTIME}\nprocesses 9\n")
    (tmp_path / "host" / "etc").mkdir()
    passwd = "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n"
    (tmp_path / "host" / "etc" / "passwd").write_text(passwd)
    return proc


def test_facts_of_a_gpu_process(host: Path) -> None:
    fake_process(host, 448)
    facts = ProcFs(host).facts(448)
    assert facts is not None
    assert facts.cgroup == CGROUP
    assert facts.comm == "python3" and facts.exe == "/opt/venv/bin/python3.11"
    assert facts.uid == 1000 and facts.owner == "alice"  # effective uid, name from the host's passwd
    assert facts.start_time == pytest.approx(BTIME + 304578 / os.sysconf("SC_CLK_TCK"))


def test_comm_with_spaces_and_parentheses(host: Path) -> None:
    fake_process(host, 7, comm="my (odd) name", start_ticks=100)
    facts = ProcFs(host).facts(7)
    assert facts is not None and facts.comm == "my (odd) name"
    assert facts.start_time == pytest.approx(BTIME + 100 / os.sysconf("SC_CLK_TCK"))


def test_vanished_pid_has_no_hints(host: Path) -> None:
    assert ProcFs(host).facts(999) is None


def test_pid_vanishing_mid_read_has_no_hints(host: Path) -> None:
    base = fake_process(host, 12)
    (base / "stat").unlink()  # exited between reading cgroup and stat
    assert ProcFs(host).facts(12) is None


def test_unreadable_exe_falls_back_to_comm(host: Path) -> None:
    fake_process(host, 13, exe=None, uid=4242)
    facts = ProcFs(host).facts(13)
    assert facts is not None and facts.exe is None
    attributes = process_attributes(13, facts)
    assert attributes["process.executable.name"] == "python3"
    assert attributes["process.owner"] == "4242"  # not in passwd: the number


def test_passwd_changes_are_picked_up(host: Path) -> None:
    fake_process(host, 14, uid=2000)
    procfs = ProcFs(host)
    assert procfs.facts(14).owner == "2000"  # type: ignore[union-attr]
    passwd = host.parent / "etc" / "passwd"
    passwd.write_text(passwd.read_text() + "bob:x:2000:2000::/home/bob:/bin/sh\n")
    os.utime(passwd, (1, 1))
    assert procfs.facts(14).owner == "bob"  # type: ignore[union-attr]


def test_attributes_follow_the_semantic_conventions() -> None:
    facts = ProcFacts(pid=448, cgroup=CGROUP, comm="python3", exe="/usr/bin/python3.11",
                      uid=0, owner="root", start_time=1795970000.25)
    assert process_attributes(448, facts) == {
        "process.pid": 448,
        "process.linux.cgroup": CGROUP.rstrip("\n"),
        "process.executable.name": "python3.11",
        "process.owner": "root",
        "process.user.id": 0,
        "process.creation.time": "2026-11-29T16:33:20.250Z",
    }
    assert process_attributes(5, None) == {"process.pid": 5}


def test_default_passwd_sits_beside_a_host_proc_mount(tmp_path: Path) -> None:
    assert ProcFs(Path("/proc"))._passwd == Path("/etc/passwd")
    assert ProcFs(tmp_path / "host" / "proc")._passwd == tmp_path / "host" / "etc" / "passwd"


def test_this_process_reads_through_the_real_proc() -> None:
    facts = ProcFs().facts(os.getpid())
    assert facts is not None and facts.cgroup is not None and facts.start_time is not None
