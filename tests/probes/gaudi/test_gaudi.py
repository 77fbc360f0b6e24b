"""``gputally probe gaudi`` on constructed hl-smi recordings: parsing, mapping, every hl-smi failure."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gputally.cli.main import main
from gputally.probes.core.model import Cycle
from gputally.probes.gaudi.mapping import map_gaudi
from gputally.probes.gaudi.parse import QUERY_FIELDS, parse_csv, parse_processes, parse_rows
from gputally.probes.gaudi.source import HlSmiSource
from gputally.probes.snapshot.collector import SnapshotCollector
from gputally.probes.snapshot.replay import SnapshotReplay
from gputally.probes.snapshot.source import VendorUnavailable
from tests.probes.readers import device, values

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "gaudi" / "gaudi3-two-devices.json"
ACCEL0 = "01P0-HL3090A0-18-U4V193-22-07-00"
ACCEL1 = "01P0-HL3090A0-18-U4V193-22-07-01"
MIB = 1024 * 1024


def recording() -> dict[str, Any]:
    return copy.deepcopy(json.loads(FIXTURE.read_text()))


async def cycles(source: Any, count: int = 1, processes: Any = None) -> list[Cycle]:
    probe = SnapshotCollector(source, processes or source, map_gaudi, node_name="node-g", vendor="gaudi")
    try:
        return [await probe.collect() for _ in range(count)]
    finally:
        await probe.close()


async def test_hl_smi_query_maps_onto_the_nvidia_names_and_units() -> None:
    (cycle,) = await cycles(SnapshotReplay(recording()))
    a0 = device(cycle, ACCEL0)
    attrs = a0.attributes
    assert (attrs["hw.vendor"], attrs["hw.model"], attrs["hw.name"], attrs["gputally.gpu.index"]) == (
        "Intel", "HL-325L", "accel0", 0)
    assert (attrs["gputally.gpu.pci.bus_id"], attrs["hw.serial_number"], attrs["hw.driver_version"]) == (
        "0000:19:00.0", "AN50018402", "1.20.0-bd4d4b9")
    assert attrs["gputally.gpu.module_id"] == 2 and attrs["host.name"] == "node-g"
    assert values(a0, "hw.gpu.utilization") == {(("hw.gpu.task", "general"),): pytest.approx(0.87)}
    assert values(a0, "hw.gpu.memory.usage") == {(): 98304 * MIB}
    assert values(a0, "hw.gpu.memory.limit") == {(): 131072 * MIB}
    assert values(a0, "hw.gpu.memory.utilization") == {(): 0.75}
    assert values(a0, "hw.power") == {(): 712.0}
    assert values(a0, "gputally.gpu.power.limit") == {(("gputally.gpu.power.limit_type", "enforced"),): 900.0}
    assert values(a0, "hw.temperature") == {(("hw.sensor_location", "gpu"),): 41}
    assert values(a0, "gputally.gpu.clock.frequency") == {(("gputally.gpu.clock.type", "soc"),): 1_400_000_000}
    assert values(a0, "gputally.gpu.clock.limit") == {(("gputally.gpu.clock.type", "soc"),): 1_600_000_000}
    assert values(a0, "gputally.gpu.pcie.link.generation") == {(): 5}
    assert values(a0, "gputally.gpu.pcie.link.width.limit") == {(): 16}
    assert values(a0, "hw.status")[(("hw.state", "ok"),)] == 1


async def test_na_columns_ecc_rows_and_degraded_state() -> None:
    (cycle,) = await cycles(SnapshotReplay(recording()))
    a1 = device(cycle, ACCEL1)
    assert "gputally.gpu.clock.frequency" not in {p.metric.name for p in a1.points}  # N/A
    assert values(a1, "hw.errors") == {(("error.type", "ecc_corrected"),): 4, (("error.type", "ecc_uncorrected"),): 1}
    assert values(a1, "gputally.gpu.memory.remapped_rows") == {(("gputally.gpu.memory.remap_cause", "any"),): 2}
    assert values(a1, "gputally.gpu.memory.remap.pending") == {(): 1}
    assert values(a1, "hw.status")[(("hw.state", "degraded"),)] == 1


async def test_processes_from_the_summary_table_carry_the_hints() -> None:
    (cycle,) = await cycles(SnapshotReplay(recording()))
    procs = {e.attributes["process.pid"]: e for e in cycle.processes()}
    assert set(procs) == {31337, 31338}
    p = procs[31337].attributes
    assert p["hw.id"] == ACCEL0
    assert (p["process.executable.name"], p["process.owner"], p["process.creation.time"]) == (
        "python3.10", "root", "2026-11-29T16:33:20.000Z")
    assert "cri-containerd-aa11" in p["process.linux.cgroup"]
    assert values(procs[31337], "gputally.gpu.process.memory.usage") == {(): 96000 * MIB}
    assert procs[31338].attributes["process.linux.cgroup"].endswith("job_777/step_0/user/task_0")


def test_csv_without_header_units_with_units_in_values_na_and_short_rows() -> None:
    text = ("name, bus_id, memory.used, memory.total, power.draw, utilization.aip, temperature.aip\n"
            "HL-225, 0000:33:00.0, 2048 MiB, 98304 MiB, 95.5 W, 12 %, N/A\n"
            "HL-225, 0000:34:00.0, [N/A], 98304 MiB\n\n")
    rows = parse_csv(text)
    assert rows[0]["memory.used"] == ("2048 MiB", "MiB") and rows[0]["temperature.aip"] == ("N/A", None)
    assert "power.draw" not in rows[1]
    devices = map_gaudi({"query": {"returncode": 0, "stdout": text}}, {})
    assert [d.hw_id for d in devices] == ["gaudi-0000:33:00.0", "gaudi-0000:34:00.0"]  # no uuid column (older hl-smi)
    first = {p.metric.name: p.value for p in devices[0].points}
    assert first["hw.gpu.memory.usage"] == 2048 * MIB and first["hw.power"] == 95.5
    assert first["hw.gpu.utilization"] == pytest.approx(0.12) and "hw.temperature" not in first
    second = {p.metric.name for p in devices[1].points}
    assert second == {"hw.gpu.memory.limit"}


def test_csv_without_a_header_is_read_in_query_order() -> None:
    row = ", ".join(["ts", "3", "1", "HL-325L", "0000:4d:00.0", "uuid-3", "SER3", "1.20.0"] + ["N/A"] * (len(QUERY_FIELDS) - 8))
    (device,) = map_gaudi({"query": {"returncode": 0, "stdout": row + "\n"}}, {})
    assert device.hw_id == "uuid-3" and device.attributes["gputally.gpu.index"] == 3 and device.points == []


def test_rows_and_processes_parsers_ignore_what_they_do_not_know() -> None:
    assert parse_rows("garbage\n0000:19:00.0\n  Rows Replaced : N/A\n  Pending rows: 3\n") == {"0000:19:00.0": {"pending": 3}}
    assert parse_processes("no table here\n|   0   12   C   x   5 MiB |\n") == []
    table = "| Compute Processes: |\n|   2    77   C   my app  with spaces   3 GiB |\n|   1   N/A   N/A   N/A   N/A |\n"
    assert parse_processes(table) == [(2, 77, 3 * 1024**3)]


async def test_a_failed_process_listing_is_a_problem_and_metrics_go_on() -> None:
    rec = recording()
    for snap in rec["snapshots"]:
        snap["processes"] = {"argv": [], "returncode": 1, "stdout": "", "stderr": "hl-smi: Permission denied\n"}
        del snap["rows"]
    (cycle,) = await cycles(SnapshotReplay(rec))
    assert cycle.processes() == [] and len(cycle.gpus()) == 2
    assert any("hl-smi processes exited with status 1: hl-smi: Permission denied" in p for p in cycle.problems)


@pytest.mark.parametrize(("query", "problem"), [
    ({"argv": [], "error": "hl-smi timed out after 4 s"}, "hl-smi timed out after 4 s"),
    ({"argv": [], "returncode": 2, "stdout": "", "stderr": "Failed to open device\n"},
     "hl-smi -Q exited with status 2: Failed to open device"),
    ({"argv": [], "returncode": 0, "stdout": "\n"}, "hl-smi lists no Gaudi devices"),
])
async def test_recorded_query_failures_replay_as_problems(query: dict[str, Any], problem: str) -> None:
    rec = recording()
    rec["snapshots"] = [{"query": query}]
    (cycle,) = await cycles(SnapshotReplay(rec))
    assert cycle.entities == [] and cycle.problems == [problem]


class FakeHlSmi:
    """Stands in for subprocess.run: answers each argument list from a recording's first snapshot."""

    def __init__(self, rec: dict[str, Any], *, query: Any = None) -> None:
        self.snap = rec["snapshots"][0]
        self.query = query
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)  # an argument list, no shell
        self.calls.append((argv, timeout))
        if "-Q" in argv:
            if callable(self.query):
                return self.query(argv, timeout)
            key = "query"
        else:
            key = "rows" if "-q" in argv else "processes"
        entry = self.snap[key]
        return subprocess.CompletedProcess(argv, entry["returncode"], entry["stdout"], entry["stderr"])


def live(run: Any, tmp_path: Path) -> HlSmiSource:
    binary = tmp_path / "hl-smi"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    return HlSmiSource(binary=str(binary), timeout_s=1.5, run=run)


async def test_the_live_source_runs_fixed_argument_lists_with_a_timeout(tmp_path: Path) -> None:
    run = FakeHlSmi(recording())
    source = live(run, tmp_path)
    replay = SnapshotReplay(recording())
    (cycle,) = await cycles(source, processes=replay)
    assert len(cycle.gpus()) == 2 and len(cycle.processes()) == 2
    argvs = [argv for argv, _ in run.calls]
    assert argvs[0] == [str(tmp_path / "hl-smi"), "-Q", ",".join(QUERY_FIELDS), "-f", "csv"]
    assert argvs[1:] == [[str(tmp_path / "hl-smi"), "-q", "-d", "ROW_REPLACEMENT"], [str(tmp_path / "hl-smi")]]
    assert {timeout for _, timeout in run.calls} == {1.5}


async def test_hl_smi_timeout_is_a_problem_and_the_next_cycle_tries_again(tmp_path: Path) -> None:
    state = {"n": 0}
    ok = FakeHlSmi(recording())

    def query(argv: list[str], timeout: float) -> Any:
        state["n"] += 1
        if state["n"] == 1:
            raise subprocess.TimeoutExpired(argv, timeout)
        return ok(argv, timeout)

    first, second = await cycles(live(FakeHlSmi(recording(), query=query), tmp_path), 2, SnapshotReplay(recording()))
    assert first.entities == [] and first.problems == ["hl-smi timed out after 1.5 s"]
    assert len(second.gpus()) == 2


async def test_hl_smi_non_zero_exit_is_a_problem(tmp_path: Path) -> None:
    def query(argv: list[str], timeout: float) -> Any:
        return subprocess.CompletedProcess(argv, 3, "", "habanalabs driver is not loaded\n")

    (cycle,) = await cycles(live(FakeHlSmi(recording(), query=query), tmp_path))
    assert cycle.problems == ["hl-smi -Q exited with status 3: habanalabs driver is not loaded"]


async def test_a_field_an_older_hl_smi_rejects_is_dropped(tmp_path: Path) -> None:
    ok = FakeHlSmi(recording())

    def query(argv: list[str], timeout: float) -> Any:
        if "clocks.max.soc" in argv[2]:
            return subprocess.CompletedProcess(argv, 1, "", 'Invalid field "clocks.max.soc"\n')
        return ok(argv, timeout)

    run = FakeHlSmi(recording(), query=query)
    source = live(run, tmp_path)
    (cycle,) = await cycles(source, processes=SnapshotReplay(recording()))
    assert len(cycle.gpus()) == 2 and "clocks.max.soc" not in source.fields
    assert "clocks.max.soc" not in run.calls[1][0][2]


def test_a_missing_binary_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    source = HlSmiSource(binary="hl-smi-not-installed-here")
    with pytest.raises(VendorUnavailable, match="hl-smi-not-installed-here not found on PATH"):
        source.open()
    assert main(["probe", "gaudi", "--hl-smi", "hl-smi-not-installed-here", "--once", "--debug"]) == 1
    assert "! hl-smi-not-installed-here not found on PATH" in capsys.readouterr().out


async def test_a_binary_that_vanishes_between_cycles_is_a_problem(tmp_path: Path) -> None:
    def gone(argv: Sequence[str], timeout: float) -> Any:
        raise FileNotFoundError(argv[0])

    (cycle,) = await cycles(live(gone, tmp_path))
    assert cycle.problems == [f"{tmp_path / 'hl-smi'} not found"]


def test_replay_once_debug(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "gaudi", "--replay", str(FIXTURE), "--once", "--debug"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gputally probe gaudi (replay of gaudi3-two-devices.json): 2 device(s), 2 process(es)")
    assert "process 31338  hl_worker  owner bo" in out
