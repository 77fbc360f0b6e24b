"""The AMD probe's fallback for processes: their VRAM from DRM fdinfo under the proc root
(``drm-driver: amdgpu``, ``drm-pdev``, ``drm-memory-vram``), where amdsmi's process list fails.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["scan_fdinfo"]

_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def _bytes(text: str) -> int | None:
    parts = text.split()
    try:
        return int(parts[0]) * _UNITS.get(parts[1] if len(parts) > 1 else "", 1)
    except (IndexError, ValueError):
        return None


def scan_fdinfo(proc_root: Path) -> dict[str, dict[str, int]]:
    """``{pci_address: {pid: vram_bytes}}`` from every amdgpu DRM fd under ``proc_root``.

    A process holding several fds of one client (same ``drm-client-id``) is counted once;
    ``drm-memory-vram`` (older kernels) or ``drm-resident-vram``. Unreadable processes are skipped."""
    seen: dict[str, dict[str, dict[str, int]]] = {}
    try:
        pids = [p for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        directory = Path(proc_root) / pid / "fdinfo"
        try:
            fds = os.listdir(directory)
        except OSError:
            continue
        for fd in fds:
            try:
                text = (directory / fd).read_text(errors="replace")
            except OSError:
                continue
            if "drm-driver" not in text:
                continue
            keys = {}
            for line in text.splitlines():
                key, sep, value = line.partition(":")
                if sep:
                    keys[key.strip()] = value.strip()
            if keys.get("drm-driver") != "amdgpu" or "drm-pdev" not in keys:
                continue
            vram = keys.get("drm-memory-vram") or keys.get("drm-resident-vram")
            amount = _bytes(vram) if vram else None
            if amount is None:
                continue
            client = keys.get("drm-client-id", f"fd{fd}")
            seen.setdefault(keys["drm-pdev"].lower(), {}).setdefault(pid, {})[client] = amount
    return {pdev: {pid: sum(c.values()) for pid, c in pids_.items()} for pdev, pids_ in seen.items()}
