"""``probe --replay``: a file that is not a recording is one line naming where, exit 2."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gputally.cli.main import main
from gputally.probes.nvml.recording_check import RecordingError, check_recording, read_recording
from gputally.probes.nvml.replay import ReplaySource, load_recording
from tests.probes.nvml.helpers import TIMESERIES, TWO_WORKLOADS, recording


def broken(change: Any) -> dict[str, Any]:
    data = recording()
    change(data)
    return data


CASES = {
    "snapshots an object": (lambda d: d.update(snapshots={"a": 1}), "$.snapshots: expected a list, found an object"),
    "snapshots of ints": (lambda d: d.update(snapshots=[1, 2]), "$.snapshots[0]: expected an object, found an integer"),
    "no snapshots": (lambda d: d.update(snapshots=[]), "$.snapshots: expected a non-empty list"),
    "no device": (lambda d: d.pop("device"), "not an NVML recording ($: 'device' is missing)"),
    "other_gpus of strings": (lambda d: d.update(other_gpus=["GPU-1"]),
                              "$.other_gpus[0]: expected an object, found a string"),
    "other_gpus without snapshots": (lambda d: d.update(other_gpus=[{"device": d["device"]}]),
                                     "$.other_gpus[0]: 'snapshots' is missing"),
    "uuid a number": (lambda d: d["device"].update(uuid=7), "$.device.uuid: expected a string, found an integer"),
    "samples without time": (lambda d: d["snapshots"][1].update(process_utilization=[{"pid": 1}]),
                             "$.snapshots[1].process_utilization[0]: 'timeStamp' is missing"),
    "event data a string": (lambda d: d["snapshots"][0].update(events=[{"kind": "xid", "data": "79"}]),
                            "$.snapshots[0].events[0].data: expected an integer, found a string"),
    "time a string": (lambda d: d["snapshots"][0].update(time="now"),
                      "$.snapshots[0].time: expected a number, found a string"),
}


@pytest.mark.parametrize("name", CASES)
def test_a_misshapen_recording_names_the_place(name: str) -> None:
    change, expected = CASES[name]
    with pytest.raises(RecordingError) as info:
        check_recording(broken(change), name="r.json")
    assert str(info.value) == f"r.json: {expected}"


def test_the_real_recordings_pass() -> None:
    for path in (TWO_WORKLOADS, TIMESERIES):
        assert read_recording(path) == json.loads(path.read_text())


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "recording.json"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


@pytest.mark.parametrize(("make", "expected"), [
    (lambda tmp: write(tmp, "[" * 10_000 + "]" * 10_000), "JSON nested too deeply"),
    (lambda tmp: write(tmp, '{"device": ' + "9" * 5000 + "}"), "not JSON: Exceeds the limit"),
    (lambda tmp: write(tmp, b'{"device": "\xe9"}'), "not UTF-8 text"),
    (lambda tmp: write(tmp, "{"), "not JSON: Expecting property name"),
    (lambda tmp: tmp, "is a directory, not a file"),
    (lambda tmp: (tmp / "zero.json").symlink_to("/dev/zero") or tmp / "zero.json",
     "zero.json is not a regular file (a device, pipe or socket)"),
    (lambda tmp: tmp / "missing.json", "cannot read"),
])
def test_a_file_that_is_not_a_recording(tmp_path: Path, make: Any, expected: str) -> None:
    path = make(tmp_path)
    started = time.monotonic()
    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_recording(path)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("name", ["snapshots an object", "other_gpus of strings"])
def test_probe_replay_prints_one_line_and_exits_2(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, json.dumps(broken(CASES[name][0])))
    assert main(["probe", "nvml", "--replay", str(path), "--once", "--debug", "--no-pod-resources"]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"gputally: cannot replay {path}: {path}: {CASES[name][1]}"]
    assert "Traceback" not in out + err


def test_probe_replay_of_a_device_symlink_exits_2_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    assert main(["probe", "nvml", "--replay", str(link), "--once", "--debug", "--no-pod-resources"]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_a_checked_recording_replays() -> None:
    source = ReplaySource(read_recording(TWO_WORKLOADS))
    assert source.gpus()
