"""Find and run the helm built by ``build.sh``.

`locate` returns the helm binary and the folder of Prometheus Operator CRDs that ``build.sh``
put beside it (``$GPUTALLY_HELM`` and ``$GPUTALLY_PROMETHEUS_OPERATOR_CRDS`` if both are set, else
what ``build.sh --check`` reports; it never builds). `Helm.run` runs one helm command with its
own ``HELM_*`` folders, so nothing is read from or written to the user's helm configuration.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.builds import built

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
REPO = HERE.parents[2]

__all__ = ["BUILD_SCRIPT", "Helm", "HarnessError", "locate"]


class HarnessError(RuntimeError):
    """helm could not be found, or a helm command failed."""


@dataclass(frozen=True)
class Helm:
    binary: Path
    crds: Path
    """The Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule CRDs (YAML files)."""
    home: Path
    """Where helm keeps its config, cache and data for these tests (HELM_CONFIG_HOME, ...)."""

    def run(
        self, args: Sequence[str], *, kubeconfig: Path | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``helm ARGS``; raises `HarnessError` with helm's stderr when it fails and `check`."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        proc = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise HarnessError(f"helm {' '.join(args)} exited with {proc.returncode}:\n{proc.stderr.strip()}")
        return proc


def locate(home: Path) -> Helm:
    """The built helm and CRDs; raises `HarnessError` naming the build script when there are none."""
    paths = built(BUILD_SCRIPT, {"HELM": "GPUTALLY_HELM", "PROMETHEUS_OPERATOR_CRDS": "GPUTALLY_PROMETHEUS_OPERATOR_CRDS"},
                  what="helm for the chart tests", cost="about 2 minutes", error=HarnessError)
    binary, crds = paths["HELM"], paths["PROMETHEUS_OPERATOR_CRDS"]
    if not os.access(binary, os.X_OK):
        raise HarnessError(f"{binary} is not an executable; run {BUILD_SCRIPT.relative_to(REPO)}")
    if not sorted(crds.glob("*.yaml")):
        raise HarnessError(f"no CRDs in {crds}; run {BUILD_SCRIPT.relative_to(REPO)}")
    home.mkdir(parents=True, exist_ok=True)
    return Helm(binary, crds, home)
