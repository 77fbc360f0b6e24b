"""The ``integration`` marker follows what a test uses (tests/harness/integration.py): checked
on a small suite collected by a pytest of its own, so nothing here starts a server."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CONFTEST = """
pytest_plugins = ["harness.kube.fixtures"]

from harness.integration import mark_integration


def pytest_collection_modifyitems(items):
    mark_integration(items)
"""

SUITE = """
from __future__ import annotations

import pytest

from harness.kube.cluster import KubeCluster
from harness.processes import unused_port
from harness.prometheus import otlp


@pytest.fixture
def namespace_name(kube_namespace):
    return kube_namespace


@pytest.fixture
def own_cluster():
    with KubeCluster() as cluster:
        yield cluster


def test_plain(tmp_path):
    pass


def test_annotation_only(cluster: KubeCluster | None = None):
    pass


def test_unused_port_is_no_server():
    unused_port()


def test_otlp_request_in_memory():
    otlp.request


def test_harness_fixture(kube_cluster):
    pass


def test_harness_fixture_through_a_local_one(namespace_name):
    pass


def test_local_fixture_that_starts_a_server(own_cluster):
    pass


def test_starts_a_server_itself():
    KubeCluster


def test_starts_a_server_in_a_nested_function():
    (lambda: KubeCluster)()


@pytest.mark.parametrize("n", [1, 2])
def test_each_parameter(n, kube_admin):
    pass
"""


def collected(directory: Path, *args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=directory, env={**os.environ, "PYTHONPATH": str(TESTS)}, capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sorted(line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line)


def test_a_test_is_integration_when_it_or_a_fixture_it_uses_touches_a_harness(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(SUITE))

    assert collected(tmp_path, "-m", "integration") == [
        "test_each_parameter[1]",
        "test_each_parameter[2]",
        "test_harness_fixture",
        "test_harness_fixture_through_a_local_one",
        "test_local_fixture_that_starts_a_server",
        "test_starts_a_server_in_a_nested_function",
        "test_starts_a_server_itself",
    ]
    assert collected(tmp_path, "-m", "not integration") == [
        "test_annotation_only",
        "test_otlp_request_in_memory",
        "test_plain",
        "test_unused_port_is_no_server",
    ]
