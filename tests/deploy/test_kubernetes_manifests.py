"""The Kubernetes manifests of collector-config/*/kubernetes/ against a real API server.

Every document goes to the harness's kube-apiserver with ``fieldValidation=Strict``, so an
unknown or misspelled field is an error rather than silently dropped: workloads, Services
and PodDisruptionBudgets with ``dryRun=All`` (defaulting, validation and admission run,
PodSecurity included, but nothing is stored), the RBAC objects for real, so that
SubjectAccessReviews can show what each ServiceAccount may do. Broken copies show the
validation is not vacuous. The rest reads the YAML for what a reviewer checks by eye:
resources, security contexts, host mounts, the downward API, and the RBAC rules, which must be
exactly processors/k8s/rbac.yaml's.

Requests go through ``ApiClient.call_api`` with paths from API discovery: one code path for
every kind, the documents sent exactly as written, and the reply's Warning headers (strict
validation's and PodSecurity's) in hand.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cli_argv import parse_gputally_argv

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted(ROOT.glob("collector-config/*/kubernetes/*.yaml"))
EXPECTED = {
    "collector-config/gateway/kubernetes/rbac.yaml",
    "collector-config/gateway/kubernetes/deployment.yaml",
    "collector-config/gateway/kubernetes/service.yaml",
    "collector-config/gateway/kubernetes/probe-daemonset.yaml",
    "collector-config/sidecar/kubernetes/rbac.yaml",
    "collector-config/sidecar/kubernetes/daemonset.yaml",
}
PROCESSOR_RBAC = ROOT / "processors" / "k8s" / "rbac.yaml"
NAMESPACE = "gputally"
CREATED_FOR_REAL = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
# Containers allowed to run as uid 0 (still without any capability), and why: the kubelet's
# PodResources socket is writable by root only (see the comments in daemonset.yaml and
# probe-daemonset.yaml). They are exactly the containers that mount it.
ROOT_CONTAINERS = {("DaemonSet", "gputally-node", "gputally"), ("DaemonSet", "gputally-probe", "probe")}
CONFIGMAPS = {"gputally-gateway": "gputally-gateway-config", "gputally-node": "gputally-node-config"}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


ALL_DOCS = [(rel(p), d) for p in MANIFESTS for d in documents(p)]


def docs_of(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in ALL_DOCS if d["kind"] == kind]


def workloads() -> list[dict[str, Any]]:
    return [d for _, d in ALL_DOCS if d["kind"] in WORKLOAD_KINDS]


def containers(workload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def workload_id(workload: dict[str, Any]) -> str:
    return f"{workload['kind']}/{workload['metadata']['name']}"


def named_workload(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs_of(kind) if d["metadata"]["name"] == name]
    return found


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def canonical_rules(rules: list[dict[str, Any]]) -> list[tuple[tuple[str, ...], ...]]:
    """RBAC rules compared by content: order of rules and of list items is not meaning."""
    return sorted(tuple(tuple(sorted(rule.get(k, []))) for k in sorted(rule)) for rule in rules)


# -- talking to the API server ----------------------------------------------------------------


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


@pytest.fixture(scope="module")
def admin(kube_admin: Any) -> Any:
    ensure_namespace(kube_admin, NAMESPACE)
    return kube_admin


# -- the API server's verdict --------------------------------------------------------------------


def test_every_shape_has_its_manifests() -> None:
    assert EXPECTED <= {rel(p) for p in MANIFESTS}


@pytest.mark.parametrize("path", MANIFESTS, ids=rel)
def test_the_api_server_accepts_every_document(admin: Any, path: Path) -> None:
    docs = documents(path)
    assert docs, f"{rel(path)} has no documents"
    for doc in docs:
        reply = apply_document(admin, doc)
        assert reply.status in (200, 201), f"{rel(path)}: {doc['kind']}/{doc['metadata']['name']}: {reply}"
        assert not reply.warning, f"{rel(path)}: {doc['kind']}/{doc['metadata']['name']}: {reply.warning}"


def _gateway_deployment() -> dict[str, Any]:
    return yaml.safe_load(yaml.safe_dump(docs_of("Deployment")[0]))  # a deep copy


def _misspelled_field(doc: dict[str, Any]) -> None:
    doc["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True


def _contianers(doc: dict[str, Any]) -> None:
    pod = doc["spec"]["template"]["spec"]
    pod["contianers"] = pod.pop("containers")


def _replicas_two(doc: dict[str, Any]) -> None:
    doc["spec"]["replicas"] = "two"


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (_misspelled_field, 'unknown field "spec.template.spec.containers[0].securityContext.readOnlyRootFileSystem"'),
        (_contianers, 'unknown field "spec.template.spec.contianers"'),
        (_replicas_two, "cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32"),
    ],
    ids=["readOnlyRootFileSystem", "contianers", "replicas-two"],
)
def test_a_broken_copy_is_rejected(admin: Any, break_it: Any, message: str) -> None:
    doc = _gateway_deployment()
    break_it(doc)
    reply = submit(admin, doc)
    assert reply.status == 400 and message in reply.body.get("message", ""), reply


def test_the_rejection_is_strict_validation(admin: Any) -> None:
    """Without Strict the misspelled field is dropped (Ignore) or only warned about (Warn):
    the rejection above is the Strict parameter's doing, so it is really being sent."""
    doc = _gateway_deployment()
    _misspelled_field(doc)
    assert submit(admin, doc, validation="Ignore").status == 201
    warned = submit(admin, doc, validation="Warn")
    assert warned.status == 201 and "readOnlyRootFileSystem" in warned.warning, warned


def _violations(warning: str) -> set[str]:
    """The PodSecurity checks a `would violate PodSecurity "level:version": ...` warning names."""
    match = re.search(r'would violate PodSecurity \\?"[^"\\]+\\?": (.*)', warning)
    assert match, warning
    return set(re.findall(r'(?:^|\),)\s*([^(),"]+?)\s*\(', match.group(1)))


def test_pod_security_levels(admin: Any) -> None:
    """The gateway meets the `restricted` Pod Security Standard. The DaemonSets (the sidecar
    shape's node pod, the gateway shape's probe) break `baseline` only where they must
    (hostPID, hostPath): nothing privileged, no added capability, no host network or ports.
    The namespaces only warn; dry run stores nothing."""
    restricted, baseline = "gputally-psa-restricted", "gputally-psa-baseline"
    ensure_namespace(admin, restricted, {"pod-security.kubernetes.io/warn": "restricted"})
    ensure_namespace(admin, baseline, {"pod-security.kubernetes.io/warn": "baseline"})

    for workload in docs_of("Deployment"):
        reply = submit(admin, workload, namespace=restricted)
        assert reply.status == 201 and not reply.warning, f"{workload_id(workload)}: {reply}"

    daemonsets = docs_of("DaemonSet")
    assert {d["metadata"]["name"] for d in daemonsets} == {"gputally-node", "gputally-probe"}
    for daemonset in daemonsets:
        reply = submit(admin, daemonset, namespace=baseline)
        assert reply.status == 201, reply
        assert "hostPID=true" in reply.warning, reply  # the check ran
        assert _violations(reply.warning) == {"host namespaces", "hostPath volumes"}, reply.warning
        # Under `restricted`, in addition, only the one root container (ROOT_CONTAINERS).
        reply = submit(admin, daemonset, namespace=restricted)
        assert _violations(reply.warning) == {
            "host namespaces",
            "restricted volume types",
            "runAsNonRoot != true",
            "runAsUser=0",
        }, reply.warning
        named = re.findall(r'container "([^"]+)"', reply.warning.replace('\\"', '"'))
        root = {c for kind, name, c in ROOT_CONTAINERS if (kind, name) == ("DaemonSet", daemonset["metadata"]["name"])}
        assert set(named) == root and len(root) == 1, reply.warning


def _access(api: Any, user: str, verb: str, group: str, resource: str) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
            "resourceAttributes": {"verb": verb, "group": group, "resource": resource, "namespace": "anywhere"},
        },
    }
    reply = request(api, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review)
    assert reply.status == 201, reply
    return bool(reply.body["status"].get("allowed"))


@pytest.mark.parametrize("rbac", sorted(p for p in MANIFESTS if p.name == "rbac.yaml"), ids=rel)
def test_each_service_account_may_do_exactly_what_the_processor_needs(admin: Any, rbac: Path) -> None:
    for doc in documents(rbac):
        reply = apply_document(admin, doc)
        assert reply.status in (200, 201), reply
    (account,) = [d for d in documents(rbac) if d["kind"] == "ServiceAccount"]
    user = f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"
    granted = [
        (verb, group, resource)
        for rule in yaml.safe_load_all(PROCESSOR_RBAC.read_text())
        if rule and rule["kind"] == "ClusterRole"
        for r in rule["rules"]
        for group in r["apiGroups"]
        for resource in r["resources"]
        for verb in r["verbs"]
    ]
    assert ("watch", "", "pods") in granted
    deadline = time.monotonic() + 15  # the RBAC authorizer sees new bindings through an informer
    for verb, group, resource in granted:
        while not _access(admin, user, verb, group, resource):
            assert time.monotonic() < deadline, f"{user} may not {verb} {group or 'core'}/{resource}"
            time.sleep(0.1)
    for verb, group, resource in [
        ("get", "", "pods"),  # list/watch only
        ("create", "", "pods"),
        ("list", "", "nodes"),  # get only
        ("get", "", "secrets"),
        ("list", "apps", "replicasets"),
        ("delete", "batch", "jobs"),
        ("get", "apps", "deployments"),
    ]:
        assert not _access(admin, user, verb, group, resource), f"{user} may {verb} {group or 'core'}/{resource}"


# -- what a reviewer reads --------------------------------------------------------------------------


def test_namespaced_objects_are_in_the_gputally_namespace() -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "Namespace"}
    for path, doc in ALL_DOCS:
        where = doc["metadata"].get("namespace")
        if doc["kind"] in cluster_scoped:
            assert where is None, f"{path}: {doc['kind']} is cluster-scoped"
        else:
            assert where == NAMESPACE, f"{path}: {doc['kind']}/{doc['metadata']['name']} in {where!r}"


def test_every_container_has_cpu_and_memory_requests_and_limits() -> None:
    assert workloads()
    for workload in workloads():
        for container in containers(workload):
            resources = container.get("resources", {})
            for kind in ("requests", "limits"):
                missing = {"cpu", "memory"} - set(resources.get(kind, {}))
                assert not missing, f"{workload_id(workload)} {container['name']}: no {kind} for {missing}"


def test_cluster_roles_have_exactly_the_processor_rules() -> None:
    expected = [d for d in documents(PROCESSOR_RBAC) if d["kind"] == "ClusterRole"]
    assert len(expected) == 1
    roles = docs_of("ClusterRole")
    assert len(roles) == 2, [r["metadata"]["name"] for r in roles]
    for role in roles:
        assert canonical_rules(role["rules"]) == canonical_rules(expected[0]["rules"]), role["metadata"]["name"]


def test_bindings_tie_each_service_account_to_its_role_and_workload() -> None:
    for path in (p for p in MANIFESTS if p.name == "rbac.yaml"):
        docs = documents(path)
        (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
        (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
        (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
        ]
        shape_workloads = [d for p in path.parent.glob("*.yaml") for d in documents(p) if d["kind"] in WORKLOAD_KINDS]
        assert shape_workloads, path.parent
        for each in shape_workloads:
            pod = each["spec"]["template"]["spec"]
            if pod.get("automountServiceAccountToken") is False:  # no API access at all (the probe)
                assert "serviceAccountName" not in pod, workload_id(each)
                continue
            assert pod["serviceAccountName"] == account["metadata"]["name"], workload_id(each)


def test_nothing_runs_privileged() -> None:
    for workload in workloads():
        pod = workload["spec"]["template"]["spec"]
        assert not pod.get("hostNetwork") and not pod.get("hostIPC"), workload_id(workload)
        assert not str(pod.get("priorityClassName", "")).startswith("system-"), workload_id(workload)
        pod_security = pod.get("securityContext", {})
        host_paths = {v["name"] for v in pod.get("volumes", []) if "hostPath" in v}
        for container in containers(workload):
            where = f"{workload_id(workload)} {container['name']}"
            sc = container.get("securityContext", {})
            assert sc.get("privileged") is not True, where
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not sc.get("capabilities", {}).get("add"), where
            seccomp = sc.get("seccompProfile", pod_security.get("seccompProfile", {}))
            assert seccomp.get("type") == "RuntimeDefault", where
            assert not any("hostPort" in port for port in container.get("ports", [])), where
            for mount in container.get("volumeMounts", []):
                if mount["name"] in host_paths:
                    assert mount.get("readOnly") is True, f"{where}: host path {mount['mountPath']} is writable"
            if (workload["kind"], workload["metadata"]["name"], container["name"]) in ROOT_CONTAINERS:
                assert sc.get("runAsUser") == 0 and sc.get("runAsNonRoot") is False, where
            else:
                run_as_non_root = sc.get("runAsNonRoot", pod_security.get("runAsNonRoot"))
                run_as_user = sc.get("runAsUser", pod_security.get("runAsUser"))
                assert run_as_non_root is True and run_as_user == 10001, where


def _env(container: dict[str, Any], name: str) -> dict[str, Any]:
    found = [e for e in container.get("env", []) if e["name"] == name]
    assert len(found) == 1, f"{container['name']}: {name} set {len(found)} times"
    return found[0]


def _node_name_from_downward_api(container: dict[str, Any], name: str) -> None:
    assert _env(container, name).get("valueFrom") == {"fieldRef": {"fieldPath": "spec.nodeName"}}, container["name"]


def test_node_daemonset() -> None:
    daemonset = named_workload("DaemonSet", "gputally-node")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    by_name = {c["name"]: c for c in pod["containers"]}
    assert set(by_name) == {"probe", "gputally"}
    probe, sidecar = by_name["probe"], by_name["gputally"]
    volumes = {v["name"]: v for v in pod["volumes"]}

    # The PodResources directory (not the socket: a kubelet restart makes a new one), read-only,
    # in gputally only.
    (pod_resources,) = [n for n, v in volumes.items() if v.get("hostPath", {}).get("path") == POD_RESOURCES_DIR]
    assert volumes[pod_resources]["hostPath"]["type"] == "Directory"
    assert mounts(sidecar)[POD_RESOURCES_DIR] == {
        "name": pod_resources,
        "mountPath": POD_RESOURCES_DIR,
        "readOnly": True,
    }
    assert pod_resources not in {m["name"] for m in probe.get("volumeMounts", [])}
    # The host's /proc at /host/proc, read-only, in both.
    (host_proc,) = [n for n, v in volumes.items() if v.get("hostPath", {}).get("path") == "/proc"]
    for container in (probe, sidecar):
        assert mounts(container)["/host/proc"]["name"] == host_proc
        assert mounts(container)["/host/proc"]["readOnly"] is True
    # This node's name from the downward API.
    _node_name_from_downward_api(probe, "NODE_NAME")
    _node_name_from_downward_api(sidecar, "K8S_NODE_NAME")
    # The NVIDIA container toolkit injects NVML and the devices.
    assert _env(probe, "NVIDIA_VISIBLE_DEVICES")["value"] == "all"
    assert _env(probe, "NVIDIA_DRIVER_CAPABILITIES")["value"] == "utility"
    assert _env(sidecar, "OTEL_EXPORTER_OTLP_ENDPOINT")["value"] == "http://otel-collector.observability.svc:4317"
    # OTLP stays on loopback inside the pod: only the admin port is declared, no container
    # port on the probe.
    assert [p["containerPort"] for p in sidecar.get("ports", [])] == [8888]
    assert not probe.get("ports")
    args = parse_gputally_argv(probe["args"])
    assert (args.command, args.probe, args.endpoint, args.insecure) == ("probe", "nvml", "127.0.0.1:4317", True)
    assert (args.interval, args.proc_root) == ("10s", Path("/host/proc"))


def test_gateway_probe_daemonset() -> None:
    """The gateway shape's probe: PodResources read on the node (the idle GPU's owner travels
    to the gateway as a hint), /proc for cgroup hints, sending to the gateway's Service."""
    daemonset = named_workload("DaemonSet", "gputally-probe")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["automountServiceAccountToken"] is False
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    (probe,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (pod_resources,) = [n for n, v in volumes.items() if v.get("hostPath", {}).get("path") == POD_RESOURCES_DIR]
    assert volumes[pod_resources]["hostPath"]["type"] == "Directory"
    assert mounts(probe)[POD_RESOURCES_DIR] == {"name": pod_resources, "mountPath": POD_RESOURCES_DIR, "readOnly": True}
    (host_proc,) = [n for n, v in volumes.items() if v.get("hostPath", {}).get("path") == "/proc"]
    assert mounts(probe)["/host/proc"] == {"name": host_proc, "mountPath": "/host/proc", "readOnly": True}
    _node_name_from_downward_api(probe, "NODE_NAME")
    assert _env(probe, "NVIDIA_VISIBLE_DEVICES")["value"] == "all"
    assert not probe.get("ports")
    args = parse_gputally_argv(probe["args"])
    assert (args.command, args.probe, args.insecure, args.proc_root) == ("probe", "nvml", True, Path("/host/proc"))
    assert Path(args.pod_resources).parent == Path(POD_RESOURCES_DIR)  # the socket, in the mounted directory
    # It sends to the gateway's Service, on the port the Service serves OTLP/gRPC on.
    (service,) = docs_of("Service")
    host, _, port = args.endpoint.rpartition(":")
    assert host == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert int(port) in {p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"}


def test_only_the_containers_that_mount_pod_resources_run_as_root() -> None:
    mounting = {
        (w["kind"], w["metadata"]["name"], c["name"])
        for w in workloads()
        for c in containers(w)
        if POD_RESOURCES_DIR in mounts(c)
    }
    assert mounting == ROOT_CONTAINERS


def test_gateway_deployment_and_service() -> None:
    (deployment,) = docs_of("Deployment")
    (service,) = docs_of("Service")
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "gputally-gateway"
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    spread = [c["topologyKey"] for c in pod.get("topologySpreadConstraints", [])]
    anti = pod.get("affinity", {}).get("podAntiAffinity")
    assert "kubernetes.io/hostname" in spread or anti, "replicas are not spread across nodes"
    (container,) = pod["containers"]
    assert _env(container, "OTEL_EXPORTER_OTLP_ENDPOINT")["value"] == "http://otel-collector.observability.svc:4317"
    # The slurm processor's token_file lies in the optional Secret's mount.
    token_file = Path(yaml.safe_load((ROOT / "collector-config" / "gateway" / "gputally.yaml").read_text())
                      ["processors"]["slurm"]["slurmrestd"]["token_file"])
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "slurm-token"]
    assert token_file.parent == Path(mount["mountPath"]) and token_file.name == "token"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "slurm-token"]
    assert volume["secret"]["secretName"] == "gputally-slurm" and volume["secret"]["optional"] is True
    resources = container["resources"]
    assert resources["requests"] == {"cpu": "500m", "memory": "512Mi"}
    assert resources["limits"] == {"cpu": "2", "memory": "1Gi"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 4317, "http": 4318, "admin": 8888}
    # The Service: ClusterIP, OTLP only, onto ports the container declares, selecting its pods.
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for port in service["spec"]["ports"]:
        assert ports.get(port["targetPort"]) == port["port"], port
    assert sorted(p["port"] for p in service["spec"]["ports"]) == [4317, 4318]


def test_health_probes_and_config_mounts() -> None:
    """Every gputally server container: liveness /healthz and readiness /readyz on the admin
    port, and its --config file mounted from the shape's ConfigMap key config.yaml."""
    servers = 0
    for workload in workloads():
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in containers(workload):
            args = parse_gputally_argv(container["args"])
            if args.command != "serve":
                continue
            servers += 1
            where = f"{workload_id(workload)} {container['name']}"
            admin_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                http = container[probe]["httpGet"]
                assert http["path"] == path and admin_ports.get(http["port"], http["port"]) == 8888, where
            config = Path(args.config)
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(config.parent)]
            configmap = volumes[mount["name"]]["configMap"]
            assert configmap["name"] == CONFIGMAPS[workload["metadata"]["name"]], where
            assert {"key": "config.yaml", "path": config.name} in configmap.get("items", []), where
    assert servers == 2


def test_one_pinned_image() -> None:
    """Every container runs the same image, by a version tag or a digest, never `latest`."""
    images = {c["image"] for w in workloads() for c in containers(w)}
    assert len(images) == 1, images
    (image,) = images
    assert "@sha256:" in image or ":" in image.rsplit("/", 1)[-1], f"{image}: no tag or digest"
    assert not image.endswith(":latest"), image
