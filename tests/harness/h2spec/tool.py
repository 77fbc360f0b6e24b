"""Find and run the h2spec built by ``build.sh``.

`locate` returns the binary (``$GPUTALLY_H2SPEC`` if set, else what ``build.sh --check``
reports; it never builds). `run` runs every h2spec test against ``127.0.0.1:port`` (h2c) and
returns the failed ones by their h2spec id, read from its JUnit report.
"""

from __future__ import annotations

import asyncio
import os
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from harness.builds import built

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
REPO = HERE.parents[2]

__all__ = ["BUILD_SCRIPT", "HarnessError", "locate", "run"]


class HarnessError(RuntimeError):
    """h2spec could not be found, or did not run."""


def locate() -> Path:
    path = built(BUILD_SCRIPT, {"H2SPEC": "GPUTALLY_H2SPEC"}, what="h2spec", cost="about a minute on a first run",
                 error=HarnessError)["H2SPEC"]
    if not os.access(path, os.X_OK):
        raise HarnessError(f"{path} is not an executable; run {BUILD_SCRIPT.relative_to(REPO)}")
    return path


async def run(binary: Path, port: int, path: str, report: Path, *, timeout: float = 120) -> tuple[int, dict[str, str]]:
    """Run h2spec against 127.0.0.1:``port`` with ``path`` as its requests' :path: the number
    of tests that ran, and each failed one's id (``http2/5.1/2``) with its message."""
    proc = await asyncio.create_subprocess_exec(
        str(binary), "-h", "127.0.0.1", "-p", str(port), "--path", path, "-o", "2", "-j", str(report),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise HarnessError(f"h2spec ran past {timeout:g} s") from None
    if not report.exists():
        raise HarnessError(f"h2spec wrote no report: {output.decode(errors='replace')[-2000:]}")
    ran, failed = 0, {}
    for suite in ElementTree.parse(report).getroot().iter("testsuite"):
        package = suite.get("package", "")
        for index, case in enumerate(suite.iter("testcase"), 1):
            if case.find("skipped") is not None:
                continue
            ran += 1
            failure = case.find("failure")
            if failure is None:
                failure = case.find("error")
            if failure is not None:
                failed[f"{package}/{index}"] = f"{case.get('classname')}: {(failure.text or '').strip()[:300]}"
    return ran, failed
