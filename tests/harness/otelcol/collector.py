"""Run the otelcol built by ``build.sh``: start a config, wait until it listens, stop it.

`locate_binary` finds the binary (``$GPUTALLY_OTELCOL`` or ``build.sh --check``; it never
builds). `Otelcol` runs one collector process with its log in a file, so a failure can show
the log's tail. Its own telemetry server (``:8888`` by default) is switched off unless the
config sets one, so parallel collectors don't fight over that port.

Give the OTLP receivers ``127.0.0.1:0``: the collector logs the address each one bound
(``Starting GRPC server`` / ``Starting HTTP server`` with ``endpoint`` and the component id),
and `Otelcol.port` reads it back. A listener that cannot say its port (the telemetry's
Prometheus reader) gets one from `harness.processes.Ports`: `start_otelcol` builds the config
from the ports it is given and starts again on new ones when one was taken.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from harness.builds import built
from harness.processes import Ports, PortTaken, in_use, start_on_ports, terminate

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
REPO = HERE.parents[2]

__all__ = ["BUILD_SCRIPT", "HarnessError", "Otelcol", "locate_binary", "start_otelcol", "validate"]

READY = "Everything is ready"
"""The collector's line once every component has started (its receivers listen)."""
_LISTENING = re.compile(r"Starting (?P<transport>GRPC|HTTP) server\s+(?P<fields>\{.*\})")


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
        self.listening: dict[tuple[str, str], str] = {}
        """(receiver id, ``grpc`` or ``http``) -> the ``host:port`` it bound, once started."""
        self.ports = Ports()
        """The ports picked for its config by `start_otelcol` (none for a plain config)."""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout: float = 30.0) -> None:
        """Start the process and wait until it says it is ready; then `listening` holds where
        its OTLP receivers listen. Raises `PortTaken` (the process stopped) when it exited
        because an address was in use, `HarnessError` with the log's tail for anything else."""
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
        deadline = time.monotonic() + timeout
        while True:
            text = self.log_path.read_text(errors="replace")
            if READY in text:
                self.listening = _listening(text)
                return
            code = self.proc.poll()
            if code is not None:
                taken = in_use(self.log_path)
                if taken is not None:
                    raise PortTaken(f"{self.name} exited with {code}: {taken}")
                raise HarnessError(f"{self.name} exited with {code} before it was ready:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise HarnessError(f"{self.name} was not ready within {timeout:g} s:\n{self.log_tail()}")
            time.sleep(0.05)

    def port(self, receiver: str = "otlp", transport: str = "grpc") -> int:
        """The port receiver ``receiver``'s ``transport`` (``grpc`` or ``http``) listens on."""
        try:
            return int(self.listening[(receiver, transport)].rpartition(":")[2])
        except KeyError:
            raise HarnessError(f"{self.name}: no {receiver} {transport} server in {self.listening}") from None

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


def _listening(log: str) -> dict[tuple[str, str], str]:
    """Where each OTLP receiver listens, from the collector's ``Starting ... server`` lines."""
    found: dict[tuple[str, str], str] = {}
    for match in _LISTENING.finditer(log):
        fields = json.loads(match["fields"])
        found[(fields["otelcol.component.id"], match["transport"].lower())] = fields["endpoint"]
    return found


def start_otelcol(binary: Path, config: dict[str, Any] | Callable[[Ports], dict[str, Any]], workdir: Path,
                  name: str = "otelcol", *, ports: Ports | None = None) -> Otelcol:
    """A started collector running ``config``: a mapping, or a function of the `Ports` its
    listeners that cannot take port 0 use, called again with new ports when one was taken.
    With ``ports`` (a caller that starts more than this collector on them, under its own
    `start_on_ports`) it starts once on those, and `PortTaken` is the caller's."""
    if not callable(config):
        collector = Otelcol(binary, config, workdir, name=name)
        collector.start()
        return collector
    build = config

    def attempt(given: Ports) -> Otelcol:
        collector = Otelcol(binary, build(given), workdir, name=name)
        collector.ports = given
        collector.start()
        return collector

    return attempt(ports) if ports is not None else start_on_ports(attempt, what=name)
