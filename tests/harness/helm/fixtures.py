"""pytest plugin: the helm built by ``tests/harness/helm/build.sh``.

Register it with ``pytest_plugins = ["harness.helm.fixtures"]``. Without a built helm the
fixture *fails* (it never skips), naming the build script: the chart's tests must not pass
vacuously in CI.
"""

from __future__ import annotations

import pytest

from harness.helm.tool import HarnessError, Helm, locate


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm and the Prometheus Operator CRDs (fails, naming build.sh, when they are not built)."""
    try:
        return locate(tmp_path_factory.mktemp("helm-home"))
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
