"""SCHED_BATCH for serving processes: every thread, those started before and after."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")

_PROBE = textwrap.dedent("""
    import os, threading
    from gputally.util.scheduling import use_batch_scheduling

    def policy_of_a_new_thread():
        seen = []
        thread = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0)))
        thread.start(); thread.join()
        return seen[0]

    gate = threading.Event()
    started = []
    early = threading.Thread(target=lambda: (started.append(threading.get_native_id()), gate.wait()))
    early.start()
    while not started:
        pass
    done = use_batch_scheduling()
    print(done, os.sched_getscheduler(0) == os.SCHED_BATCH,
          os.sched_getscheduler(started[0]) == os.SCHED_BATCH, policy_of_a_new_thread() == os.SCHED_BATCH)
    gate.set()
""")


def _run(prefix: list[str]) -> list[str]:
    out = subprocess.run([*prefix, sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_every_thread_of_the_process_is_batch() -> None:
    """The thread that asks, a thread started before it asked, and one started after."""
    assert _run([]) == ["True", "True", "True", "True"]


def test_a_policy_set_by_the_operator_is_kept() -> None:
    """Under SCHED_IDLE (any policy but the default, without privilege) nothing is changed."""
    assert _run(["chrt", "--idle", "0"]) == ["False", "False", "False", "False"]
