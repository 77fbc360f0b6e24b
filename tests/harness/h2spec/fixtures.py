"""pytest plugin: the h2spec built by ``tests/harness/h2spec/build.sh``.

Register it with ``pytest_plugins = ["harness.h2spec.fixtures"]``. Without a built h2spec the
fixture *fails* (it never skips), naming the build script: the conformance test must not
pass vacuously in CI.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.h2spec.tool import HarnessError, locate


@pytest.fixture(scope="session")
def h2spec() -> Path:
    """The h2spec binary (fails, naming build.sh, when it is not built)."""
    try:
        return locate()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
