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

from harness.otelcol.collector import HarnessError, Otelcol, locate_binary, start_otelcol
from harness.processes import Ports, PortTaken


@pytest.fixture(scope="session")
def otelcol_binary() -> Path:
    """The otelcol-gputally-test binary (fails, naming build.sh, when it is not built)."""
    try:
        return locate_binary()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def otelcol(otelcol_binary: Path, tmp_path: Path) -> Iterator[Callable[..., Otelcol]]:
    """A factory: ``otelcol(config, name="front")`` starts a collector, ready, that is stopped
    (by pid) at the end of the test. ``config`` is a mapping (its OTLP receivers on port 0:
    ``collector.port("otlp")`` says where they listen) or a function of the `Ports` for
    listeners that cannot take port 0 (`harness.otelcol.collector.start_otelcol`); with
    ``ports=`` it starts once on those and raises `PortTaken` for the caller's own retry."""
    started: list[Otelcol] = []

    def start(config: dict[str, Any] | Callable[[Ports], dict[str, Any]], name: str = "otelcol", *,
              ports: Ports | None = None) -> Otelcol:
        try:
            collector = start_otelcol(otelcol_binary, config, tmp_path / name, name=name, ports=ports)
        except PortTaken as exc:
            if ports is not None:
                raise
            pytest.fail(str(exc), pytrace=False)
        except HarnessError as exc:
            pytest.fail(str(exc), pytrace=False)
        started.append(collector)
        return collector

    yield start
    for collector in reversed(started):
        collector.stop()
