"""The ``servers`` fixture: real HTTP servers on loopback, stopped after each test (wire.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.probes.engines.wire import Servers


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    found = Servers()
    try:
        yield found
    finally:
        await found.close()
