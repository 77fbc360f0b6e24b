"""Listening-address helpers: bind-address strings and plain-words reasons for bind failures."""

from __future__ import annotations

import contextlib
import errno
import socket

__all__ = ["bind_problem", "describe_bind_error", "host_port"]


def host_port(host: str, port: int) -> str:
    """``host:port`` with IPv6 hosts bracketed; an empty host (every interface) as ``[::]``."""
    if not host:
        host = "::"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def describe_bind_error(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "address in use"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "address not available on this host"
    return exc.strerror or str(exc)


def bind_problem(host: str, port: int) -> str:
    """Why binding ``host:port`` fails, found by trying it ourselves.

    gRPC core reports only "Failed to bind" to Python (the reason goes to its own log), yet
    an operator needs to know whether the port is taken, privileged or the host unknown.
    """
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve host {host!r}: {exc.strerror}"
    for family, kind, proto, _, address in infos:
        with contextlib.closing(socket.socket(family, kind, proto)) as sock:
            # As gRPC does, so a port lingering in TIME_WAIT is not mistaken for a taken one.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                return describe_bind_error(exc)
    return "cannot bind (set GRPC_VERBOSITY=debug for gRPC's own report)"
