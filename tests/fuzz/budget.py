"""How much each fuzz target runs, and the count of cases that did.

``make test`` runs the default budget (about a minute in all on two cores). A longer run on
demand: ``GPUTALLY_FUZZ_SCALE=13 pytest tests/fuzz`` (or ``bench/fuzz.py``) multiplies every
target's examples; at 13 the targets together run over 100,000 cases. The cases each
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

__all__ = ["CASES", "bounded_memory", "case", "fuzz_settings", "scale"]

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

CASE_MEMORY_LIMIT_MIB = 64
"""Most one case may raise the process's peak memory (an alias bomb, a zip bomb or an
unbounded read would blow far past it)."""
TARGET_MEMORY_LIMIT_MIB = 128
"""Most a whole target may raise the peak, on top of Hypothesis's own bookkeeping."""
HYPOTHESIS_KIB_PER_CASE = 32
"""Hypothesis remembers what it has explored: measured at about 17 KiB per case (262 MiB over
15,000 cgroup cases with or without the parser), allowed 32."""

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


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


@contextmanager
def case(target: str) -> Iterator[None]:
    """One case of ``target``: counted, and how far it raised the peak memory bounded."""
    CASES[target] += 1
    before = _peak_mib()
    yield
    grown = _peak_mib() - before
    assert grown < CASE_MEMORY_LIMIT_MIB, f"{target}: one case raised peak memory by {grown:.0f} MiB"


@contextmanager
def bounded_memory(target: str) -> Iterator[None]:
    """The whole target raises the peak by at most TARGET_MEMORY_LIMIT_MIB beyond what
    Hypothesis's bookkeeping takes for the cases it ran."""
    before, cases = _peak_mib(), CASES[target]
    yield
    ran = CASES[target] - cases
    allowed = TARGET_MEMORY_LIMIT_MIB + ran * HYPOTHESIS_KIB_PER_CASE / 1024
    grown = _peak_mib() - before
    assert grown < allowed, f"{target}: peak memory grew by {grown:.0f} MiB over {ran} cases (allowed {allowed:.0f})"
