"""Send Kubernetes documents to the harness's kube-apiserver as they are written.

Requests go through ``ApiClient.call_api`` with paths from API discovery: one code path for
every kind (custom resources included), the documents sent exactly as written, and the reply's
Warning headers (strict field validation's and PodSecurity's) in hand. Shared by the plain
manifests' tests and the Helm chart's.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from .cli_argv import parse_gputally_argv

__all__ = [
    "CREATED_FOR_REAL",
    "WORKLOAD_KINDS",
    "Reply",
    "apply_document",
    "collection_path",
    "containers",
    "ensure_namespace",
    "install_crds",
    "pod_security_violations",
    "request",
    "server_env",
    "submit",
    "validate_config",
]

NAMESPACE = "gputally"
CREATED_FOR_REAL = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}


class Reply:
    def __init__(self, status: int, body: dict[str, Any], warning: str) -> None:
        self.status, self.body, self.warning = status, body, warning

    def __repr__(self) -> str:
        return f"HTTP {self.status}: {self.body.get('message', '')} {self.warning}".strip()


def request(
    api: Any, method: str, path: str, *, query: Sequence[tuple[str, str]] = (), body: Any = None
) -> Reply:
    serialized = api.param_serialize(
        method,
        path,
        query_params=list(query),
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*serialized, _request_timeout=30)
    raw = response.read()
    return Reply(response.status, json.loads(raw) if raw else {}, response.headers.get("Warning") or "")


_DISCOVERY: dict[str, list[dict[str, Any]]] = {}


def collection_path(api: Any, doc: dict[str, Any], namespace: str) -> str:
    api_version = doc["apiVersion"]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if api_version not in _DISCOVERY:
        reply = request(api, "GET", prefix)
        assert reply.status == 200, f"discovery of {api_version}: {reply}"
        _DISCOVERY[api_version] = reply.body["resources"]
    matches = [r for r in _DISCOVERY[api_version] if r["kind"] == doc["kind"] and "/" not in r["name"]]
    assert matches, f"the API server serves no {doc['kind']} in {api_version}"
    resource = matches[0]
    return f"{prefix}/namespaces/{namespace}/{resource['name']}" if resource["namespaced"] else f"{prefix}/{resource['name']}"


def submit(
    api: Any, doc: dict[str, Any], *, dry_run: bool = True, validation: str = "Strict", namespace: str | None = None
) -> Reply:
    """POST `doc` with the given field validation; `namespace` overrides the document's."""
    if namespace is not None:
        doc = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    query = [("fieldValidation", validation), *([("dryRun", "All")] if dry_run else [])]
    path = collection_path(api, doc, doc["metadata"].get("namespace", NAMESPACE))
    return request(api, "POST", path, query=query, body=doc)


def ensure_namespace(api: Any, name: str, labels: dict[str, str] | None = None) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
    reply = request(api, "POST", "/api/v1/namespaces", body=body)
    assert reply.status in (201, 409), f"namespace {name}: {reply}"  # 409: another test made it


def apply_document(api: Any, doc: dict[str, Any]) -> Reply:
    """Strictly validated: RBAC kinds created for real (once a session), the rest dry run."""
    real = doc["kind"] in CREATED_FOR_REAL
    reply = submit(api, doc, dry_run=not real)
    if real and reply.status == 409 and reply.body.get("reason") == "AlreadyExists":
        # Created by an earlier test of this session; still prove this copy validates.
        reply = request(
            api,
            "PUT",
            f"{collection_path(api, doc, doc['metadata'].get('namespace', NAMESPACE))}/{doc['metadata']['name']}",
            query=[("fieldValidation", "Strict"), ("dryRun", "All")],
            body=doc,
        )
    return reply


def install_crds(api: Any, files: Iterable[Path], timeout: float = 30) -> list[str]:
    """Create each CustomResourceDefinition (for real, once a session) and wait until the API
    server serves it; the CRDs' names."""
    names = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            assert doc["kind"] == "CustomResourceDefinition", path
            reply = submit(api, doc, dry_run=False)
            assert reply.status in (201, 409), f"{path.name}: {reply}"
            names.append(doc["metadata"]["name"])
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            reply = request(api, "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conditions = {c["type"]: c["status"] for c in (reply.body.get("status") or {}).get("conditions") or []}
            if conditions.get("Established") == "True":
                break
            assert time.monotonic() < deadline, f"CRD {name} not established: {reply.body.get('status')}"
            time.sleep(0.1)
    _DISCOVERY.clear()  # new groups and kinds are served now
    return names


def pod_security_violations(warning: str) -> set[str]:
    """The PodSecurity checks a `would violate PodSecurity "level:version": ...` warning names."""
    match = re.search(r'would violate PodSecurity \\?"[^"\\]+\\?": (.*)', warning)
    assert match, warning
    return set(re.findall(r'(?:^|\),)\s*([^(),"]+?)\s*\(', match.group(1)))


def containers(workload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


# Stand-ins for what the downward API gives a running pod.
_FIELD_VALUES = {"status.podIP": "10.1.2.3", "spec.nodeName": "gpu-node-1"}


def server_env(container: dict[str, Any]) -> dict[str, str]:
    """The environment a container's process gets, downward-API fields filled in as the kubelet
    would (only fieldRefs are expected; anything else is an error)."""
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            field = item["valueFrom"]["fieldRef"]["fieldPath"]
            env[item["name"]] = _FIELD_VALUES[field]
    return env


def validate_config(
    gputally: Path,
    config_text: str,
    container: dict[str, Any],
    tmp: Path,
    *,
    pod: dict[str, Any] | None = None,
    secrets: dict[str, dict[str, str]] | None = None,
) -> str:
    """`gputally validate` on a ConfigMap's config.yaml, in the container's environment only
    (so a ``${env:X}`` the pod does not set is an error): its output. Fails the test otherwise.

    Files the config reads at validation (token files) are where the kubelet would put them:
    each Secret volume the container mounts is written under `tmp` (the rendered Secret's
    stringData, or a stand-in ``token`` for a Secret made outside the chart) and the config's
    paths into its mount point are pointed there."""
    import subprocess

    args = parse_gputally_argv(container["args"])
    assert args.command == "serve", container["args"]
    volumes = {v["name"]: v for v in (pod or {}).get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        secret = volumes.get(mount["name"], {}).get("secret")
        if secret is None:
            continue
        folder = tmp / "mounts" / mount["mountPath"].lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        for key, value in (secrets or {}).get(secret["secretName"], {"token": "stand-in"}).items():
            (folder / key).write_text(value)
        config_text = config_text.replace(mount["mountPath"] + "/", f"{folder}/")
    (config,) = args.config  # --config is repeatable; the manifests give one
    path = tmp / f"{container['name']}-{Path(config).name}"
    path.write_text(config_text)
    env = {"PATH": "/usr/bin:/bin", **server_env(container)}
    proc = subprocess.run(
        [str(gputally), "validate", "--config", str(path)], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, f"gputally validate ({container['name']}):\n{proc.stdout}{proc.stderr}"
    return proc.stdout
