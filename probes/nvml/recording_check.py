"""Read an NVML recording safely and check its shape before anything replays it.

``gputally probe nvml --replay FILE`` used to trust the file: snapshots written as an object,
``other_gpus`` entries of the wrong type or a 10,000-deep JSON ended in a traceback, and a
symlink to ``/dev/zero`` in a read without end. Here the file must be a regular file (a
symlink is followed, a device is refused) of at most :data:`MAX_RECORDING_BYTES`, JSON nested
at most as deep as Python's parser allows, and shaped as
:class:`~gputally.probes.nvml.replay.ReplaySource` reads it. The first problem found is one
:class:`RecordingError` naming the place in the file (``$.snapshots[3].dynamic``).

Only what the replay source indexes is checked; unknown keys are left alone (recordings
carry descriptions and extra readings).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gputally.config.files import read_input_file
from gputally.errors import ConfigError

__all__ = ["MAX_RECORDING_BYTES", "RecordingError", "check_recording", "read_recording"]

MAX_RECORDING_BYTES = 256 << 20
"""Largest recording read: 256 MiB (an hour of one GPU every 2 s is about 60 MiB)."""
_ENERGY_FIELD = "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
_WIDE = ("ullVal", "ulVal", "sllVal")


class RecordingError(ValueError):
    """The file is not a recording the replay source can serve; the message names where."""


def read_recording(path: Path) -> dict[str, Any]:
    """The checked recording at ``path``; RecordingError (a ValueError) naming the problem."""
    try:
        raw = read_input_file(Path(path), key="recording", limit=MAX_RECORDING_BYTES)
    except ConfigError as exc:
        raise RecordingError(exc.problems[0].removeprefix("recording: ")) from None
    try:
        data = json.loads(raw)
    except RecursionError:
        raise RecordingError(f"{path}: JSON nested too deeply to be a recording") from None
    except UnicodeDecodeError as exc:
        raise RecordingError(f"{path}: not UTF-8 text (offset {exc.start})") from None
    except ValueError as exc:  # json.JSONDecodeError, and integers of more than 4300 digits
        raise RecordingError(f"{path}: not JSON: {exc}") from None
    check_recording(data, name=str(path))
    return data


# -- the shape ---------------------------------------------------------------------------

Check = Callable[[Any, str], None]


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number"}.get(
        type(value), type(value).__name__
    )


def _fail(where: str, expected: str, value: Any) -> RecordingError:
    return RecordingError(f"{where}: expected {expected}, found {_kind(value)}")


def _integer(value: Any, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail(where, "an integer", value)


def _number(value: Any, where: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _fail(where, "a number", value)


def _string(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise _fail(where, "a string", value)


def _optional(check: Check) -> Check:
    def optional(value: Any, where: str) -> None:
        if value is not None:
            check(value, where)

    return optional


def _anything(value: Any, where: str) -> None:
    pass


def _list_of(check: Check, *, non_empty: bool = False) -> Check:
    def list_of(value: Any, where: str) -> None:
        if not isinstance(value, list):
            raise _fail(where, "a list", value)
        if non_empty and not value:
            raise RecordingError(f"{where}: expected a non-empty list")
        for index, item in enumerate(value):
            check(item, f"{where}[{index}]")

    return list_of


def _map_of(check: Check) -> Check:
    def map_of(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _fail(where, "an object", value)
        for key, item in value.items():
            check(item, f"{where}.{key}")

    return map_of


def _object(required: Mapping[str, Check] | None = None, optional: Mapping[str, Check] | None = None) -> Check:
    def check_object(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _fail(where, "an object", value)
        for key, check in (required or {}).items():
            if key not in value:
                raise RecordingError(f"{where}: '{key}' is missing")
            check(value[key], f"{where}.{key}")
        for key, check in (optional or {}).items():
            if key in value:
                check(value[key], f"{where}.{key}")

    return check_object


def _error_or(check: Check) -> Check:
    """A reading, or an ``{"nvml_error": ...}`` / ``{"error": ...}`` entry in its place."""

    def error_or(value: Any, where: str) -> None:
        if isinstance(value, dict) and ("nvml_error" in value or "error" in value):
            return
        check(value, where)

    return error_or


def _field_values(value: Any, where: str) -> None:
    entry = _object(optional={"ret": _integer, "value": _map_of(_anything)})
    _map_of(entry)(value, where)
    energy = value.get(_ENERGY_FIELD)
    if isinstance(energy, dict) and energy.get("ret") == 0:
        readings = energy.get("value")
        if not isinstance(readings, dict) or "ullVal" not in readings:
            raise RecordingError(f"{where}.{_ENERGY_FIELD}.value: 'ullVal' is missing")
        for key in _WIDE:
            if key in readings:
                _integer(readings[key], f"{where}.{_ENERGY_FIELD}.value.{key}")


def _dynamic(value: Any, where: str) -> None:
    _map_of(_anything)(value, where)
    if "energy_mj" in value and not isinstance(value["energy_mj"], dict):
        _integer(value["energy_mj"], f"{where}.energy_mj")


_PROC_FACTS = _object(optional={
    "status_uid": _list_of(_string), "owner": _optional(_string), "cgroup": _optional(_string),
    "comm": _optional(_string), "exe": _optional(_string), "start_time": _optional(_number),
})
_BLOCK = {"dynamic": _dynamic, "gpm_1s": _error_or(_map_of(_map_of(_anything)))}
_SNAPSHOT = _object(optional={
    **_BLOCK,
    "time": _number,
    "field_values": _field_values,
    "process_utilization": _error_or(_list_of(_object(required={"timeStamp": _integer}))),
    "mig": _map_of(_object(optional=_BLOCK)),
    "events": _list_of(_object(optional={"kind": _anything, "data": _integer})),
    "proc_facts": _map_of(_PROC_FACTS),
})
_DEVICE = _object(
    required={"uuid": _string},
    optional={
        "mig_mode": _optional(_list_of(_integer)),
        "mig_devices": _list_of(_object(
            required={"uuid": _string, "gpu_instance_id": _integer},
            optional={"compute_instance_id": _optional(_integer)},
        )),
        "pci_info": _object(optional={"domain": _integer}),
        "serial": _string,
    },
)
_SNAPSHOTS = _list_of(_SNAPSHOT, non_empty=True)
_RECORDING = _object(
    required={"device": _DEVICE, "snapshots": _SNAPSHOTS},
    optional={
        "other_gpus": _list_of(_object(required={"device": _DEVICE, "snapshots": _SNAPSHOTS})),
        "call_cost_us": _map_of(lambda cost, where: _object(optional={"p50_us": _number})(cost, where)
                                if isinstance(cost, dict) else None),
        "driver_version": _anything,  # shown as recorded (a string, or CUDA's integer)
        "nvml_version": _anything,
        "cuda_driver_version": _anything,
    },
)


def check_recording(data: Any, *, name: str = "recording") -> None:
    """RecordingError naming the first place where ``data`` is not shaped as a recording."""
    try:
        _RECORDING(data, "$")
    except RecordingError as exc:
        problem = str(exc)
        if problem.startswith("$:"):  # wrong at the top: most likely some other JSON file
            problem = f"not an NVML recording ({problem})"
        raise RecordingError(f"{name}: {problem}") from None
