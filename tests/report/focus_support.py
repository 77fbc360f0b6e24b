"""The FinOps Foundation's validator (``focus-validator`` from PyPI), run as its own command on
an export, and reading an export back.

focus-validator 1.0.0 is the newest on PyPI; it knows FOCUS 0.5, 1.0-preview and 1.0, not 1.3,
so the exports are validated against its 1.0 rule set, whose checks 1.3 keeps. Two faults of
that release are worked around here, not in the export:

* Its 1.0 rules still name five columns by their 1.0-preview names: ``Provider``,
  ``Publisher``, ``InvoiceIssuer``, ``ResourceID`` (FOCUS 1.0 says ``ProviderName``,
  ``PublisherName``, ``InvoiceIssuerName``, ``ResourceId``) and, in the SkuPriceId rule's
  SQL, ``ChargeType`` (1.0: ``ChargeCategory``). The validator is shown a copy of the file
  with those columns under its names (the values unchanged), so that their checks run on our
  values instead of failing on the names.
* It reads its ISO 4217 list from ``focus_validator/utils/currency_codes.csv`` relative to
  the working directory, so it runs from the directory that holds its package.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

VALIDATOR_NAMES = {"ProviderName": "Provider", "PublisherName": "Publisher", "InvoiceIssuerName": "InvoiceIssuer",
                   "ResourceId": "ResourceID"}
"""Our (FOCUS 1.0+) column name -> the name focus-validator 1.0.0's 1.0 rules look for."""


@dataclass(frozen=True)
class Verdict:
    tests: int
    failures: list[str]
    errors: int
    checked_columns: set[str]

    @property
    def passed(self) -> bool:
        return self.tests > 0 and not self.failures and self.errors == 0


def validator_copy(text: str) -> str:
    """The CSV with the columns under the validator's names, and ``ChargeType`` added."""
    rows = list(csv.reader(io.StringIO(text)))
    header = rows[0]
    category = header.index("ChargeCategory")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([VALIDATOR_NAMES.get(name, name) for name in header] + ["ChargeType"])
    for row in rows[1:]:
        writer.writerow(row + [row[category]])
    return out.getvalue()


def validate(text: str, workdir: Path) -> Verdict:
    """Run ``focus-validator --validate-version 1.0`` on the CSV ``text``; its JUnit XML read back."""
    spec = find_spec("focus_validator")
    assert spec is not None and spec.origin, "focus-validator is not installed (the test extra has it)"
    package_parent = Path(spec.origin).parent.parent
    data = workdir / "focus-for-validator.csv"
    data.write_text(validator_copy(text))
    result_file = workdir / "focus-validator.xml"
    command = shutil.which("focus-validator", path=str(Path(sys.executable).parent)) or "focus-validator"
    done = subprocess.run([command, "--data-file", str(data), "--validate-version", "1.0", "--output-type",
                           "unittest", "--output-destination", str(result_file)],
                          cwd=package_parent, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and result_file.exists(), f"focus-validator failed to run:\n{done.stdout}{done.stderr}"
    root = ET.parse(result_file).getroot()
    failures = [f.get("name", "?") + ": " + f.get("message", "") for f in root.iter("failure")]
    columns = {suite.get("name", "").rsplit("-", 1)[-1] for suite in root.iter("testsuite")}
    return Verdict(int(root.get("tests", "0")), failures, int(root.get("errors", "0")), columns)


def read_rows(text: str) -> list[dict[str, Any]]:
    return list(csv.DictReader(io.StringIO(text)))
