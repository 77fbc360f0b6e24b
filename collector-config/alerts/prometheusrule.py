"""Write prometheusrule.yaml, the Prometheus Operator form of gputally.rules.yaml.

    python3 collector-config/alerts/prometheusrule.py           rewrite prometheusrule.yaml
    python3 collector-config/alerts/prometheusrule.py --check   exit 1 if it is out of date

The manifest's ``spec.groups`` is the rules file's ``groups``, unchanged; edit the rules file
and run this (tests/alerts checks that the two agree). Needs PyYAML.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "gputally.rules.yaml"
MANIFEST = HERE / "prometheusrule.yaml"

HEADER = """\
# Generated from gputally.rules.yaml by prometheusrule.py: edit the rules file, then run
#   python3 collector-config/alerts/prometheusrule.py
# For the Prometheus Operator (kube-prometheus-stack): add the labels your Prometheus's
# ruleSelector matches (often `release: <helm release name>`) and apply it with
#   kubectl apply -n <namespace> -f collector-config/alerts/prometheusrule.yaml
"""


class _Dumper(yaml.SafeDumper):
    """Strings styled as in the rules file: multi-line ones (PromQL) as literal blocks, long
    ones (annotations) folded."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else ">" if len(value) > 80 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render() -> str:
    rules: dict[str, Any] = yaml.safe_load(RULES.read_text())
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "gputally", "labels": {"app.kubernetes.io/name": "gputally"}},
        "spec": {"groups": rules["groups"]},
    }
    return HEADER + yaml.dump(manifest, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        if not MANIFEST.exists() or MANIFEST.read_text() != text:
            print(f"{MANIFEST} is out of date: run python3 {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    MANIFEST.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
