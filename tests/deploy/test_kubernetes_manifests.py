"""The plain Kubernetes manifests of collector-config/*/kubernetes/ against a real API server.

They are the Helm chart rendered per shape by collector-config/helm/sync.py (test_helm.py
keeps them equal to `helm template`); here they are checked as an operator applies them with
kubectl. Every document goes to the harness's kube-apiserver with ``fieldValidation=Strict``,
so an unknown or misspelled field is an error rather than silently dropped: workloads,
Services, ConfigMaps and PodDisruptionBudgets with ``dryRun=All`` (defaulting, validation and
admission run, PodSecurity included, but nothing is stored), the RBAC objects for real, so that
SubjectAccessReviews can show what each ServiceAccount may do. Broken copies show the
validation is not vacuous. Each shape's config (its configmap.yaml) passes `gputally validate`
in the environment its container sets. The rest reads the YAML for what a reviewer checks by
eye: resources, security contexts, host mounts, the downward API, the RBAC rules (exactly
processors/k8s/rbac.yaml's), and that each shape's addresses meet its otelcol.yaml's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cli_argv import parse_gputally_argv
from .kube_api import (
    WORKLOAD_KINDS,
    apply_document,
    containers,
    ensure_namespace,
    pod_security_violations,
    request,
    submit,
    validate_config,
)

ROOT = Path(__file__).resolve().parents[2]
GPUTALLY = ROOT / ".venv" / "bin" / "gputally"
SHAPES = ("gateway", "sidecar", "pipeline-stage", "scale-out")
MANIFESTS = sorted(ROOT.glob("collector-config/*/kubernetes/*.yaml"))
EXPECTED = {
    "collector-config/gateway/kubernetes/rbac.yaml",
    "collector-config/gateway/kubernetes/configmap.yaml",
    "collector-config/gateway/kubernetes/deployment.yaml",
    "collector-config/gateway/kubernetes/service.yaml",
    "collector-config/gateway/kubernetes/probe-daemonset.yaml",
    "collector-config/sidecar/kubernetes/rbac.yaml",
    "collector-config/sidecar/kubernetes/configmap.yaml",
    "collector-config/sidecar/kubernetes/daemonset.yaml",
    "collector-config/pipeline-stage/kubernetes/rbac.yaml",
    "collector-config/pipeline-stage/kubernetes/configmap.yaml",
    "collector-config/pipeline-stage/kubernetes/daemonset.yaml",
    "collector-config/pipeline-stage/kubernetes/service.yaml",
    "collector-config/scale-out/kubernetes/rbac.yaml",
    "collector-config/scale-out/kubernetes/configmap.yaml",
    "collector-config/scale-out/kubernetes/statefulset.yaml",
    "collector-config/scale-out/kubernetes/service.yaml",
    "collector-config/scale-out/kubernetes/probe-daemonset.yaml",
}
PROCESSOR_RBAC = ROOT / "processors" / "k8s" / "rbac.yaml"
NAMESPACE = "gputally"
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
# Containers allowed to run as uid 0 (still without any capability), and why: the kubelet's
# PodResources socket is writable by root only (see the comment on their securityContext).
# They are exactly the containers that mount it.
ROOT_CONTAINERS = {
    ("DaemonSet", "gputally-node", "gputally"),
    ("DaemonSet", "gputally-node", "probe"),  # engine discovery's capabilities hold for root only
    ("DaemonSet", "gputally-probe", "probe"),
    ("DaemonSet", "gputally-stage", "gputally"),
}
DISCOVERY_CAPABILITIES = ["SYS_ADMIN", "SYS_PTRACE"]
"""What the probe's engine discovery adds, and nothing else does: the listening sockets of
other users' processes (/proc/<pid>/fd) and setns(2) into a pod's network namespace."""
# The gputally server of each shape: its workload and ConfigMap.
SERVERS = {
    "gateway": ("Deployment", "gputally-gateway", "gputally-gateway-config"),
    "sidecar": ("DaemonSet", "gputally-node", "gputally-node-config"),
    "pipeline-stage": ("DaemonSet", "gputally-stage", "gputally-stage-config"),
    "scale-out": ("StatefulSet", "gputally-replica", "gputally-replica-config"),
}
# PodSecurity: the `baseline` checks each DaemonSet fails, and why it cannot avoid them. Every
# other workload meets `restricted`.
BASELINE_VIOLATIONS = {
    # hostPID: NVML's PIDs; /proc, PodResources; engine discovery's two capabilities and cgroupfs
    "gputally-probe": {"host namespaces", "hostPath volumes", "non-default capabilities"},
    "gputally-node": {"host namespaces", "hostPath volumes", "non-default capabilities"},  # the same
    "gputally-stage": {"hostPath volumes"},  # PodResources only: dcgm-exporter sends no processes
}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def shape_of(path: Path) -> str:
    return path.relative_to(ROOT / "collector-config").parts[0]


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


ALL_DOCS = [(shape_of(p), rel(p), d) for p in MANIFESTS for d in documents(p)]


def docs_of(kind: str, shape: str | None = None) -> list[dict[str, Any]]:
    return [d for s, _, d in ALL_DOCS if d["kind"] == kind and shape in (None, s)]


def workloads(shape: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    return [(s, d) for s, _, d in ALL_DOCS if d["kind"] in WORKLOAD_KINDS and shape in (None, s)]


def workload_id(workload: dict[str, Any]) -> str:
    return f"{workload['kind']}/{workload['metadata']['name']}"


def named(kind: str, name: str, shape: str) -> dict[str, Any]:
    (found,) = [d for d in docs_of(kind, shape) if d["metadata"]["name"] == name]
    return found


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def by_name(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in containers(workload)}


def server(shape: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shape's gputally server workload and its `serve` container."""
    kind, name, _ = SERVERS[shape]
    workload = named(kind, name, shape)
    return workload, by_name(workload)["gputally"]


def shape_config(shape: str) -> dict[str, Any]:
    (configmap,) = docs_of("ConfigMap", shape)
    return yaml.safe_load(configmap["data"]["config.yaml"])


def otelcol(shape: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "collector-config" / shape / "otelcol.yaml").read_text())


def canonical_rules(rules: list[dict[str, Any]]) -> list[tuple[tuple[str, ...], ...]]:
    """RBAC rules compared by content: order of rules and of list items is not meaning."""
    return sorted(tuple(tuple(sorted(rule.get(k, []))) for k in sorted(rule)) for rule in rules)


def env_of(container: dict[str, Any], name: str) -> dict[str, Any]:
    found = [e for e in container.get("env", []) if e["name"] == name]
    assert len(found) == 1, f"{container['name']}: {name} set {len(found)} times"
    return found[0]


def node_name_from_downward_api(container: dict[str, Any], name: str) -> None:
    assert env_of(container, name).get("valueFrom") == {"fieldRef": {"fieldPath": "spec.nodeName"}}, container["name"]


@pytest.fixture(scope="module")
def admin(kube_admin: Any) -> Any:
    ensure_namespace(kube_admin, NAMESPACE)
    return kube_admin


# -- the API server's verdict --------------------------------------------------------------------


def test_every_shape_has_its_manifests() -> None:
    assert {rel(p) for p in MANIFESTS} == EXPECTED


@pytest.mark.parametrize("path", MANIFESTS, ids=rel)
def test_the_api_server_accepts_every_document(admin: Any, path: Path) -> None:
    docs = documents(path)
    assert docs, f"{rel(path)} has no documents"
    for doc in docs:
        reply = apply_document(admin, doc)
        assert reply.status in (200, 201), f"{rel(path)}: {doc['kind']}/{doc['metadata']['name']}: {reply}"
        assert not reply.warning, f"{rel(path)}: {doc['kind']}/{doc['metadata']['name']}: {reply.warning}"


def _gateway_deployment() -> dict[str, Any]:
    return yaml.safe_load(yaml.safe_dump(docs_of("Deployment", "gateway")[0]))  # a deep copy


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


def test_pod_security_levels(admin: Any) -> None:
    """The Deployment and the StatefulSet meet the `restricted` Pod Security Standard. The
    DaemonSets break `baseline` only where they must (BASELINE_VIOLATIONS: hostPID, hostPath),
    so their namespace needs `privileged`; nothing privileged, no added capability, no host
    network or ports. The namespaces only warn; dry run stores nothing."""
    restricted, baseline = "gputally-psa-restricted", "gputally-psa-baseline"
    ensure_namespace(admin, restricted, {"pod-security.kubernetes.io/warn": "restricted"})
    ensure_namespace(admin, baseline, {"pod-security.kubernetes.io/warn": "baseline"})

    checked = set()
    for _, workload in workloads():
        name = workload["metadata"]["name"]
        checked.add(name)
        if workload["kind"] != "DaemonSet":
            reply = submit(admin, workload, namespace=restricted)
            assert reply.status == 201 and not reply.warning, f"{workload_id(workload)}: {reply}"
            continue
        reply = submit(admin, workload, namespace=baseline)
        assert reply.status == 201, reply
        assert pod_security_violations(reply.warning) == BASELINE_VIOLATIONS[name], reply.warning
        # Under `restricted`, in addition, only the one root container (ROOT_CONTAINERS).
        reply = submit(admin, workload, namespace=restricted)
        capabilities = {"unrestricted capabilities"} if "non-default capabilities" in BASELINE_VIOLATIONS[name] else set()
        assert pod_security_violations(reply.warning) == BASELINE_VIOLATIONS[name] - {
            "hostPath volumes", "non-default capabilities"} | capabilities | {
            "restricted volume types",  # `restricted` names hostPath so
            "runAsNonRoot != true",
            "runAsUser=0",
        }, reply.warning
        assert "hostPID=true" in reply.warning or "host namespaces" not in BASELINE_VIOLATIONS[name]
    assert checked == {"gputally-gateway", "gputally-probe", "gputally-node", "gputally-stage", "gputally-replica"}


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


# -- each shape's config -------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_the_config_is_valid_in_the_containers_environment(shape: str, tmp_path: Path) -> None:
    """`gputally validate` on configmap.yaml's config.yaml, with only the env the container
    sets (downward-API fields filled in): a `${env:X}` the pod lacks would be an error."""
    workload, container = server(shape)
    (configmap,) = docs_of("ConfigMap", shape)
    assert configmap["metadata"]["name"] == SERVERS[shape][2]
    text = configmap["data"]["config.yaml"]
    pod = workload["spec"]["template"]["spec"]
    assert "valid" in validate_config(GPUTALLY, text, container, tmp_path, pod=pod)


@pytest.mark.parametrize("shape", ["gateway", "sidecar", "scale-out"])
def test_the_config_is_the_shapes_shipped_file(shape: str) -> None:
    """The ConfigMap holds collector-config/<shape>/gputally.yaml, tested as shipped by
    tests/otelcol, with one change: the admin endpoint on the pod's IP."""
    shipped = yaml.safe_load((ROOT / "collector-config" / shape / "gputally.yaml").read_text())
    shipped["service"]["telemetry"]["metrics"]["address"] = "${env:POD_IP}:8888"
    assert shape_config(shape) == shipped


@pytest.mark.parametrize("shape", SHAPES)
def test_the_admin_endpoint_is_on_the_pod_ip(shape: str) -> None:
    """/metrics, /healthz and /readyz listen on the pod's IP from the downward API, on the port
    the container declares as `admin`, and no pod shares the host's network."""
    workload, container = server(shape)
    assert shape_config(shape)["service"]["telemetry"]["metrics"]["address"] == "${env:POD_IP}:8888"
    assert env_of(container, "POD_IP")["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["admin"] == 8888
    assert not workload["spec"]["template"]["spec"].get("hostNetwork")


# -- what a reviewer reads --------------------------------------------------------------------------


def test_namespaced_objects_are_in_the_gputally_namespace() -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "Namespace"}
    for _, path, doc in ALL_DOCS:
        where = doc["metadata"].get("namespace")
        if doc["kind"] in cluster_scoped:
            assert where is None, f"{path}: {doc['kind']} is cluster-scoped"
        else:
            assert where == NAMESPACE, f"{path}: {doc['kind']}/{doc['metadata']['name']} in {where!r}"


def test_no_helm_bookkeeping_in_the_plain_manifests() -> None:
    """kubectl, not Helm, manages these: no managed-by Helm or chart labels."""
    for _, path, doc in ALL_DOCS:
        labels = doc["metadata"].get("labels", {})
        assert "helm.sh/chart" not in labels and "app.kubernetes.io/managed-by" not in labels, path


def test_every_container_has_cpu_and_memory_requests_and_limits() -> None:
    assert workloads()
    for _, workload in workloads():
        for container in containers(workload):
            resources = container.get("resources", {})
            for kind in ("requests", "limits"):
                missing = {"cpu", "memory"} - set(resources.get(kind, {}))
                assert not missing, f"{workload_id(workload)} {container['name']}: no {kind} for {missing}"


def test_cluster_roles_have_exactly_the_processor_rules() -> None:
    expected = [d for d in documents(PROCESSOR_RBAC) if d["kind"] == "ClusterRole"]
    assert len(expected) == 1
    roles = docs_of("ClusterRole")
    assert len(roles) == len(SHAPES), [r["metadata"]["name"] for r in roles]
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
        shape_workloads = workloads(shape_of(path))
        assert shape_workloads, path.parent
        for _, each in shape_workloads:
            pod = each["spec"]["template"]["spec"]
            if pod.get("automountServiceAccountToken") is False:  # no API access at all (the probe)
                assert "serviceAccountName" not in pod, workload_id(each)
                continue
            assert pod["serviceAccountName"] == account["metadata"]["name"], workload_id(each)


def test_nothing_runs_privileged() -> None:
    for _, workload in workloads():
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
            discovers = container["name"] == "probe" and "--no-engine-discovery" not in container.get("args", [])
            assert sc.get("capabilities", {}).get("add", []) == (DISCOVERY_CAPABILITIES if discovers else []), where
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


def test_node_daemonset() -> None:
    daemonset = named("DaemonSet", "gputally-node", "sidecar")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    containers_ = by_name(daemonset)
    assert set(containers_) == {"probe", "gputally"}
    probe, sidecar = containers_["probe"], containers_["gputally"]
    volumes = {v["name"]: v for v in pod["volumes"]}

    # The PodResources directory (not the socket: a kubelet restart makes a new one), read-only,
    # in gputally only.
    (pod_resources,) = [n for n, v in volumes.items() if v.get("hostPath", {}).get("path") == POD_RESOURCES_DIR]
    assert volumes[pod_resources]["hostPath"]["type"] == "Directory"
    assert mounts(sidecar)[POD_RESOURCES_DIR] == {"name": pod_resources, "mountPath": POD_RESOURCES_DIR, "readOnly": True}
    assert pod_resources not in {m["name"] for m in probe.get("volumeMounts", [])}
    assert Path(shape_config("sidecar")["processors"]["k8s"]["pod_resources"]["socket"]).parent == Path(POD_RESOURCES_DIR)
    # The host's /proc at /host/proc, read-only, in both.
    (host_proc,) = [n for n, v in volumes.items() if v.get("hostPath", {}).get("path") == "/proc"]
    for container in (probe, sidecar):
        assert mounts(container)["/host/proc"]["name"] == host_proc
        assert mounts(container)["/host/proc"]["readOnly"] is True
    # This node's name from the downward API.
    node_name_from_downward_api(probe, "NODE_NAME")
    node_name_from_downward_api(sidecar, "K8S_NODE_NAME")
    # The NVIDIA container toolkit injects NVML and the devices.
    assert env_of(probe, "NVIDIA_VISIBLE_DEVICES")["value"] == "all"
    assert env_of(probe, "NVIDIA_DRIVER_CAPABILITIES")["value"] == "utility"
    assert env_of(sidecar, "OTEL_EXPORTER_OTLP_ENDPOINT")["value"] == "http://otel-collector.observability.svc:4317"
    # OTLP stays on loopback inside the pod: only the admin port is declared, no container
    # port on the probe.
    assert [p["containerPort"] for p in sidecar.get("ports", [])] == [8888]
    assert shape_config("sidecar")["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] == "127.0.0.1:4317"
    assert not probe.get("ports")
    args = parse_gputally_argv(probe["args"])
    assert (args.command, args.probe, args.endpoint, args.insecure) == ("probe", "nvml", "127.0.0.1:4317", True)
    assert (args.interval, args.proc_root, args.pod_resources) == ("10s", Path("/host/proc"), "off")


@pytest.mark.parametrize("shape", ["gateway", "scale-out"])
def test_probe_daemonset(shape: str) -> None:
    """The probe of the gateway and scale-out shapes: PodResources read on the node (the idle
    GPU's owner travels as a hint), /proc for cgroup hints, sending to the gateway's Service
    (gateway) or to the collector that spreads nodes over the replicas (scale-out)."""
    daemonset = named("DaemonSet", "gputally-probe", shape)
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
    node_name_from_downward_api(probe, "NODE_NAME")
    assert env_of(probe, "NVIDIA_VISIBLE_DEVICES")["value"] == "all"
    assert not probe.get("ports")
    args = parse_gputally_argv(probe["args"])
    assert (args.command, args.probe, args.insecure, args.proc_root) == ("probe", "nvml", True, Path("/host/proc"))
    assert Path(args.pod_resources).parent == Path(POD_RESOURCES_DIR)  # the socket, in the mounted directory
    host, _, port = args.endpoint.rpartition(":")
    if shape == "gateway":
        # The gateway's Service, on the port it serves OTLP/gRPC on.
        (service,) = docs_of("Service", "gateway")
        assert host == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
        assert int(port) in {p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"}
    else:
        # The collector's OTLP receiver (its metrics/spread pipeline), which routes by host.name.
        collector = otelcol("scale-out")
        assert collector["service"]["pipelines"]["metrics/spread"]["receivers"] == ["otlp"]
        assert collector["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(f":{port}")
        assert host == "otel-collector.observability.svc"


def test_only_the_containers_that_mount_pod_resources_or_discover_engines_run_as_root() -> None:
    needing = {
        (w["kind"], w["metadata"]["name"], c["name"])
        for _, w in workloads()
        for c in containers(w)
        if POD_RESOURCES_DIR in mounts(c)
        or c.get("securityContext", {}).get("capabilities", {}).get("add") == DISCOVERY_CAPABILITIES
    }
    assert needing == ROOT_CONTAINERS


def test_gateway_deployment_and_service() -> None:
    (deployment,) = docs_of("Deployment", "gateway")
    (service,) = docs_of("Service", "gateway")
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "gputally-gateway"
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    spread = [c["topologyKey"] for c in pod.get("topologySpreadConstraints", [])]
    anti = pod.get("affinity", {}).get("podAntiAffinity")
    assert "kubernetes.io/hostname" in spread or anti, "replicas are not spread across nodes"
    (container,) = pod["containers"]
    assert env_of(container, "OTEL_EXPORTER_OTLP_ENDPOINT")["value"] == "http://otel-collector.observability.svc:4317"
    # The slurm processor's token_file lies in the optional Secret's mount, and its endpoint
    # and user come from the env the container sets.
    slurm = shape_config("gateway")["processors"]["slurm"]["slurmrestd"]
    token_file = Path(slurm["token_file"])
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "slurm-token"]
    assert token_file.parent == Path(mount["mountPath"]) and token_file.name == "token"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "slurm-token"]
    assert volume["secret"]["secretName"] == "gputally-slurm" and volume["secret"]["optional"] is True
    assert env_of(container, "SLURMRESTD_URL")["value"] in slurm["endpoint"].replace("${env:SLURMRESTD_URL:-", "")
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
    (budget,) = docs_of("PodDisruptionBudget", "gateway")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_pipeline_stage_meets_its_collector() -> None:
    """gputally on every GPU node, behind a node-local Service: the collector agent's gputally
    processor (collector-config/pipeline-stage/otelcol.yaml) calls its own node's bridge
    (dcgm + k8s in node mode with PodResources) and gets each batch back in the call."""
    daemonset, container = server("pipeline-stage")
    pod = daemonset["spec"]["template"]["spec"]
    assert not pod.get("hostPID")
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    (service,) = docs_of("Service", "pipeline-stage")
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    assert service["spec"]["selector"].items() <= pod_labels(daemonset).items()
    # The collector's gputally processor keeps its port (4320); only the host changes.
    collector = otelcol("pipeline-stage")
    processor = collector["processors"]["gputally"]
    out = int(processor["endpoint"].rpartition(":")[2])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert [(p["port"], ports[p["targetPort"]]) for p in service["spec"]["ports"]] == [(out, 4320)]
    config = shape_config("pipeline-stage")
    assert config["receivers"]["bridge"]["endpoint"] == "0.0.0.0:4320"
    assert config["service"]["pipelines"] == {processor["pipeline"]: {
        "receivers": ["bridge"], "processors": ["memory_limiter", "dcgm", "k8s"], "exporters": ["debug"]}}
    assert collector["service"]["pipelines"]["metrics"]["processors"] == ["memory_limiter", "gputally", "batch"]
    k8s = config["processors"]["k8s"]
    assert k8s["mode"] == "node" and k8s["node_name"] == "${env:K8S_NODE_NAME}"
    assert Path(k8s["pod_resources"]["socket"]).parent == Path(POD_RESOURCES_DIR)
    assert mounts(container)[POD_RESOURCES_DIR]["readOnly"] is True
    node_name_from_downward_api(container, "K8S_NODE_NAME")
    # It exports nothing: the answers go back in the call.
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in {e["name"] for e in container["env"]}


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def test_scale_out_statefulset_and_headless_service() -> None:
    """Replicas keep their name (service.instance.id) and their usage counters (a volume claim
    per replica under usage.storage); the headless Service is the collector's DNS resolver
    target; the replicas send to the collector's otlp/gputally receiver."""
    statefulset, container = server("scale-out")
    (service,) = docs_of("Service", "scale-out")
    assert service["spec"]["clusterIP"] == "None"
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["selector"].items() <= pod_labels(statefulset).items()
    assert statefulset["spec"]["replicas"] == 2
    collector = otelcol("scale-out")
    resolver = collector["exporters"]["loadbalancing"]["resolver"]["dns"]
    default_host = resolver["hostname"].split(":-", 1)[1].rstrip("}")
    assert default_host == f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    assert [p["port"] for p in service["spec"]["ports"]] == [int(resolver["port"])]
    config = shape_config("scale-out")
    storage = Path(config["extensions"][config["processors"]["usage"]["storage"]]["directory"])
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    assert storage.is_relative_to(mount["mountPath"]) and not mount.get("readOnly")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert statefulset["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 10001  # writable by gputally
    back = collector["receivers"]["otlp/gputally"]["protocols"]["grpc"]["endpoint"].rpartition(":")[2]
    assert env_of(container, "OTEL_EXPORTER_OTLP_ENDPOINT")["value"] == f"http://otel-collector.observability.svc:{back}"


def test_health_probes_and_config_mounts() -> None:
    """Every gputally server container: liveness /healthz and readiness /readyz on the admin
    port, and its --config file mounted from the shape's ConfigMap key config.yaml."""
    servers = 0
    for shape, workload in workloads():
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
            (given,) = args.config  # --config is repeatable; the manifests give one
            config = Path(given)
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(config.parent)]
            configmap = volumes[mount["name"]]["configMap"]
            assert configmap["name"] == SERVERS[shape][2], where
            assert {"key": "config.yaml", "path": config.name} in configmap.get("items", []), where
    assert servers == len(SHAPES)


def test_one_pinned_image() -> None:
    """Every container runs the same image, by a version tag or a digest, never `latest`."""
    images = {c["image"] for _, w in workloads() for c in containers(w)}
    assert len(images) == 1, images
    (image,) = images
    assert "@sha256:" in image or ":" in image.rsplit("/", 1)[-1], f"{image}: no tag or digest"
    assert not image.endswith(":latest"), image
