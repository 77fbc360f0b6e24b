"""The ledger's file written and read off the event loop, so a slow disk stalls no connection.

``emit()`` runs on the loop that also serves gRPC. Saving there (``json.dump`` and ``fsync``)
made every emit wait on the disk: a network volume that hangs for seconds held up every
Export for as long. Here the loop only takes a snapshot (plain data, copied) and hands it to
one worker thread, which writes the newest snapshot it has and drops any older one still
waiting: the file is replaced atomically anyway, so only the latest state matters.

A save that fails, or runs past its deadline, marks the processor degraded (``/readyz``),
with one WARNING when that starts and one INFO when a save succeeds again; each outcome is
counted (``gputally_usage_state_saves_total``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .storage import LedgerFile

__all__ = ["StateSaver"]

log = logging.getLogger(__name__)


class StateSaver:
    """Writes one processor's snapshots in a thread of its own, the newest first."""

    def __init__(
        self, file: LedgerFile, *, name: str, deadline: float, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.file = file
        self.name = name
        self.deadline = deadline
        """Seconds a save may take before the processor reports itself degraded."""
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._pending: dict[str, Any] | None = None
        self._writing_since: float | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._error: str | None = None
        self.saved = 0
        self.failed = 0
        self.last_seconds = 0.0

    def submit(self, state: dict[str, Any]) -> None:
        """Write ``state`` soon; returns at once. A snapshot still waiting is replaced."""
        with self._lock:
            self._pending = state
            if not self._idle.is_set():
                return
            self._idle.clear()
        # A daemon thread, not a pool's: a write hung on a dead disk must not hold up the exit.
        threading.Thread(target=self._drain, name=f"usage-save-{self.name}", daemon=True).start()

    def wait(self, timeout: float) -> bool:
        """Block until every submitted snapshot is written (or failed); False past ``timeout``."""
        return self._idle.wait(timeout)

    def degraded(self) -> str | None:
        with self._lock:
            error, since = self._error, self._writing_since
        if error is not None:
            return f"usage state not saved to {self.file.path}: {error}"
        if since is not None and (took := self._monotonic() - since) > self.deadline:
            return f"saving usage state to {self.file.path} has taken {took:.0f} s (deadline {self.deadline:.0f} s)"
        return None

    def _drain(self) -> None:
        while True:
            with self._lock:
                state, self._pending = self._pending, None
                if state is None:
                    self._writing_since = None
                    self._idle.set()
                    return
                started = self._writing_since = self._monotonic()
            try:
                self.file.write(state)
            except (OSError, TypeError, ValueError) as exc:  # the disk, or a value JSON cannot hold
                self._failed(exc)
            else:
                self._succeeded()
            self.last_seconds = self._monotonic() - started

    def _failed(self, exc: Exception) -> None:
        reason = getattr(exc, "strerror", None) or str(exc)
        with self._lock:
            first, self._error = self._error is None, reason
            self.failed += 1
        if first:
            log.warning("%s: cannot save usage state to %s: %s (counting goes on in memory; "
                        "the processor reports degraded until a save succeeds)", self.name, self.file.path, reason)

    def _succeeded(self) -> None:
        with self._lock:
            recovered, self._error = self._error is not None, None
            self.saved += 1
        if recovered:
            log.info("%s: usage state saved to %s again", self.name, self.file.path)
