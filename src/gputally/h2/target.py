"""Where a gRPC client connects: a target string (``host:port``, ``dns:``, ``ipv4:``, ``ipv6:``,
``unix:``) read as gRPC core reads it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Target", "parse_target"]


@dataclass(frozen=True)
class Target:
    """Where a channel connects: a TCP host and port, or a unix socket path."""

    host: str = ""
    port: int = 0
    path: str | None = None

    @property
    def authority(self) -> str:
        if self.path is not None:
            return "localhost"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_target(target: str) -> Target:
    """A gRPC target string (``host:port``, ``dns:///host:port``, ``[::1]:port``, ``unix:path``,
    ``unix:///abs/path``, ``ipv4:addr:port``, ``ipv6:[addr]:port``); ValueError when malformed."""
    if target.startswith("unix:"):
        path = target.removeprefix("unix:")
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise ValueError(f"{target!r}: a unix target needs a path")
        return Target(path=path)
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target.removeprefix(scheme)
            break
    if target.startswith("["):
        host, _, rest = target[1:].partition("]")
        port_text = rest.removeprefix(":") if rest.startswith(":") else ""
    else:
        host, sep, port_text = target.rpartition(":")
        if not sep:
            host, port_text = target, ""
    if not host:
        raise ValueError(f"{target!r}: no host")
    if not port_text:
        return Target(host=host, port=443)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{target!r}: the port is not a number from 1 to 65535")
    return Target(host=host, port=int(port_text))
