"""Where a ``gputally serve`` process listens, read from what it writes when it starts.

Tests configure ``127.0.0.1:0`` and read the ports back, because gputally says each address
it bound, the port resolved: every receiver logs one line at ``info`` (``otlp: OTLP/gRPC
listening on 127.0.0.1:41235``, ``otlp: OTLP/HTTP listening on ...``, ``bridge: bridge for
metrics/bridge on ...``), console or JSON, and serve then writes, whatever the log level, the
admin endpoint's (``gputally: metrics, /healthz and /readyz on http://...``) and ``gputally:
pipelines ...``, its last word on starting. With ``--workers`` each worker writes its own.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.processes import PortTaken, in_use, terminate

__all__ = ["Listening", "read_listening", "wait_listening"]

_ADDRESS = r"(?P<address>[^\s\"]+)"
_RECEIVER = re.compile(r"(?P<receiver>[^\s\"]+): OTLP/(?P<transport>gRPC|HTTP) listening on " + _ADDRESS)
_BRIDGE = re.compile(r"(?P<receiver>[^\s\"]+): bridge for [^\s\"]+(?:, [^\s\"]+)* on " + _ADDRESS)
_ADMIN = re.compile(r"gputally: metrics, /healthz and /readyz on https?://" + _ADDRESS)
STARTED = "gputally: pipelines "
"""The line serve writes once it has started (each worker once)."""


@dataclass
class Listening:
    """The addresses one ``gputally serve`` said it listens on, in the order it said them."""

    receivers: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    """(receiver id, ``grpc`` or ``http``) -> ``host:port`` (the bridge's transport is
    ``grpc``); with ``--workers``, one address per worker."""
    admin: list[str] = field(default_factory=list)
    """The admin endpoint's ``host:port``, one per worker."""
    started: int = 0
    """How many services (workers) said they had started."""

    def address(self, transport: str = "grpc", receiver: str | None = None) -> str:
        """The ``host:port`` of ``receiver``'s ``transport`` (of the only receiver with that
        transport when ``receiver`` is None)."""
        found = [key for key in self.receivers if key[1] == transport and receiver in (None, key[0])]
        if len(found) != 1:
            raise LookupError(f"no single {receiver or 'receiver'} listening on {transport} in {self.receivers} "
                              "(receivers say where they listen at log level info)")
        return self.receivers[found[0]][0]

    def port(self, transport: str = "grpc", receiver: str | None = None) -> int:
        return _port(self.address(transport, receiver))

    @property
    def admin_port(self) -> int:
        if not self.admin:
            raise LookupError("no admin endpoint (service.telemetry.metrics.address)")
        return _port(self.admin[0])


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def read_listening(text: str) -> Listening:
    """What serve's output ``text`` says about where it listens."""
    found = Listening()
    for line in text.splitlines():
        if STARTED in line:
            found.started += 1
        elif match := _ADMIN.search(line):
            found.admin.append(match["address"])
        elif match := _RECEIVER.search(line):
            key = (match["receiver"], match["transport"].lower())
            found.receivers.setdefault(key, []).append(match["address"])
        elif match := _BRIDGE.search(line):
            found.receivers.setdefault((match["receiver"], "grpc"), []).append(match["address"])
    return found


def wait_listening(proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0, *, workers: int = 1,
                   since: int = 0, name: str = "gputally") -> Listening:
    """Wait until ``proc`` (a ``gputally serve`` writing to ``log``, read from byte ``since``)
    has started ``workers`` services; where they listen. When it exits first or takes longer
    than ``timeout`` seconds, it is stopped and AssertionError carries the log's tail; when it
    exited because a port it was given was in use, `PortTaken` (for `start_on_ports`)."""
    deadline = time.monotonic() + timeout
    while True:
        text = _read(log, since)
        found = read_listening(text)
        if found.started >= workers:
            return found
        code = proc.poll()
        why = (f"exited with {code}" if code is not None
               else f"did not start within {timeout:g} s" if time.monotonic() > deadline else None)
        if why is not None:
            terminate(proc, 10)
            taken = in_use(log, since)
            if code is not None and taken is not None:
                raise PortTaken(f"{name} exited with {code}: {taken}")
            tail = "\n".join(_read(log, since).splitlines()[-40:])
            raise AssertionError(f"{name} {why}:\n{tail}")
        time.sleep(0.05)


def _read(log: Path, since: int) -> str:
    try:
        with log.open("rb") as file:
            file.seek(since)
            return file.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
