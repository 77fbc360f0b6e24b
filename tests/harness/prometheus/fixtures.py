"""pytest plugin: the Prometheus and promtool built by ``tests/harness/prometheus/build.sh``.

Register it with ``pytest_plugins = ["harness.prometheus.fixtures"]``. Without a built binary
the fixtures *fail* (they never skip), naming the build script: tests of alert rules and of
the OTLP -> Prometheus path must not pass vacuously in CI.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.prometheus.server import Binaries, HarnessError, Prometheus, locate_binaries


@pytest.fixture(scope="session")
def prometheus_binaries() -> Binaries:
    """Both binaries (fails, naming build.sh, when they are not built)."""
    try:
        return locate_binaries()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def promtool(prometheus_binaries: Binaries) -> Path:
    return prometheus_binaries.promtool


@contextlib.contextmanager
def started_prometheus(binaries: Binaries, directory: Path) -> Iterator[Prometheus]:
    """A started Prometheus with the OTLP receiver and gputally's promoted resource attributes
    (`harness.prometheus.server.default_config`), its data in ``directory``; the test fails
    when it cannot start, and it is stopped (by pid) on leaving. For fixtures of any scope."""
    server = Prometheus(binaries.prometheus, directory)
    try:
        server.start()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def prometheus(prometheus_binaries: Binaries, tmp_path: Path) -> Iterator[Prometheus]:
    """:func:`started_prometheus` for one test."""
    with started_prometheus(prometheus_binaries, tmp_path / "prometheus") as server:
        yield server
