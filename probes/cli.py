"""``gputally probe ...``: the dispatch to every vendor's probe command.

The one core module that names the vendor subpackages; each adds its own subcommand
(``nvml``, ``amd``, ``gaudi``) from the shared options of :mod:`~gputally.probes.core.command`.
Registering imports only argparse-level code, so ``gputally --help`` stays cheap.
"""

from __future__ import annotations

import argparse

from gputally.probes.amd import cli as amd_cli
from gputally.probes.gaudi import cli as gaudi_cli
from gputally.probes.nvml import cli as nvml_cli

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``probe`` command, with one subcommand per vendor, to the top-level parser."""
    probe = commands.add_parser(
        "probe", help="Run a node probe (nvml, amd, gaudi).", description="Node probes that send GPU telemetry."
    )
    probes = probe.add_subparsers(dest="probe", required=True, metavar="PROBE")
    for vendor in (nvml_cli, amd_cli, gaudi_cli):
        vendor.register(probes)
