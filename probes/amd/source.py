"""The live AMD source: ``amdsmi`` imported lazily, every GPU read once per snapshot.

* :func:`load_amdsmi` imports ``amdsmi`` lazily and turns every way that fails (no package,
  no ``libamd_smi.so``: amdsmi prints to stdout and raises KeyError) into one
  :class:`~gputally.probes.snapshot.source.VendorUnavailable` line, stdout kept clean;
* :class:`AmdsmiSource` calls amdsmi once per device per cycle and returns the return values
  as they are (dicts with amdsmi's keys, amdsmi's units), errors as ``{"amdsmi_error": ...}``;
  this dict is also the recording format (``tests/fixtures/amd/README.md``), so everything
  after it (:mod:`~gputally.probes.amd.mapping`) runs in CI without ROCm.

Where ``amdsmi_get_gpu_process_list`` fails (no permission, not supported) the snapshot also
carries the DRM fdinfo usage under the proc root (:mod:`~gputally.probes.amd.fdinfo`).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeGuard

from gputally.probes.amd.fdinfo import scan_fdinfo
from gputally.probes.snapshot.source import VendorUnavailable

__all__ = ["CLOCKS", "FORMAT", "TEMPERATURES", "UNSUPPORTED", "AmdsmiSource", "failed", "load_amdsmi"]

FORMAT = "gputally-amdsmi-recording/1"
TEMPERATURES = {"edge": "edge", "hotspot": "gpu", "vram": "memory"}
"""amdsmi sensor -> ``hw.sensor_location``: hotspot (junction) is the die sensor NVIDIA calls gpu."""
CLOCKS = {"gfx": "graphics", "mem": "memory", "soc": "soc", "vclk0": "video"}
"""amdsmi clock -> ``gputally.gpu.clock.type``."""
UNSUPPORTED = ("NOT_SUPPORTED", "NOT_YET_IMPLEMENTED", "NO_PERM", "NOT_SUPPORT")
"""Words of an amdsmi error that mean "this device never answers this call"."""
_STATIC_CALLS = {
    "uuid": "amdsmi_get_gpu_device_uuid",
    "bdf": "amdsmi_get_gpu_device_bdf",
    "asic_info": "amdsmi_get_gpu_asic_info",
    "board_info": "amdsmi_get_gpu_board_info",
    "vbios_info": "amdsmi_get_gpu_vbios_info",
    "driver_info": "amdsmi_get_gpu_driver_info",
    "compute_partition": "amdsmi_get_gpu_compute_partition",
    "memory_partition": "amdsmi_get_gpu_memory_partition",
    "kfd_info": "amdsmi_get_gpu_kfd_info",
    "power_cap_info": "amdsmi_get_power_cap_info",
}
"""Asked once per device at open: recording key -> amdsmi function of the handle."""
_DYNAMIC_CALLS = {
    "activity": "amdsmi_get_gpu_activity",
    "vram_usage": "amdsmi_get_gpu_vram_usage",
    "power_info": "amdsmi_get_power_info",
    "energy_count": "amdsmi_get_energy_count",
    "pcie_info": "amdsmi_get_pcie_info",
    "ecc_total": "amdsmi_get_gpu_total_ecc_count",
    "gpu_metrics": "amdsmi_get_gpu_metrics_info",
    "violation_status": "amdsmi_get_violation_status",
    "process_list": "amdsmi_get_gpu_process_list",
}
"""Asked every snapshot, likewise; temperatures, clocks and ECC blocks take a second argument."""
_ECC_BLOCKS = ("UMC", "SDMA", "GFX", "MMHUB", "PCIE_BIF", "HDP", "XGMI_WAFL")


def load_amdsmi(importer: Callable[[], Any] | None = None) -> Any:
    """The ``amdsmi`` module, or VendorUnavailable with one line.

    amdsmi 7.x without ROCm prints to stdout and raises KeyError('libamd_smi.so') on import:
    both Python's and the C library's stdout are redirected while importing, and any exception
    becomes one line."""
    def default() -> Any:
        import amdsmi  # noqa: PLC0415 - lazy on purpose

        return amdsmi

    importer = importer or default
    sys.stdout.flush()
    saved = None
    with contextlib.suppress(OSError, ValueError):
        saved = os.dup(1)
    try:
        if saved is not None:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.close(devnull)
        with contextlib.redirect_stdout(io.StringIO()):
            return importer()
    except Exception as exc:  # KeyError, ImportError, OSError: any of them means no usable amdsmi
        detail = f"{type(exc).__name__}: {exc}"
        raise VendorUnavailable(
            f"cannot load amdsmi ({detail}): install ROCm (libamd_smi.so) and the amdsmi package"
        ) from None
    finally:
        if saved is not None:
            with contextlib.suppress(OSError):
                os.dup2(saved, 1)
                os.close(saved)


def _error(exc: BaseException) -> dict[str, str]:
    info = getattr(exc, "get_error_info", None)
    text = None
    if callable(info):
        with contextlib.suppress(Exception):
            text = str(info())
    return {"amdsmi_error": text or str(exc) or type(exc).__name__}


def failed(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """Whether ``value`` is an amdsmi error as the source records it: ``{"amdsmi_error": ...}``."""
    return isinstance(value, Mapping) and "amdsmi_error" in value


class AmdsmiSource:
    """The live source: amdsmi initialised once, every GPU read once per :meth:`snapshot`.

    Calls a device refuses (not supported, no permission) are recorded once and not asked again."""

    def __init__(self, *, proc_root: Path = Path("/proc"), module: Any = None) -> None:
        self._module = module
        self._proc_root = Path(proc_root)
        self._handles: list[Any] = []
        self._static: list[dict[str, Any]] = []
        self._skip: set[tuple[int, str]] = set()
        self._open = False

    def open(self) -> dict[str, Any]:
        if self._module is None:
            self._module = load_amdsmi()
        a = self._module
        try:
            flags = getattr(getattr(a, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
            a.amdsmi_init(flags) if flags is not None else a.amdsmi_init()
            self._open = True
            self._handles = list(a.amdsmi_get_processor_handles())
        except Exception as exc:
            raise VendorUnavailable(f"amdsmi cannot start: {_error(exc)['amdsmi_error']}") from None
        if not self._handles:
            raise VendorUnavailable("amdsmi lists no AMD GPUs")
        self._static = [self._static_of(i, h) for i, h in enumerate(self._handles)]
        driver: dict[str, Any] = next((s["driver_info"] for s in self._static if isinstance(s.get("driver_info"), dict)), {})
        return {"driver_version": driver.get("driver_version"), "driver_name": driver.get("driver_name")}

    def _call(self, index: int, name: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, or its error as a value. ``fn`` is called before this returns, so callers'
        lambdas may close over their loop variables."""
        if (index, name) in self._skip:
            return {"amdsmi_error": "skipped: refused earlier"}
        try:
            return fn()
        except Exception as exc:
            error = _error(exc)
            if any(word in error["amdsmi_error"].upper() for word in UNSUPPORTED):
                self._skip.add((index, name))
            return error

    def _calls(self, i: int, h: Any, calls: Mapping[str, str]) -> dict[str, Any]:
        """``{key: amdsmi_function(handle)}`` for each entry of ``calls``, errors as values."""
        a = self._module
        return {key: self._call(i, key, lambda: getattr(a, name)(h)) for key, name in calls.items()}

    def _static_of(self, i: int, h: Any) -> dict[str, Any]:
        a = self._module
        T, M = a.AmdSmiTemperatureType, a.AmdSmiTemperatureMetric
        static = self._calls(i, h, _STATIC_CALLS)
        limits: dict[str, dict[str, Any]] = {}
        for sensor in ("hotspot", "vram"):
            for level in ("critical", "emergency"):
                value = self._call(i, f"temp_{sensor}_{level}", lambda: a.amdsmi_get_temp_metric(
                    h, getattr(T, sensor.upper()), getattr(M, level.upper())))
                limits.setdefault(sensor, {})[level] = value
        static["temp_limits"] = limits
        return static

    def _dynamic_of(self, i: int, h: Any) -> dict[str, Any]:
        a = self._module
        T, M, C = a.AmdSmiTemperatureType, a.AmdSmiTemperatureMetric, a.AmdSmiClkType
        dynamic = self._calls(i, h, _DYNAMIC_CALLS)
        dynamic["temperature"] = {
            s: self._call(i, f"temp_{s}", lambda: a.amdsmi_get_temp_metric(h, getattr(T, s.upper()), M.CURRENT))
            for s in TEMPERATURES
        }
        dynamic["clock"] = {
            c: self._call(i, f"clock_{c}", lambda: a.amdsmi_get_clock_info(h, getattr(C, c.upper())))
            for c in CLOCKS
        }
        blocks = {}
        for block in _ECC_BLOCKS:
            value = self._call(i, f"ecc_{block}", lambda: a.amdsmi_get_gpu_ecc_count(h, getattr(a.AmdSmiGpuBlock, block)))
            if not failed(value):
                blocks[block] = value
        dynamic["ecc_blocks"] = blocks
        return dynamic

    def snapshot(self) -> dict[str, Any]:
        devices = [{"static": self._static[i], "dynamic": self._dynamic_of(i, h)} for i, h in enumerate(self._handles)]
        snap: dict[str, Any] = {"devices": devices}
        if any(failed(d["dynamic"].get("process_list")) for d in devices):
            snap["drm_fdinfo"] = scan_fdinfo(self._proc_root)
        return snap

    def close(self) -> None:
        if self._open and self._module is not None:
            with contextlib.suppress(Exception):
                self._module.amdsmi_shut_down()
            self._open = False
