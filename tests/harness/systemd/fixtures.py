"""pytest plugin: the systemd-analyze that ``tests/harness/systemd/setup.sh`` installs.

Register it with ``pytest_plugins = ["harness.systemd.fixtures"]``. Without the program the
fixture *fails* (it never skips), naming the setup script: the unit files' checks must not
pass vacuously in CI.
"""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def systemd_analyze() -> str:
    """The path of systemd-analyze (fails, naming setup.sh, when it is not installed)."""
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.fail("systemd-analyze is not on PATH: run tests/harness/systemd/setup.sh (Debian package systemd)",
                    pytrace=False)
    return path
