"""The probe's errors: NVML failures translated at the source boundary.

    GputallyError
    └── NvmlError
        ├── NvmlUnavailable    NVML cannot be used at all (no library, no driver, init failed)
        └── NvmlCallFailed     one NVML call failed; ``name`` is NVML's error string

Both sources (live and replay) raise only these, so everything above them handles one family
and the replay can exercise every failure path of the live probe.
"""

from __future__ import annotations

import re

from gputally.errors import GputallyError

__all__ = ["ERROR_NAMES", "NvmlCallFailed", "NvmlError", "NvmlUnavailable", "error_code"]

ERROR_NAMES: dict[int, str] = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    5: "Already Initialized",
    6: "Not Found",
    7: "Insufficient Size",
    8: "Insufficient External Power",
    9: "Driver Not Loaded",
    10: "Timeout",
    11: "Interrupt Request Issue",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    14: "Corrupted infoROM",
    15: "GPU is lost",
    16: "GPU requires restart",
    17: "The operating system has blocked the request.",
    18: "RM has detected an NVML/RM version mismatch.",
    19: "In Use",
    20: "Insufficient Memory",
    21: "No Data",
    28: "GPU Not Found",
    999: "Unknown Error",
}
"""NVML return codes and the strings pynvml gives them (``str(NVMLError)``)."""

_CODES = {name.lower(): code for code, name in ERROR_NAMES.items()}
_PYNVML_REPR = re.compile(r"NVMLError_\w+\((\d+)\)")
_SKIP = frozenset({3, 4, 13})
"""Not supported, no permission, function missing: asking again next cycle cannot help."""
_GONE = frozenset({15, 16, 28})
"""The GPU fell off the bus, needs a reset, or vanished."""
_DRIVER = frozenset({1, 9, 12, 18})
"""The library or driver itself is unusable: NVML must be initialised again."""


def error_code(text: str) -> int:
    """NVML's return code for an error as recorded: a name (``"Not Supported"``) or pynvml's repr
    (``"NVMLError_NotFound(6)"``); 999 (unknown) for anything else."""
    match = _PYNVML_REPR.fullmatch(text.strip())
    if match:
        return int(match.group(1))
    return _CODES.get(text.strip().lower(), 999)


class NvmlError(GputallyError):
    """Root of the probe's NVML failures."""


class NvmlUnavailable(NvmlError):
    """NVML cannot be used on this node: the message is one line a person can act on."""


class NvmlCallFailed(NvmlError):
    """One NVML call failed with ``code`` (NVML's return code) and ``name`` (its string)."""

    def __init__(self, call: str, code: int, name: str | None = None) -> None:
        self.call = call
        self.code = code
        self.name = name or ERROR_NAMES.get(code, f"NVML error {code}")
        super().__init__(f"{call}: {self.name}")

    @property
    def not_supported(self) -> bool:
        """The device or driver will never answer this call (or not to us): stop asking."""
        return self.code in _SKIP

    @property
    def gpu_gone(self) -> bool:
        """The GPU is lost or needs a reset: nothing more can be read from it this cycle."""
        return self.code in _GONE

    @property
    def driver_gone(self) -> bool:
        """The library or driver stopped working: NVML must be initialised again."""
        return self.code in _DRIVER

    @property
    def not_found(self) -> bool:
        """Nothing to report (for example no process-utilization samples since last time)."""
        return self.code == 6
