"""Binding a server to a configured endpoint, with a config error that says why it failed."""

from __future__ import annotations

import os
import socket
from typing import Protocol

from gputally.errors import ConfigError

from .address import split_endpoint
from .net import describe_bind_error, host_port

__all__ = ["SOCKET_MODE", "Listener", "listen"]

SOCKET_MODE = 0o660
"""A unix socket's mode once bound: its owner and group may connect (connecting needs write
permission), others not, whatever the umask. A client in another container of a Kubernetes
pod (the Collector beside gputally, a shared emptyDir) connects through the pod's ``fsGroup``,
which owns the volume and so the socket."""


class Listener(Protocol):
    """A server that binds TCP or a unix socket (:class:`gputally.h2.Server`)."""

    async def listen_tcp(self, host: str, port: int) -> int: ...

    async def listen_unix(self, path: str) -> None: ...


async def listen(server: Listener, endpoint: str, *, where: str) -> str:
    """Bind ``server`` to ``endpoint`` (``host:port`` or ``unix:///path``, as config checked
    it) and return the address it listens on; a failure raises ConfigError naming ``where``
    (what is being bound, e.g. ``receivers::otlp: grpc endpoint``) and the reason in plain words."""
    if endpoint.startswith("unix:"):
        path = endpoint.removeprefix("unix:")
        path = path[2:] if path.startswith("//") else path  # unix:///abs/path, as gRPC targets write it
        try:
            await server.listen_unix(path)
            os.chmod(path, SOCKET_MODE)
        except OSError as exc:
            raise ConfigError(
                f"{where} {endpoint}: cannot bind the unix socket ({describe_bind_error(exc)}; does its "
                "directory exist, and may gputally write there?)"
            ) from exc
        return endpoint
    host, port = split_endpoint(endpoint)
    try:
        bound = await server.listen_tcp(host, port)
    except socket.gaierror as exc:
        raise ConfigError(f"{where} {endpoint}: cannot resolve host {host!r}: {exc.strerror}") from exc
    except OSError as exc:
        raise ConfigError(f"{where} {endpoint}: {describe_bind_error(exc)}") from exc
    return host_port(host, bound)
