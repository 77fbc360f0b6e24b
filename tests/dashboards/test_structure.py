"""The dashboards as files: valid Grafana JSON models wired to a ``datasource`` variable, the
generated ConfigMaps in sync (and accepted by a real kube-apiserver), the provisioning file, and
the README's load command run against a stand-in for Grafana's HTTP API.

No Grafana is installed here (no package, no Docker): Grafana's own import is not exercised; the
panels' queries are run against a real Prometheus in test_queries.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.kube.cluster import create_namespace
from harness.processes import free_port

from tests.dashboards import grafana

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "collector-config" / "dashboards"
NAMES = ("fleet", "chargeback", "workload", "node", "inference")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def boards() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, json.loads(path.read_text())) for path in grafana.dashboard_files()]


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}[{i}]")


def test_the_dashboards_parse_with_stable_unique_uids() -> None:
    found = boards()
    assert [p.name for p, _ in found] == sorted(f"gputally-{n}.json" for n in NAMES)
    uids = [board["uid"] for _, board in found]
    assert len(set(uids)) == len(uids)
    for path, board in found:
        assert board["uid"] == path.stem, path  # the uid is the file name: links and the API rely on it
        assert board["id"] is None, path  # the HTTP API creates or (overwrite) updates by uid
        assert board["title"].startswith("gputally / ") and board["description"], path
        assert board["schemaVersion"] >= 39, path
        assert "gputally" in board["tags"], path


def test_every_panel_has_a_title_a_description_a_unit_and_queries() -> None:
    for path, board in boards():
        ids = [p["id"] for p in board["panels"]] + [p["id"] for row in board["panels"] for p in row.get("panels", [])]
        assert len(ids) == len(set(ids)), path
        shown = list(grafana.panels(board))
        assert len(shown) >= 8, path
        for panel in shown:
            where = f"{path.name}: {panel['title']!r}"
            assert panel["title"] and len(panel["description"]) > 60, where
            targets = grafana.targets(panel)
            assert targets, where
            refs = [t["refId"] for t in targets]
            assert len(refs) == len(set(refs)), where
            for target in targets:
                assert target["expr"].strip(), where
                assert target["datasource"] == DATASOURCE, where
            assert panel["datasource"] == DATASOURCE, where
            units = [panel["fieldConfig"]["defaults"].get("unit")] + [
                prop["value"] for o in panel["fieldConfig"]["overrides"] for prop in o["properties"]
                if prop["id"] == "unit"]
            assert any(units), f"{where}: no unit"
            if panel["type"] == "table":
                # Grafana names a table's value column "Value #<refId>" with several queries, else "Value".
                values = {f"Value #{r}" for r in refs} if len(refs) > 1 else {"Value"}
                named = {o["matcher"]["options"] for o in panel["fieldConfig"]["overrides"]
                         if o["matcher"]["options"].startswith("Value")}
                assert named == values, (where, named)
                assert all(t["instant"] and t["format"] == "table" for t in targets), where


def test_panels_do_not_overlap_on_the_grid() -> None:
    for path, board in boards():
        taken: dict[tuple[int, int], str] = {}
        for panel in board["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, (path.name, panel["title"])
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    assert (x, y) not in taken, (path.name, panel["title"], taken[(x, y)])
                    taken[(x, y)] = panel["title"]


def test_the_datasource_is_a_variable_and_no_uid_is_hard_coded() -> None:
    for path, board in boards():
        first = grafana.variables(board)[0]
        assert (first["name"], first["type"], first["query"]) == ("datasource", "datasource", "prometheus"), path
        for where, node in walk(board):
            if isinstance(node, dict) and where.endswith(".datasource"):
                if node.get("type") == "grafana":  # the built-in annotations' own source
                    assert where.startswith(".annotations"), (path.name, where)
                    continue
                assert node == DATASOURCE, (path.name, where, node)
        for variable in grafana.variables(board)[1:]:
            assert variable["datasource"] == DATASOURCE, (path.name, variable["name"])


def test_every_variable_a_query_uses_is_defined() -> None:
    for path, board in boards():
        names = [v["name"] for v in grafana.variables(board)]
        values = {n: grafana.Value(("x",)) for n in (*names, *grafana.BUILT_INS)}
        for panel in grafana.panels(board):
            for target in grafana.targets(panel):
                grafana.substitute(target["expr"], values)  # KeyError names an undefined variable
        for i, variable in enumerate(grafana.variables(board)[1:], start=1):
            earlier = {n: grafana.Value(("x",)) for n in names[:i]}
            grafana.substitute(grafana.variable_query(variable), earlier)  # only earlier variables


def test_the_substitution_is_strict_and_formats_multi_values_as_grafana_does() -> None:
    with pytest.raises(KeyError):
        grafana.substitute('up{job="$jbo"}', {"job": "a"})
    values = {"gpu": grafana.Value(("GPU-a.1", "GPU-b"), multi=True), "owner": grafana.Value(("ns/p",))}
    assert grafana.substitute('x{hw_id=~"$gpu", id="${owner}"}[$__range]', {**values, "__range": "5m"}) == \
        'x{hw_id=~"(GPU-a\\.1|GPU-b)", id="ns/p"}[5m]'


def test_the_configmaps_are_generated_from_the_json_files() -> None:
    result = subprocess.run([sys.executable, str(HERE / "build.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all((HERE / "configmap.yaml").read_text()))
    assert [d["metadata"]["name"] for d in docs] == [p.stem for p in grafana.dashboard_files()]
    for doc, path in zip(docs, grafana.dashboard_files(), strict=True):
        assert doc["kind"] == "ConfigMap" and doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert doc["data"] == {path.name: path.read_text()}
        assert len(json.dumps(doc)) < 256 * 1024  # kubectl apply's last-applied annotation limit


def test_build_check_fails_when_a_dashboard_changed(tmp_path: Path) -> None:
    copy = tmp_path / "dashboards"
    copy.mkdir()
    for path in [*grafana.dashboard_files(), HERE / "build.py", HERE / "configmap.yaml"]:
        (copy / path.name).write_text(path.read_text())
    board = json.loads((copy / "gputally-node.json").read_text())
    board["title"] = "changed"
    (copy / "gputally-node.json").write_text(json.dumps(board))
    check = [sys.executable, str(copy / "build.py"), "--check"]
    assert subprocess.run(check, capture_output=True).returncode == 1
    assert subprocess.run([sys.executable, str(copy / "build.py")], capture_output=True).returncode == 0
    assert subprocess.run(check, capture_output=True).returncode == 0


def test_the_configmaps_are_accepted_by_a_real_apiserver(kube_admin: Any) -> None:
    from kubernetes import client

    api = client.CoreV1Api(kube_admin)
    namespace = create_namespace(kube_admin).metadata.name
    for doc in yaml.safe_load_all((HERE / "configmap.yaml").read_text()):
        api.create_namespaced_config_map(namespace, doc, field_validation="Strict")
    stored = api.list_namespaced_config_map(namespace, label_selector="grafana_dashboard=1").items
    assert sorted(cm.metadata.name for cm in stored) == [p.stem for p in grafana.dashboard_files()]


def test_the_provisioning_file_points_at_the_directory_the_readme_names() -> None:
    provider = yaml.safe_load((HERE / "provisioning" / "dashboards.yaml").read_text())
    assert provider["apiVersion"] == 1
    (entry,) = provider["providers"]
    assert entry["type"] == "file"
    assert entry["options"]["path"] in (HERE / "README.md").read_text()


def test_the_readme_describes_every_dashboard_and_panel() -> None:
    readme = (HERE / "README.md").read_text()
    for _, board in boards():
        assert board["title"] in readme
        for panel in grafana.panels(board):
            assert panel["title"].replace("${currency}", "currency") in readme, panel["title"]


def load_command() -> str:
    """The README's one load command: the fenced block after the line naming it."""
    readme = (HERE / "README.md").read_text()
    match = re.search(r"<!-- load-command -->\s*```sh\n(.+?)```", readme, re.DOTALL)
    assert match, "the README's load command (after <!-- load-command -->) is missing"
    return match.group(1)


class _Grafana(BaseHTTPRequestHandler):
    """Stands in for Grafana's POST /api/dashboards/db: records each request."""

    received: list[tuple[str, str, dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.command, self.path, dict(self.headers), body))
        uid = json.loads(body)["dashboard"]["uid"]
        reply = json.dumps({"status": "success", "uid": uid, "url": f"/d/{uid}", "version": 1}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_readme_load_command_posts_every_dashboard_to_the_grafana_api() -> None:
    _Grafana.received = []
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Grafana)
    thread = threading.Thread(target=server.serve_forever, name="grafana-stand-in", daemon=True)
    thread.start()
    try:
        env = {**os.environ, "GRAFANA_URL": f"http://127.0.0.1:{server.server_address[1]}",
               "GRAFANA_TOKEN": "glsa_test"}
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", load_command()], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
        thread.join(5)
        server.server_close()
    assert result.returncode == 0, result.stderr
    posted = {}
    for method, path, headers, body in _Grafana.received:
        assert (method, path) == ("POST", "/api/dashboards/db")
        assert headers["Authorization"] == "Bearer glsa_test"
        assert headers["Content-Type"] == "application/json"
        request = json.loads(body)
        assert request["overwrite"] is True
        posted[request["dashboard"]["uid"]] = request["dashboard"]
    assert posted == {board["uid"]: board for _, board in boards()}
