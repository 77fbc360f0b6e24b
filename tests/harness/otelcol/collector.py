"""Run the otelcol built by ``build.sh``: start a config, wait until it listens, stop it.

`locate_binary` finds the binary (``$GPUTALLY_OTELCOL`` or ``build.sh --check``; it never
builds). `Otelcol` runs one collector process with its log in a file, so a failure can show
the log's tail. Its own telemetry server (``:8888`` by default) is switched off unless the
config sets one, so parallel collectors don't fight over that port.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from harness.builds import built
from harness.processes import terminate, wait_for_port

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
REPO = HERE.parents[2]

__all__ = ["BUILD_SCRIPT", "HarnessError", "Otelcol", "locate_binary", "validate"]


class HarnessError(RuntimeError):
    """The collector could not be found, started or stopped."""


def locate_binary() -> Path:
    """$GPUTALLY_OTELCOL if set, else the up-to-date build that ``build.sh --check`` reports.

    Raises `HarnessError` naming the build script when there is none.
    """
    path = built(BUILD_SCRIPT, {"OTELCOL": "GPUTALLY_OTELCOL"}, what="the otelcol for gputally's end-to-end tests",
                 cost="several minutes on a first run", error=HarnessError)["OTELCOL"]
    if not os.access(path, os.X_OK):
        raise HarnessError(f"{path} is not an executable; run {BUILD_SCRIPT.relative_to(REPO)}")
    return path


def _with_quiet_telemetry(config: dict[str, Any]) -> dict[str, Any]:
    config = dict(config)
    service = dict(config.get("service") or {})
    telemetry = dict(service.get("telemetry") or {})
    telemetry.setdefault("metrics", {"level": "none"})
    service["telemetry"] = telemetry
    config["service"] = service
    return config


def validate(binary: Path, config_path: Path) -> subprocess.CompletedProcess[str]:
    """``otelcol validate --config FILE``; the caller checks returncode/stderr."""
    return subprocess.run(
        [str(binary), "validate", f"--config={config_path}"], capture_output=True, text=True, timeout=60, check=False
    )


class Otelcol:
    """One collector process running ``config`` (a mapping, written to ``workdir``)."""

    def __init__(self, binary: Path, config: dict[str, Any], workdir: Path, name: str = "otelcol") -> None:
        self.binary = binary
        self.name = name
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config = _with_quiet_telemetry(config)
        self.config_path = workdir / f"{name}.yaml"
        self.log_path = workdir / f"{name}.log"
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, wait_for: tuple[str, int] | int | None = None, timeout: float = 30.0) -> None:
        """Start the process; then wait until ``wait_for`` (a port on 127.0.0.1, or host and
        port) accepts TCP connections. Raises `HarnessError` with the log's tail if the
        process exits or the port stays closed."""
        if self.proc is not None:
            raise HarnessError(f"{self.name} already started")
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(self.binary), f"--config={self.config_path}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                start_new_session=True,
            )
        if wait_for is None:
            return
        host, port = ("127.0.0.1", wait_for) if isinstance(wait_for, int) else wait_for
        failure = wait_for_port(self.proc, host, port, timeout)
        if failure is not None:
            self.stop()
            raise HarnessError(f"{self.name} {failure}:\n{self.log_tail()}")

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM by pid (the collector drains and flushes its exporters), SIGKILL after
        ``timeout``. Returns the exit code; idempotent."""
        return terminate(self.proc, timeout) if self.proc is not None else None

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Otelcol:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
