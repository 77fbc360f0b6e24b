"""Where a ``gputally serve`` listens, read from what it writes when it starts.

A tool that starts ``serve`` (the demo, the tests) gives it port 0 and reads the ports back,
rather than picking a free one that something else may take before serve binds it. serve says
each address it bound, the port resolved: every receiver logs one line at ``info`` (``otlp:
OTLP/gRPC listening on 127.0.0.1:41235``, ``otlp: OTLP/HTTP listening on ...``, ``bridge:
bridge for metrics/bridge on ...``), console or JSON, and serve then writes, whatever the log
level, the admin endpoint's (``gputally: metrics, /healthz and /readyz on http://...``) and
``gputally: pipelines ...``, its last word on starting. With ``--workers`` each worker writes
its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["STARTED", "Listening", "read_listening"]

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
