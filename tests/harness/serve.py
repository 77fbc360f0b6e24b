"""Waiting for a ``gputally serve`` process to start, and where it listens.

Tests configure ``127.0.0.1:0`` and read the ports back from what serve writes when it starts
(:mod:`gputally.util.listening`, which the demo reads the same way).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from gputally.util.listening import STARTED, Listening, read_listening
from harness.processes import PortTaken, in_use, log_since, terminate

__all__ = ["STARTED", "Listening", "read_listening", "wait_listening"]


def wait_listening(proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0, *, workers: int = 1,
                   since: int = 0, name: str = "gputally") -> Listening:
    """Wait until ``proc`` (a ``gputally serve`` writing to ``log``, read from byte ``since``)
    has started ``workers`` services; where they listen. When it exits first or takes longer
    than ``timeout`` seconds, it is stopped and AssertionError carries the log's tail; when it
    exited because a port it was given was in use, `PortTaken` (for `start_on_ports`)."""
    deadline = time.monotonic() + timeout
    while True:
        text = log_since(log, since)
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
            tail = "\n".join(log_since(log, since).splitlines()[-40:])
            raise AssertionError(f"{name} {why}:\n{tail}")
        time.sleep(0.05)
