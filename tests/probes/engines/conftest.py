"""The ``servers`` fixture: real HTTP servers on loopback, stopped after each test (wire.py);
and ``pod``, a pod-shaped cgroup removed after each test (pods.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.probes.engines.pods import pod  # noqa: F401 - a pod-shaped cgroup, for the tests here
from tests.probes.engines.wire import Servers


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    found = Servers()
    try:
        yield found
    finally:
        await found.close()
