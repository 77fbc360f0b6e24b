"""The fuzzing suite's long run: every target of tests/fuzz with its budget multiplied.

    .venv/bin/python bench/fuzz.py [--scale 13]

At ``--scale 13`` the targets together run over 100,000 cases (``make test`` runs scale 1,
about 8,000 in under a minute). New cases each run (not derandomized); a failure is kept in
``.hypothesis/`` and printed with the input that caused it. Prints the cases per target, the
time, and the process's peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=13.0, help="budget multiplier (default 13: >100,000 cases)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "fuzz.json"
        env = {**os.environ, "GPUTALLY_FUZZ_SCALE": str(args.scale), "GPUTALLY_FUZZ_REPORT": str(report)}
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "pytest", "tests/fuzz", "-q", "-p", "no:cacheprovider"],
                                cwd=REPO, env=env, check=False)
        elapsed = time.monotonic() - started
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        cases = json.loads(report.read_text()) if report.exists() else {"cases": {}, "total": 0}
    print(f"\nfuzz run at scale {args.scale:g}: {cases['total']:,} cases in {elapsed:.0f} s, "
          f"peak memory {peak:.0f} MiB, pytest exit {result.returncode}")
    for target, count in sorted(cases["cases"].items()):
        print(f"  {target:<18} {count:>9,}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
