"""The systemd units of collector-config/systemd/ (bare-metal and Slurm GPU nodes).

Each unit is parsed here (a small parser that keeps repeated keys, as systemd does), its
keys are checked against what the README promises, every Exec line is parsed by gputally's
own argument parser, and ``systemd-analyze verify`` must report nothing about the units.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gputally.pipeline.config import load_config

from .cli_argv import ArgvError, parse_gputally_argv

ROOT = Path(__file__).resolve().parents[2]
UNIT_DIR = ROOT / "collector-config" / "systemd"
UNITS = sorted(p.name for p in UNIT_DIR.glob("*.service"))
PROBE, LOCAL = "gputally-probe.service", "gputally.service"
EXEC_KEYS = ("ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload", "ExecStop", "ExecStopPost")

Unit = dict[str, list[tuple[str, str]]]


def parse_unit(text: str) -> Unit:
    """Sections -> (key, value) in file order. Comments (# and ;) and blank lines are
    skipped, a trailing backslash continues a line; repeated keys are all kept."""
    sections: Unit = {}
    current: list[tuple[str, str]] | None = None
    logical: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            logical.append(line[:-1])
            continue
        line = " ".join([*logical, line]).strip()
        logical = []
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"key outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line!r}"
        current.append((key.strip(), value.strip()))
    return sections


def load(name: str) -> Unit:
    return parse_unit((UNIT_DIR / name).read_text())


def values(unit: Unit, section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def value(unit: Unit, section: str, key: str) -> str | None:
    """The effective value of a single-valued key: the last assignment wins."""
    found = values(unit, section, key)
    return found[-1] if found else None


def words(unit: Unit, section: str, key: str) -> list[str]:
    """A list-valued key (After=, Wants=...): every assignment's words; an empty one resets."""
    out: list[str] = []
    for v in values(unit, section, key):
        out = [*out, *v.split()] if v else []
    return out


def exec_argv(line: str) -> list[str]:
    """An Exec line's words, without systemd's prefixes (@ - : + !). Our units use no
    specifiers or variables, which systemd would expand and shlex would not."""
    assert "%" not in line and "$" not in line, f"unexpected specifier or variable: {line}"
    return shlex.split(line.lstrip("@-:+!"))


def gputally_args(line: str) -> object:
    argv = exec_argv(line)
    assert argv[0].startswith("/") and Path(argv[0]).name == "gputally", argv[0]
    return parse_gputally_argv(argv[1:])


def test_the_expected_units_are_there() -> None:
    assert {PROBE, LOCAL} <= set(UNITS)


@pytest.mark.parametrize("name", UNITS)
def test_unit_has_the_sections_and_keys_of_a_service(name: str) -> None:
    unit = load(name)
    assert set(unit) == {"Unit", "Service", "Install"}
    assert value(unit, "Unit", "Description")
    assert values(unit, "Service", "ExecStart"), "no ExecStart"
    assert value(unit, "Service", "Type") == "exec"
    assert value(unit, "Service", "Restart") == "on-failure"
    assert words(unit, "Install", "WantedBy") == ["multi-user.target"]
    # Hardening both units share (README.md, "Hardening").
    for key, expected in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
        "AmbientCapabilities": "",
        "DevicePolicy": "closed",
    }.items():
        assert value(unit, "Service", key) == expected, f"{name}: {key}={value(unit, 'Service', key)!r}"
    # Both read other users' /proc/<pid>/cgroup: /proc must stay whole.
    assert value(unit, "Service", "ProtectProc") in (None, "default")
    assert value(unit, "Service", "ProcSubset") in (None, "all")
    assert value(unit, "Service", "PrivateUsers") in (None, "no")
    assert value(unit, "Service", "User") or value(unit, "Service", "DynamicUser") == "yes", "runs as root"
    assert value(unit, "Service", "User") not in ("root", "0")


def test_probe_unit() -> None:
    unit = load(PROBE)
    args = gputally_args(value(unit, "Service", "ExecStart") or "")
    assert (args.command, args.probe) == ("probe", "nvml")
    assert (args.endpoint, args.insecure, args.interval) == ("127.0.0.1:4317", True, "10s")
    # The on-disk queue is in the one writable place, the StateDirectory.
    state = words(unit, "Service", "StateDirectory")
    assert state == ["gputally-probe"]
    assert args.queue_dir == Path("/var/lib/gputally-probe/queue")
    assert "-/etc/gputally/probe.env" in values(unit, "Service", "EnvironmentFile")
    assert value(unit, "Service", "DynamicUser") == "yes"
    # NVML needs the host's /dev/nvidia* and the device cgroup must admit them.
    assert value(unit, "Service", "PrivateDevices") in (None, "no")
    assert any(v.startswith("char-nvidia") and v.endswith(" rw") for v in values(unit, "Service", "DeviceAllow"))
    assert "gputally.service" in words(unit, "Unit", "After")


def test_local_stage_unit() -> None:
    unit = load(LOCAL)
    args = gputally_args(value(unit, "Service", "ExecStart") or "")
    assert args.command == "serve" and args.config == ["/etc/gputally/config.yaml"]  # --config is repeatable
    assert "network-online.target" in words(unit, "Unit", "After")
    assert "network-online.target" in words(unit, "Unit", "Wants")
    assert int(value(unit, "Service", "LimitNOFILE") or 0) >= 65536
    assert value(unit, "Service", "User") == "gputally"
    assert words(unit, "Service", "StateDirectory") == ["gputally"]
    # gputally drains for up to 30s (service.shutdown_timeout) and exits 5s later at the latest.
    stop = value(unit, "Service", "TimeoutStopSec") or ""
    assert re.fullmatch(r"\d+s", stop) and int(stop[:-1]) >= 35, stop


@pytest.mark.parametrize("name", UNITS)
def test_every_exec_line_is_a_gputally_command_line(name: str) -> None:
    unit = load(name)
    lines = [v for k, v in unit["Service"] if k in EXEC_KEYS and v]
    assert lines
    for line in lines:
        gputally_args(line)


@pytest.mark.parametrize(
    ("wrong", "why"),
    [
        ("--queue-dri", "unrecognized arguments"),
        ("--queue", "abbreviations are refused"),
    ],
)
def test_a_misspelled_flag_is_refused(wrong: str, why: str) -> None:
    line = value(load(PROBE), "Service", "ExecStart") or ""
    assert "--queue-dir" in line
    with pytest.raises(ArgvError, match=why):
        gputally_args(line.replace("--queue-dir", wrong))


def test_the_readme_config_is_one_gputally_accepts() -> None:
    """The README's config for the local stage validates, listens where the probe sends,
    and keeps its queue in the unit's StateDirectory."""
    blocks = re.findall(r"```yaml\n(.*?)```", (UNIT_DIR / "README.md").read_text(), flags=re.S)
    assert len(blocks) == 1
    config = load_config(blocks[0])
    assert config.service.pipelines
    assert "endpoint: 127.0.0.1:4317" in blocks[0]
    assert config.extensions["file_storage"].directory == Path("/var/lib/gputally/queue")
    assert config.exporters["otlp"].config.sending_queue.storage == "file_storage"


def runnable_copies(directory: Path) -> list[str]:
    """Copies of the units whose programs exist here (this Python stands in for gputally)."""
    copies = []
    for name in UNITS:
        text = (UNIT_DIR / name).read_text()
        assert "/opt/gputally/bin/gputally " in text
        (directory / name).write_text(text.replace("/opt/gputally/bin/gputally ", f"{sys.executable} "))
        copies.append(str(directory / name))
    return copies


def test_systemd_analyze_verify_reports_nothing(tmp_path: Path, systemd_analyze: str) -> None:
    """``systemd-analyze verify`` exits 0 even for unknown keys or bad values (it only
    prints them), so any output fails the test. ExecStart's program must exist for verify:
    the copies point at this Python instead of /opt/gputally/bin/gputally."""
    proc = subprocess.run(
        [systemd_analyze, "verify", "--man=no", *runnable_copies(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        f"systemd-analyze verify (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
    )


def test_systemd_analyze_verify_catches_a_typo(tmp_path: Path, systemd_analyze: str) -> None:
    """The check above cannot pass vacuously: a misspelled key in a copy is reported."""
    text = (UNIT_DIR / LOCAL).read_text().replace("/opt/gputally/bin/gputally ", f"{sys.executable} ")
    broken = tmp_path / LOCAL
    broken.write_text(text.replace("ProtectSystem=strict", "ProtectSytem=strict"))
    proc = subprocess.run(
        [systemd_analyze, "verify", "--man=no", str(broken)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "ProtectSytem" in proc.stdout + proc.stderr


def test_hardening_keeps_its_exposure_rating(tmp_path: Path, systemd_analyze: str) -> None:
    """``systemd-analyze security`` rates both units 1.7-1.8 ("OK", README.md); a change that
    loosens the hardening noticeably shows up here."""
    proc = subprocess.run(
        [systemd_analyze, "security", "--offline=yes", "--no-pager", *runnable_copies(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "--offline" in proc.stderr and proc.returncode != 0:
        pytest.skip(f"this systemd-analyze cannot rate unit files offline (systemd >= 250): {proc.stderr.strip()}")
    ratings = dict(re.findall(r"Overall exposure level for (\S+): (\d+\.\d)", proc.stdout))
    assert set(ratings) == set(UNITS), proc.stdout + proc.stderr
    for name, rating in ratings.items():
        assert float(rating) <= 2.5, f"{name}: exposure {rating}"
