"""Prints the cases each fuzz target ran (and writes them to GPUTALLY_FUZZ_REPORT, if set)."""

from __future__ import annotations

import json
import os
from typing import Any

from tests.fuzz.budget import CASES, scale


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not CASES:
        return
    total = sum(CASES.values())
    terminalreporter.section(f"fuzz cases (GPUTALLY_FUZZ_SCALE={scale():g})")
    for target, cases in sorted(CASES.items()):
        terminalreporter.write_line(f"{target:<18} {cases:>9,}")
    terminalreporter.write_line(f"{'total':<18} {total:>9,}")
    report = os.environ.get("GPUTALLY_FUZZ_REPORT")
    if report:
        with open(report, "w") as out:
            json.dump({"scale": scale(), "cases": dict(CASES), "total": total}, out, indent=2)
