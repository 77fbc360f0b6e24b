"""How much each fuzz target runs, and the count of cases that did.

``make test`` runs the default budget (about a minute in all on two cores). A longer run on
demand: ``GPUTALLY_FUZZ_SCALE=25 pytest tests/fuzz`` (or ``bench/fuzz.py``) multiplies every
target's examples; at 25 the targets together run well over 100,000 cases. The cases each
target ran are printed at the end of the session and, with ``GPUTALLY_FUZZ_REPORT=FILE``,
written there as JSON.
"""

from __future__ import annotations

import os
import resource
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, settings

__all__ = ["CASES", "MEMORY_LIMIT_MIB", "bounded_memory", "counted", "fuzz_settings", "scale"]

F = TypeVar("F", bound=Callable[..., Any])

CASES: Counter[str] = Counter()
"""Cases run per target in this session."""

DEFAULT_EXAMPLES = {
    "otlp_protobuf": 1500,
    "otlp_json": 1000,
    "otlp_http_server": 150,
    "otlp_grpc_server": 150,
    "config": 600,
    "cgroup": 4000,
    "replay": 400,
}
"""Examples per target in ``make test``: chosen so the suite takes about a minute on 2 cores."""

MEMORY_LIMIT_MIB = 256
"""Most the process's peak memory may grow while one target runs."""

DEADLINE_MS = 2000
"""Longest one case may take: anything slower is reported as a hang."""


def scale() -> float:
    return float(os.environ.get("GPUTALLY_FUZZ_SCALE", "1"))


def fuzz_settings(target: str) -> settings:
    """Hypothesis settings for ``target``: its budget, a per-case deadline, no flaky reruns.

    The default run is derandomized (the same cases every time, so ``make test`` is
    reproducible); a scaled run explores new ones and keeps failures in ``.hypothesis/``.
    """
    long = scale() != 1
    return settings(
        max_examples=max(1, int(DEFAULT_EXAMPLES[target] * scale())),
        deadline=DEADLINE_MS,
        derandomize=not long,
        database=settings.default.database if long else None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                               HealthCheck.large_base_example],
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
        print_blob=True,
    )


def counted(target: str) -> None:
    CASES[target] += 1


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


@contextmanager
def bounded_memory(target: str) -> Iterator[None]:
    """Fail when the process's peak memory grows by more than MEMORY_LIMIT_MIB in the block."""
    before = _peak_mib()
    yield
    grown = _peak_mib() - before
    assert grown < MEMORY_LIMIT_MIB, f"{target}: peak memory grew by {grown:.0f} MiB over {CASES[target]} cases"
