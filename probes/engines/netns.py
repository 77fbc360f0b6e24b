"""Connecting to an engine inside another network namespace (a pod's), from the probe.

A pod's engine often listens on 127.0.0.1 or the pod's own IP, reachable only from inside the
pod's network namespace. A socket belongs to the namespace it was *created* in, whatever thread
later connects it, so a short-lived thread enters the namespace (``setns(2)`` through ctypes:
Python 3.11 has no ``os.setns``), creates the socket and ends; the event loop connects it and
reads. The thread is never a pool's: a thread left in a foreign namespace must not serve
anything else, and one that ends takes its namespace with it.

Entering another network namespace needs CAP_SYS_ADMIN (root on the node, or the capability in
a privileged pod) and a readable ``/proc/PID/ns/net`` (hostPID, CAP_SYS_PTRACE for another
user's process): without them the connect fails with a :class:`NetnsError` that says so.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import os
import socket
import threading
from typing import Any

from gputally.probes.engines.model import Connect, Endpoint

__all__ = ["NetnsError", "connect_in", "connect_for", "socket_in"]

_CLONE_NEWNET = 0x40000000


class NetnsError(ConnectionError):
    """The probe could not get into the network namespace (privilege, or the process has gone).
    A ConnectionError, so a reader reports it as it would any failed connect."""


def _setns() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    setns = libc.setns
    setns.argtypes = (ctypes.c_int, ctypes.c_int)
    setns.restype = ctypes.c_int
    return setns


def socket_in(netns: str, family: int) -> socket.socket:
    """A TCP socket created in the network namespace ``netns`` (a ``/proc/PID/ns/net`` path).

    Blocking, and run in the calling thread: only for a thread that ends afterwards (as
    :func:`connect_in`'s does). Raises :class:`NetnsError`."""
    try:
        fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise NetnsError(f"cannot open {netns}: the process has gone") from exc
    except PermissionError as exc:
        raise NetnsError(f"cannot open {netns}: permission denied (the probe needs root with "
                         "CAP_SYS_PTRACE, and hostPID in a pod, to reach an engine in a pod's network)") from exc
    except OSError as exc:
        raise NetnsError(f"cannot open {netns}: {exc.strerror or exc}") from exc
    try:
        if _setns()(fd, _CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            if code == errno.EPERM:
                raise NetnsError(f"cannot enter the network namespace {netns}: operation not permitted (the probe "
                                 "needs CAP_SYS_ADMIN to read an engine inside a pod's network namespace)")
            raise NetnsError(f"cannot enter the network namespace {netns}: {os.strerror(code)}")
    finally:
        os.close(fd)
    return socket.socket(family, socket.SOCK_STREAM)


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


async def connect_in(netns: str, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a connection to ``host:port`` (an IP address) as seen from inside ``netns``."""
    loop = asyncio.get_running_loop()
    made: asyncio.Future[socket.socket] = loop.create_future()

    def deliver(result: socket.socket | BaseException) -> None:
        if made.done():  # the connect was given up on (the cycle's deadline): let the socket go
            if isinstance(result, socket.socket):
                result.close()
            return
        if isinstance(result, BaseException):
            made.set_exception(result)
        else:
            made.set_result(result)

    def enter() -> None:
        try:
            result: socket.socket | BaseException = socket_in(netns, _family(host))
        except BaseException as exc:  # handed to the waiting coroutine
            result = exc
        try:
            loop.call_soon_threadsafe(deliver, result)
        except RuntimeError:  # the loop has closed
            if isinstance(result, socket.socket):
                result.close()

    threading.Thread(target=enter, name=f"gputally-netns-{port}", daemon=True).start()
    sock = await made
    try:
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, port))
        return await asyncio.open_connection(sock=sock)
    except BaseException:
        sock.close()
        raise


def connect_for(endpoint: Endpoint) -> Connect:
    """How to reach ``endpoint``: from inside its namespace when it names one, else directly."""
    netns = endpoint.netns
    if netns is None:
        return asyncio.open_connection

    async def connect(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await connect_in(netns, host, port)

    return connect
