"""The Linux CPU scheduling policy of a serving process.

A request through ``grpc.aio`` hops between threads several times: gRPC core's event-engine
threads read the socket, its completion-queue poller thread hands each completion to the
event loop, the event loop's calls into core wake those threads again. Measured at 1,000
requests a second, that is about 24 context switches per request where the Collector has 8.
Under the default policy (``SCHED_OTHER``) each wake-up preempts the thread that woke it, so
every hop is a switch of its own. Under ``SCHED_BATCH`` a woken thread does not preempt: it
runs when the running one blocks, and several hand-offs are served in one go. It is the
policy Linux documents for non-interactive, throughput-bound work, and it takes no privilege.
"""

from __future__ import annotations

import logging
import os

__all__ = ["use_batch_scheduling"]

log = logging.getLogger(__name__)


def use_batch_scheduling() -> bool:
    """Put every thread of this process, and those they start, under ``SCHED_BATCH``; True if
    done. A process under another policy than the default (a real-time one, set by an
    operator) is left as it is, as are platforms without the policy."""
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is None or not hasattr(os, "sched_setscheduler"):
        return False
    if os.sched_getscheduler(0) != os.SCHED_OTHER:
        return os.sched_getscheduler(0) == batch
    try:
        # Threads started already (gRPC core starts its own on import) do not inherit a
        # policy set on this thread alone; threads started later inherit their creator's.
        for tid in sorted(int(t) for t in os.listdir("/proc/self/task")):
            try:
                os.sched_setscheduler(tid, batch, os.sched_param(0))
            except ProcessLookupError:  # a thread that ended since the listing
                continue
    except OSError as exc:
        log.warning("cannot use SCHED_BATCH scheduling (%s); keeping the default policy", exc)
        return False
    return True
