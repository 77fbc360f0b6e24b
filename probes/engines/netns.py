"""Connecting to an engine inside another network namespace (a pod's), from the probe.

A pod's engine often listens on 127.0.0.1 or the pod's own IP, reachable only from inside the
pod's network namespace. A socket belongs to the namespace it was *created* in, whatever thread
later connects it, so a thread that has entered the namespace (``setns(2)`` through ctypes:
Python 3.11 has no ``os.setns``) creates the socket and hands it over; the event loop connects
it and reads. That thread is the namespace's own, never a pool's: it enters once and stays
(``setns`` costs about 0.9 ms of CPU, the hand-over some microseconds), serves only requests
for that namespace, and ends when none came for ``idle_s`` or the probe stops, taking the
namespace with it. Namespaces are told apart by the inode of ``/proc/PID/ns/net``, so a pid
reused by another pod gets another thread.

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
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any

from gputally.probes.engines.model import Connect, Endpoint

__all__ = ["Namespaces", "NetnsError", "connect_in", "enter"]

_CLONE_NEWNET = 0x40000000
_Request = tuple[int, Callable[[socket.socket | BaseException], None]] | None
"""(address family, where the socket or the error goes); None: stop."""


class NetnsError(ConnectionError):
    """The probe could not get into the network namespace (privilege, or the process has gone).
    A ConnectionError, so a reader reports it as it would any failed connect."""


def _setns() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    setns = libc.setns
    setns.argtypes = (ctypes.c_int, ctypes.c_int)
    setns.restype = ctypes.c_int
    return setns


def _open(netns: str) -> int:
    try:
        return os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise NetnsError(f"cannot open {netns}: the process has gone") from exc
    except PermissionError as exc:
        raise NetnsError(f"cannot open {netns}: permission denied (the probe needs root with "
                         "CAP_SYS_PTRACE, and hostPID in a pod, to reach an engine in a pod's network)") from exc
    except OSError as exc:
        raise NetnsError(f"cannot open {netns}: {exc.strerror or exc}") from exc


def enter(netns: str, expected: tuple[int, int] | None = None) -> None:
    """Move the calling thread into the network namespace ``netns`` (a ``/proc/PID/ns/net``
    path); ``expected``: its ``(st_dev, st_ino)``, checked on the opened file. Only for a
    thread that serves that namespace alone. Raises :class:`NetnsError`."""
    fd = _open(netns)
    try:
        if expected is not None:
            stat = os.fstat(fd)
            if (stat.st_dev, stat.st_ino) != expected:
                raise NetnsError(f"{netns} is another namespace now: its process has gone")
        if _setns()(fd, _CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            if code == errno.EPERM:
                raise NetnsError(f"cannot enter the network namespace {netns}: operation not permitted (the probe "
                                 "needs CAP_SYS_ADMIN to read an engine inside a pod's network namespace)")
            raise NetnsError(f"cannot enter the network namespace {netns}: {os.strerror(code)}")
    finally:
        os.close(fd)


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


class _Worker:
    """The thread that lives in one network namespace and makes sockets there."""

    def __init__(self, netns: str, identity: tuple[int, int], *, idle_s: float,
                 retire: Callable[[_Worker, bool], bool]) -> None:
        """``retire(worker, force)``: take it off the registry (unless, without ``force``,
        a request is queued); False: it was not, go on serving."""
        self.identity = identity
        self.requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._netns, self._idle_s, self._retire = netns, idle_s, retire
        self._thread = threading.Thread(target=self._run, name=f"gputally-netns-{identity[1]}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            enter(self._netns, self.identity)
        except NetnsError as exc:
            self._retire(self, True)  # the next connect tries again, with a fresh thread
            self._drain(exc)
            return
        while True:
            try:
                request = self.requests.get(timeout=self._idle_s)
            except queue.Empty:
                if not self._retire(self, False):
                    continue  # a request came as the wait ended
                self._drain(None)
                return
            if request is None:
                self._drain(None)
                return
            family, deliver = request
            try:
                made: socket.socket | BaseException = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:
                made = exc
            deliver(made)

    def _drain(self, error: NetnsError | None) -> None:
        """Answer what is still queued (requests put before the thread left the registry, which
        new ones never reach): with the error, or with their sockets, made all the same."""
        while True:
            try:
                request = self.requests.get_nowait()
            except queue.Empty:
                return
            if request is None:
                continue
            family, deliver = request
            if error is not None:
                deliver(error)
                continue
            try:
                deliver(socket.socket(family, socket.SOCK_STREAM))
            except OSError as exc:
                deliver(exc)

    def stop(self) -> None:
        self.requests.put(None)


class Namespaces:
    """Connection openers for endpoints: from inside their network namespace where they name
    one, else directly. Owns one thread per namespace in use; :meth:`close` ends them."""

    def __init__(self, *, idle_s: float = 300.0) -> None:
        self._idle_s = idle_s
        self._workers: dict[tuple[int, int], _Worker] = {}
        self._lock = threading.Lock()

    def connect_for(self, endpoint: Endpoint) -> Connect:
        """How to reach ``endpoint``."""
        netns = endpoint.netns
        if netns is None:
            return asyncio.open_connection

        async def connect(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            return await self.connect_in(netns, host, port)

        return connect

    async def connect_in(self, netns: str, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Open a connection to ``host:port`` (an IP address) as seen from inside ``netns``."""
        try:
            stat = os.stat(netns)
        except OSError:
            _open(netns)  # raises the NetnsError that says why
            raise
        loop = asyncio.get_running_loop()
        made: asyncio.Future[socket.socket] = loop.create_future()

        def settle(result: socket.socket | BaseException) -> None:
            if made.done():  # the connect was given up on (the cycle's deadline): let the socket go
                if isinstance(result, socket.socket):
                    result.close()
            elif isinstance(result, BaseException):
                made.set_exception(result)
            else:
                made.set_result(result)

        def deliver(result: socket.socket | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(settle, result)
            except RuntimeError:  # the loop has closed
                if isinstance(result, socket.socket):
                    result.close()

        self._request(netns, (stat.st_dev, stat.st_ino), (_family(host), deliver))
        sock = await made
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, (host, port))
            return await asyncio.open_connection(sock=sock)
        except BaseException:
            sock.close()
            raise

    def _request(self, netns: str, identity: tuple[int, int], request: _Request) -> None:
        """Queue ``request`` on the namespace's thread (started if there is none), under the
        registry's lock, so a thread that retires never leaves a request unanswered."""
        with self._lock:
            worker = self._workers.get(identity)
            if worker is None:
                worker = _Worker(netns, identity, idle_s=self._idle_s, retire=self._retire)
                self._workers[identity] = worker
            worker.requests.put(request)

    def _retire(self, worker: _Worker, force: bool) -> bool:
        with self._lock:
            if not force and not worker.requests.empty():
                return False
            if self._workers.get(worker.identity) is worker:
                del self._workers[worker.identity]
            return True

    @property
    def threads(self) -> int:
        """Namespace threads alive now."""
        with self._lock:
            return len(self._workers)

    def close(self) -> None:
        with self._lock:
            workers, self._workers = list(self._workers.values()), {}
        for worker in workers:
            worker.stop()


async def connect_in(netns: str, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """One connection from inside ``netns`` by a namespace thread of its own, which ends after
    (for one-off use; a collector keeps a :class:`Namespaces`)."""
    namespaces = Namespaces(idle_s=0.001)
    try:
        return await namespaces.connect_in(netns, host, port)
    finally:
        namespaces.close()
