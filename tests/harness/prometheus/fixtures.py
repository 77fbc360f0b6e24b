"""pytest plugin: the Prometheus and promtool built by ``tests/harness/prometheus/build.sh``.

Register it with ``pytest_plugins = ["harness.prometheus.fixtures"]``. Without a built binary
the fixtures *fail* (they never skip), naming the build script: tests of alert rules and of
the OTLP -> Prometheus path must not pass vacuously in CI.
"""

from __future__ import annotations

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


@pytest.fixture
def prometheus(prometheus_binaries: Binaries, tmp_path: Path) -> Iterator[Prometheus]:
    """A started Prometheus with the OTLP receiver and gputally's promoted resource
    attributes (`harness.prometheus.server.default_config`), stopped (by pid) after the test."""
    server = Prometheus(prometheus_binaries.prometheus, tmp_path / "prometheus")
    try:
        server.start()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()
