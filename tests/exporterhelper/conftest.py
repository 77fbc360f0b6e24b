"""Fixtures for exporter tests: loopback sinks, a fake transport, exporters and batches (tests/support/exporting.py)."""

from support.exporting import *  # noqa: F403  (fixtures are found by name in this module)
