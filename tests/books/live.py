"""What the comparisons with the schedulers' books run: the real NVIDIA probe replaying a
two-GPU node in real time, ``gputally serve`` with an attribution processor and ``usage``
into a real Prometheus, and the report read back in-process.

The node's two GPUs are the H200 recording's reading with no process on it, twice (its own
UUID and device minor each): allocation alone decides who holds them, which is what the
schedulers book. The probe stamps each sample with the wall clock, as on a node.
"""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.processes import terminate

from gputally.probes.nvml.replay import load_recording
from tests.otelcol.shapes import GputallyProcess
from tests.report.support import report

RECORDING = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "nvml" / "h200-two-workloads.json"
INTERVAL = 1.0
"""The probe's interval (seconds): the bound on each job boundary is this much GPU time per GPU."""


def gpu_uuid(minor: int) -> str:
    base = load_recording(RECORDING)["device"]["uuid"]
    return f"{base[:-4]}{minor:04x}"


def two_gpu_recording(path: Path, minors: Sequence[int]) -> list[str]:
    """Write a replay file of one node with a GPU per device minor (the recording's process-free
    reading); returns their UUIDs in order."""
    data = copy.deepcopy(load_recording(RECORDING))
    idle = next(s for s in data["snapshots"] if not s["dynamic"].get("compute_procs"))
    idle = {**idle, "process_utilization": [], "processes_utilization_info": [], "proc_facts": {},
            "accounting_pids": []}
    devices = []
    for index, minor in enumerate(minors):
        device = copy.deepcopy(data["device"])
        device.update(index=index, minor_number=minor, uuid=gpu_uuid(minor))
        pci = device.get("pci_info")
        if isinstance(pci, dict):
            pci["bus"] = 0x10 + index
            pci["busId"] = f"{pci.get('domain', 0):08X}:{0x10 + index:02X}:00.0"
            pci["busIdLegacy"] = f"{pci.get('domain', 0):04X}:{0x10 + index:02X}:00.0"
        devices.append(device)
    data["device"] = devices[0]
    data["snapshots"] = [idle]
    data["other_gpus"] = [{"device": d, "snapshots": [copy.deepcopy(idle)]} for d in devices[1:]]
    data["device_count"] = len(devices)
    path.write_text(json.dumps(data))
    return [d["uuid"] for d in devices]


@contextlib.contextmanager
def probe(recording: Path, port: int, node: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``gputally probe nvml --replay`` every `INTERVAL` to ``port``, stopped by pid on leaving."""
    executable = Path(sys.executable).with_name("gputally")
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(executable), "probe", "nvml", "--replay", str(recording), "--interval", f"{INTERVAL:g}s",
             "--endpoint", f"127.0.0.1:{port}", "--insecure", "--metrics-only", "--node-name", node,
             "--no-pod-resources", "--cri", "off", "--summary-every", "0"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield process
    finally:
        terminate(process, 10.0)


def serve_config(processors: Mapping[str, Any], prometheus: Any) -> dict[str, Any]:
    """``processors`` (an attribution processor) then ``usage``, into ``prometheus``; on port 0."""
    base = prometheus.otlp_url.removesuffix("/v1/metrics")
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
        "processors": {**processors, "usage": {"settle": "200ms", "emit_interval": "1s", "end_after": "1h"}},
        "exporters": {"otlphttp": {"endpoint": base, "compression": "none"}},
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": [*processors, "usage"],
                                      "exporters": ["otlphttp"]}},
            "telemetry": {"metrics": {"address": "127.0.0.1:0"}},
        },
    }


def start_serve(config: Mapping[str, Any], workdir: Path) -> tuple[GputallyProcess, int]:
    """A started ``gputally serve`` with ``config``, and the port its otlp receiver got."""
    gateway = GputallyProcess(config, workdir / "gputally").start()
    return gateway, gateway.port("grpc")


def allocated_seconds(url: str, start: float, end: float, kind: str) -> dict[str, float]:
    """Owner id -> allocated GPU-seconds, from ``gputally report --by owner --format json``."""
    body = report("--prometheus", url, "--start", f"{start:.3f}", "--end", f"{end:.3f}", "--format", "json").json()
    return {row["owner_id"]: row["allocated_gpu_hours"] * 3600 for row in body["rows"] if row["owner_kind"] == kind}


def wait_for(predicate: Any, what: str, timeout: float = 60.0, every: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)
