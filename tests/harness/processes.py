"""What every harness does with the processes it starts: pick a free loopback port, wait until
a process listens, and stop it by pid."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time

__all__ = ["free_port", "terminate", "wait_for_port"]


_HANDED_OUT: set[int] = set()
"""Ports this process has handed out: a port is only taken once its server binds it, so
without this two servers set up before either starts could be given the same one (seen: an
otelcol's gRPC port answered by another server's HTTP endpoint)."""


def free_port() -> int:
    """A loopback TCP port nothing listens on now, never handed out before in this process."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def wait_for_port(proc: subprocess.Popen[bytes], host: str, port: int, timeout: float) -> str | None:
    """Wait until ``host:port`` accepts TCP connections: None, or why not (the process exited,
    or ``timeout`` seconds passed) for the caller's error, which adds the process's log."""
    deadline = time.monotonic() + timeout
    while True:
        code = proc.poll()
        if code is not None:
            return f"exited with {code} before {host}:{port} answered"
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return None
        except OSError:
            pass
        if time.monotonic() > deadline:
            return f"did not listen on {host}:{port} within {timeout:g} s"
        time.sleep(0.05)


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
