"""collector-config/alerts/: the rule files pass ``promtool check rules``, every alert fires on
a matching series and stays quiet on a healthy one (``promtool test rules`` on
tests/alerts/testdata/), the PrometheusRule manifest carries the same groups, and the README
lists exactly the alerts of the rules file.

The unit tests run against a copy of the rules without the ``runbook`` annotation, so that
each expected alert names only its rendered summary and description (promtool compares all
annotations) and the runbook prose lives in one place.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "collector-config" / "alerts"
RULE_FILES = sorted(ALERTS.glob("*.rules.yaml"))
RULES = ALERTS / "gputally.rules.yaml"
TESTDATA = Path(__file__).resolve().parent / "testdata"
UNIT_TESTS = sorted(TESTDATA.glob("*.test.yaml"))
SEVERITIES = {"critical", "warning", "info"}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load(RULES)["groups"] for rule in group["rules"] if "alert" in rule]


def promtool_run(promtool: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False)


def test_the_rule_files_are_found() -> None:
    assert RULE_FILES == [RULES]
    assert UNIT_TESTS, TESTDATA


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(promtool: Path, path: Path) -> None:
    proc = promtool_run(promtool, "check", "rules", "--lint=all", "--lint-fatal", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in proc.stdout, proc.stdout


@pytest.fixture
def unit_test_dir(tmp_path: Path) -> Path:
    """The unit tests next to a copy of the rules without their runbooks."""
    rules = load(RULES)
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.get("annotations", {}).pop("runbook", None)
    (tmp_path / RULES.name).write_text(yaml.safe_dump(rules, sort_keys=False))
    for path in UNIT_TESTS:
        shutil.copy(path, tmp_path / path.name)
    return tmp_path


@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_test_rules(promtool: Path, unit_test_dir: Path, path: Path) -> None:
    proc = promtool_run(promtool, "test", "rules", "--diff", path.name, cwd=unit_test_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_is_shown_to_fire_and_to_stay_quiet() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in UNIT_TESTS:
        for group in load(path)["tests"]:
            for case in group.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - fires == set(), "alerts no unit test shows firing"
    assert names - quiet == set(), "alerts no unit test shows quiet"
    healthy = {case["alertname"] for group in load(TESTDATA / "healthy.test.yaml")["tests"]
               for case in group["alert_rule_test"]}
    assert healthy == names, "healthy.test.yaml must evaluate every alert"


def test_every_alert_has_a_severity_summary_description_and_runbook() -> None:
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names)), "duplicate alert names"
    for rule in alert_rules():
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook"}, rule["alert"]
        assert len(annotations["runbook"].split()) >= 40, f"{rule['alert']}: the runbook says too little"


def test_the_prometheusrule_manifest_carries_the_same_groups() -> None:
    manifest = load(ALERTS / "prometheusrule.yaml")
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest["kind"] == "PrometheusRule"
    assert manifest["spec"]["groups"] == load(RULES)["groups"]
    # ... and is exactly what the generator writes, so that nobody edits it by hand.
    proc = subprocess.run([sys.executable, str(ALERTS / "prometheusrule.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_readme_lists_exactly_the_alerts() -> None:
    readme = (ALERTS / "README.md").read_text()
    listed = re.findall(r"^\| `(\w+)` \|", readme, flags=re.MULTILINE)
    assert len(listed) == len(set(listed)), "an alert is listed twice"
    assert set(listed) == {rule["alert"] for rule in alert_rules()}
