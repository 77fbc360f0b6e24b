"""Where a server listens: ``host:port`` (IPv6 in brackets) or ``unix:///path``, checked in config."""

from __future__ import annotations

import re

__all__ = ["check_endpoint", "split_endpoint"]

_HOST_PORT = re.compile(r"^(?:\[(?P<ipv6>[0-9A-Fa-f:.%\w]+)\]|(?P<host>[^:\[\]\s]*)):(?P<port>\d{1,5})$")


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``(host, port)`` of a ``host:port`` endpoint; an empty host means every interface.

    IPv6 hosts are written in brackets (``[::1]:4317``), as in Go and gRPC.
    """
    match = _HOST_PORT.match(endpoint)
    if match is None:
        raise ValueError(
            f"{endpoint!r} is not host:port (for example 'localhost:4317', '0.0.0.0:4317' or '[::1]:4317')"
        )
    port = int(match["port"])
    if port > 65535:
        raise ValueError(f"{endpoint!r}: port {port} is above 65535")
    return match["ipv6"] or match["host"], port


def check_endpoint(value: str, *, allow_unix: bool) -> str:
    """``value`` stripped, or ValueError saying what a listening endpoint looks like."""
    value = value.strip()
    if allow_unix and value.startswith("unix:"):
        if not value.removeprefix("unix:").lstrip("/"):
            raise ValueError(f"{value!r}: a unix socket endpoint needs a path, as in 'unix:///run/gputally/otlp.sock'")
        return value
    split_endpoint(value)
    return value
