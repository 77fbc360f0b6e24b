"""The session-scoped ``slurm_cluster`` fixture: one real Slurm cluster for the whole test run.

Register it with ``pytest_plugins = ["harness.slurm.fixtures"]`` (tests/ is on ``sys.path``)
or import the fixture into a conftest. When packages are missing and the run is root,
``setup.sh`` installs them first. If the cluster cannot start, every test using it fails
(not skips) with the daemons' log tails, so a broken harness is never mistaken for a pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from .cluster import SETUP_SCRIPT, HarnessError, SlurmCluster, missing_programs

__all__ = ["slurm_cluster"]

_INSTALL_TIMEOUT = 900


def _install() -> None:
    if not missing_programs():
        return
    if os.geteuid() != 0:
        pytest.fail(
            f"Slurm harness: missing {missing_programs()}; run {SETUP_SCRIPT} as root first", pytrace=False
        )
    started = time.monotonic()
    result = subprocess.run(
        ["sh", str(SETUP_SCRIPT)], capture_output=True, text=True, timeout=_INSTALL_TIMEOUT, check=False,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0 or missing_programs():
        pytest.fail(
            f"Slurm harness: {SETUP_SCRIPT} failed ({result.returncode}):\n"
            f"{result.stdout[-3000:]}{result.stderr[-3000:]}",
            pytrace=False,
        )
    print(f"slurm harness: installed in {time.monotonic() - started:.0f} s", file=sys.stderr)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A running one-node cluster with accounting, slurmrestd (JWT) and two fake GPUs whose
    gres.conf order (minors 5, then 3) differs from their minor numbers."""
    _install()
    cluster = SlurmCluster(gpu_minors=(5, 3), cpus=16)
    try:
        cluster.start()
    except HarnessError as exc:
        cluster.close()
        pytest.fail(f"Slurm harness could not start a cluster: {exc}", pytrace=False)
    print(f"slurm harness: cluster up in {cluster.start_seconds:.1f} s under {cluster.root}", file=sys.stderr)
    try:
        yield cluster
    finally:
        cluster.close()
