"""pytest plugin: the otelcol built by ``tests/harness/otelcol/build.sh``.

Register it with ``pytest_plugins = ["harness.otelcol.fixtures"]``. Without a built binary the
fixtures *fail* (they never skip), naming the build script: the end-to-end tests with a real
collector must not pass vacuously in CI.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.otelcol.collector import HarnessError, Otelcol, locate_binary


@pytest.fixture(scope="session")
def otelcol_binary() -> Path:
    """The otelcol-gputally-test binary (fails, naming build.sh, when it is not built)."""
    try:
        return locate_binary()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def otelcol(otelcol_binary: Path, tmp_path: Path) -> Iterator[Callable[..., Otelcol]]:
    """A factory: ``otelcol(config, wait_for=port, name="front")`` starts a collector that
    is stopped (by pid) at the end of the test."""
    started: list[Otelcol] = []

    def start(config: dict[str, Any], wait_for: int | None = None, name: str = "otelcol") -> Otelcol:
        collector = Otelcol(otelcol_binary, config, tmp_path / name, name=name)
        started.append(collector)
        try:
            collector.start(wait_for)
        except HarnessError as exc:
            pytest.fail(str(exc), pytrace=False)
        return collector

    yield start
    for collector in reversed(started):
        collector.stop()
