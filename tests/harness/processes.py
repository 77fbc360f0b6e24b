"""What every harness does with the processes and ports it uses.

A server of our own (gputally, a stand-in, a sink) binds port 0 and says which port it got;
nothing here picks a port for it. What is here is for the other cases (README.md says which
server is which):

* `unused_port`: a port held for a backend that is down, or that comes up later on it;
  `hold_port`: the same for the port a server has, across its restart;
* `start_on_ports`: an external server that must be told its ports before it starts, started
  again on other ports when another process took one of them first;
* `wait_for_port` and `terminate`: wait until a process listens, and stop it by pid.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil

__all__ = ["PortTaken", "Ports", "hold_port", "in_use", "log_since", "start_on_ports", "terminate", "unused_port",
           "wait_for_port"]

T = TypeVar("T")

_HELD: dict[int, socket.socket] = {}
"""The sockets that hold `hold_port`'s ports, open until this process exits."""

_PICKED: set[int] = set()
"""Ports `Ports` has picked in this process: a picked port is only taken once its server
binds it, so without this two servers set up before either starts could be given the same one
(seen: an otelcol's gRPC port answered by another server's HTTP endpoint)."""

IN_USE = ("address already in use", "address in use", "eaddrinuse")
"""What a process's log says when a port it was told was taken (Go, C and Python's strerror;
gputally's own config error says ``address in use``)."""


def unused_port() -> int:
    """A loopback port for a backend that is down: nothing listens on it, and nothing else can.

    The port is bound here and never listens, for as long as this process runs: a connection
    to it is refused, no other process can bind it, and the kernel hands it to no one asking
    for port 0. A test whose backend comes up later on this port (a sink that starts after
    the exporter) starts it with SO_REUSEPORT, which is allowed beside this socket: grpcio's
    servers set it by default; aiohttp's and asyncio's take ``reuse_port=True``, ``gputally
    serve --workers`` sets it. Stopped again, the server leaves the port held.
    """
    return hold_port(0)


def hold_port(port: int) -> int:
    """Hold loopback ``port`` as `unused_port` holds its own (0: a port the kernel picks); the
    port. For a server that listens with SO_REUSEPORT and restarts on the port it had
    (llama-server with ``--reuse-port``): held beside it, the port stays the test's while the
    server is down."""
    if port in _HELD:
        return port
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    port = int(sock.getsockname()[1])
    _HELD[port] = sock
    return port


class PortTaken(Exception):
    """A process could not have a port it was told: another process had bound it first.
    The process has been stopped."""


class Ports:
    """The ports of one start of an external server, by name: ``ports["grpc"]`` picks a port
    the first time it is asked for and gives the same one after. A picked port had nothing
    bound to it a moment ago; another process may bind it before the server does, which
    `start_on_ports` answers with new ports."""

    def __init__(self) -> None:
        self._picked: dict[str, int] = {}

    def __getitem__(self, name: str) -> int:
        if name not in self._picked:
            self._picked[name] = _pick()
        return self._picked[name]

    def __repr__(self) -> str:
        return f"Ports({self._picked})"


def _pick() -> int:
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _PICKED and port not in _HELD:
            _PICKED.add(port)
            return port


def start_on_ports(start: Callable[[Ports], T], *, what: str, attempts: int = 5) -> T:
    """``start(ports)`` with new `Ports` until it does not raise `PortTaken`: for a server
    that must be told its ports before it starts and cannot say which one it got from port 0.

    ``start`` takes the ports it needs from ``ports``, starts the process and waits until it
    listens (`wait_for_port` with the process's log raises `PortTaken`); it returns what the
    caller gets. After ``attempts`` starts that each lost a port, `PortTaken` says so.
    """
    failures: list[str] = []
    for _ in range(attempts):
        ports = Ports()
        try:
            return start(ports)
        except PortTaken as exc:
            failures.append(f"{ports}: {exc}")
    raise PortTaken(f"{what}: a port was taken on each of {attempts} starts:\n" + "\n".join(failures))


def wait_for_port(proc: subprocess.Popen[bytes], host: str, port: int, timeout: float, *,
                  log: Path | None = None, since: int = 0) -> str | None:
    """Wait until ``host:port`` accepts TCP connections from ``proc``: None, or why not (it
    exited, or ``timeout`` seconds passed) for the caller's error, which adds the log.

    With ``log`` (the process's output, from byte ``since``) a port taken by another process
    raises `PortTaken` after stopping ``proc``: the process exited saying its address is in
    use, or the port answered from another process's socket while ``proc`` had not bound it.
    """
    deadline = time.monotonic() + timeout
    while True:
        code = proc.poll()
        if code is not None:
            taken = in_use(log, since) if log is not None else None
            if taken is not None:
                raise PortTaken(f"exited with {code}: {taken}")
            return f"exited with {code} before {host}:{port} answered"
        try:
            with socket.create_connection((host, port), timeout=0.5):
                pass
        except OSError:
            pass
        else:
            others = _other_listeners(proc, host, port) if log is not None else set()
            if not others:
                return None
            terminate(proc, 10)
            raise PortTaken(f"{host}:{port} is another process's (pid {', '.join(map(str, sorted(others)))})")
        if time.monotonic() > deadline:
            return f"did not listen on {host}:{port} within {timeout:g} s"
        time.sleep(0.05)


def in_use(log: Path, since: int = 0, *, phrases: tuple[str, ...] = IN_USE) -> str | None:
    """The line of ``log`` (from byte ``since``) that says an address was already in use, if
    any: one holding one of ``phrases`` (lower case)."""
    text = log_since(log, since)
    return next((line.strip() for line in text.splitlines() if any(s in line.lower() for s in phrases)), None)


def log_since(log: Path, since: int = 0) -> str:
    """What a process wrote to ``log`` from byte ``since`` on ("" while there is no log)."""
    try:
        with log.open("rb") as file:
            file.seek(since)
            return file.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def _other_listeners(proc: subprocess.Popen[bytes], host: str, port: int) -> set[int | str]:
    """Who else listens on ``host:port`` (or the wildcard address): pids outside ``proc``'s
    process tree (``"?"`` for a socket whose process this user cannot see). Empty when only
    ``proc`` (or a child of it) does."""
    addresses = {host, f"::ffff:{host}", "0.0.0.0", "::"}
    try:
        ours = {proc.pid, *(child.pid for child in psutil.Process(proc.pid).children(recursive=True))}
    except psutil.NoSuchProcess:
        ours = {proc.pid}
    return {
        "?" if conn.pid is None else conn.pid
        for conn in psutil.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
        and conn.laddr.ip in addresses and conn.pid not in ours
    }


def terminate(proc: subprocess.Popen[bytes], grace: float) -> int | None:
    """SIGTERM by pid (the process drains), SIGKILL after ``grace`` seconds; the exit code.
    A process that has already exited is left alone."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(grace)
    return proc.returncode
