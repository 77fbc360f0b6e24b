"""Write configmap.yaml, the dashboards as ConfigMaps for Grafana's dashboard sidecar.

    python3 collector-config/dashboards/build.py           rewrite configmap.yaml
    python3 collector-config/dashboards/build.py --check   exit 1 if it is out of date

The JSON files here are the source (edit them, or edit in Grafana and export with "Export for
sharing externally" off, then run this); each becomes one ConfigMap labelled
``grafana_dashboard: "1"`` holding the file unchanged under its file name. One ConfigMap per
dashboard keeps each well under the 256 KiB that ``kubectl apply`` can keep in its
last-applied annotation. tests/dashboards checks that configmap.yaml matches the JSON files.
Needs PyYAML.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "configmap.yaml"

HEADER = """\
# Generated from the gputally-*.json files by build.py: edit the JSON, then run
#   python3 collector-config/dashboards/build.py
# For Grafana's dashboard sidecar (kube-prometheus-stack: grafana.sidecar.dashboards.enabled),
# which loads every ConfigMap labelled grafana_dashboard: "1"; apply it in a namespace the
# sidecar watches:
#   kubectl apply -n monitoring -f collector-config/dashboards/configmap.yaml
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the dashboards) as literal blocks, so the JSON stays readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def dashboards() -> list[Path]:
    return sorted(HERE.glob("gputally-*.json"))


def configmap(path: Path) -> dict[str, Any]:
    text = path.read_text()
    try:
        json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{path.name}: {exc}") from exc
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": path.stem,
            "labels": {"grafana_dashboard": "1", "app.kubernetes.io/name": "gputally"},
            # The sidecar's folderAnnotation (kube-prometheus-stack: grafana.sidecar.dashboards.folderAnnotation).
            "annotations": {"grafana_folder": "gputally"},
        },
        "data": {path.name: text},
    }


def render() -> str:
    docs = [configmap(path) for path in dashboards()]
    return HEADER + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=4096, allow_unicode=True,
                                  explicit_start=True)


def main(argv: list[str]) -> int:
    try:
        text = render()
    except ValueError as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 1
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
