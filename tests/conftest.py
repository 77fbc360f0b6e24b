"""Fixtures shared by the whole suite."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

import pytest
from harness.integration import mark_integration
from support.otlp import OtlpSink

pytest_plugins = [
    "harness.kube.fixtures",
    "harness.helm.fixtures",
    "harness.otelcol.fixtures",
    "harness.prometheus.fixtures",
    "harness.slurm.fixtures",
    "harness.systemd.fixtures",
    "harness.h2spec.fixtures",
]


def pytest_configure(config: pytest.Config) -> None:
    """Hold grpc.aio's process-wide state for the whole session.

    grpc.aio shuts its poller thread down when the last aio object is freed, and joins it.
    The suite runs many event loops one after another; when the last channel of a closed
    loop is collected by the garbage collector in some later test, that join can wait forever
    on a poller stuck writing to the closed loop's wake-up socket (grpc/grpc#22365, #40989;
    seen here as a hang in an unrelated hypothesis test). One reference taken here, from the
    main thread before any test, keeps the count above zero, so the shutdown never runs
    mid-session; the poller is a daemon thread and ends with the process.
    """
    del config
    from grpc.experimental.aio import init_grpc_aio

    init_grpc_aio()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that need a server built by ``make harness`` as ``integration``, so
    ``pytest -m "not integration"`` is a quick run (see harness/integration.py)."""
    mark_integration(items)


@pytest.fixture
async def otlp_sink() -> AsyncIterator[OtlpSink]:
    sink = OtlpSink()
    await sink.start()
    yield sink
    await sink.stop()


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """Give every test the logging setup it started with: a CLI called in-process (probe,
    serve, report) replaces the root handlers with one bound to that test's captured stderr,
    which a later test's log records would hit after it was closed."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
