"""The Helm chart collector-config/helm/gputally, with a real helm and a real kube-apiserver.

helm is built from Go modules by tests/harness/helm/build.sh (the `helm` fixture fails when it
is missing). Every shape, and non-default values (AMD and Gaudi probes, Secrets for the
slurmrestd and backend tokens, existing Secrets, monitoring objects, dashboards, a
NetworkPolicy, no persistence, no PodResources, a config override), is rendered with
`helm template`; every object is sent to the harness's API server with strict field
validation and dry run (RBAC for real), the Prometheus Operator objects against the
operator's own CRDs (from its pinned Go module, installed into the test API server: their
full schemas, not a stand-in); PodSecurity is checked per workload; and every rendered config
passes `gputally validate` in the environment its container sets. `helm lint --strict`,
`helm install`, `upgrade` and `uninstall` run against the same API server (no kubelet is
needed: objects are stored, nothing is scheduled). sync.py --check keeps the chart's copies of
configs, alert rules and dashboards, and the plain manifests, in step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.helm.tool import Helm

from .cli_argv import parse_gputally_argv
from .kube_api import (
    WORKLOAD_KINDS,
    apply_document,
    collection_path,
    containers,
    ensure_namespace,
    install_crds,
    pod_security_violations,
    request,
    submit,
    validate_config,
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "collector-config" / "helm" / "gputally"
SYNC = ROOT / "collector-config" / "helm" / "sync.py"
GPUTALLY = ROOT / ".venv" / "bin" / "gputally"
NAMESPACE = "gputally"
MONITORING = [
    "monitoring.podMonitor.enabled=true",
    "monitoring.podMonitor.labels.release=kube-prometheus-stack",
    "monitoring.serviceMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.prometheusRule.labels.release=kube-prometheus-stack",
    "dashboards.enabled=true",
    "networkPolicy.enabled=true",
]
SECRETS = ["slurm.enabled=true", "slurm.token=eyJhbGciOi.jwt", "exporter.token=backend-secret-token"]
EXISTING_SECRETS = ["slurm.enabled=true", "slurm.existingSecret=my-slurm-jwt", "exporter.existingSecret=my-backend"]
VARIANTS: dict[str, list[str]] = {
    "gateway": ["shape=gateway"],
    "gateway-amd": ["shape=gateway", "probe.vendor=amd"],
    "gateway-gaudi": ["shape=gateway", "probe.vendor=gaudi"],
    "gateway-secrets": ["shape=gateway", *SECRETS],
    "gateway-existing-secrets": ["shape=gateway", *EXISTING_SECRETS],
    "gateway-monitoring": ["shape=gateway", *MONITORING],
    "gateway-no-pod-resources": ["shape=gateway", "probe.podResources=false", "probe.engines.discovery=false"],
    "sidecar": ["shape=sidecar"],
    "sidecar-amd-monitoring": ["shape=sidecar", "probe.vendor=amd", *MONITORING],
    "sidecar-gaudi-secrets": ["shape=sidecar", "probe.vendor=gaudi", *SECRETS],
    "pipeline-stage": ["shape=pipeline-stage"],
    "pipeline-stage-slurm-monitoring": ["shape=pipeline-stage", *SECRETS, *MONITORING],
    "scale-out": ["shape=scale-out"],
    "scale-out-slurm-monitoring": ["shape=scale-out", *SECRETS, *MONITORING],
    "scale-out-no-persistence-digest": [
        "shape=scale-out",
        "replica.persistence.enabled=false",
        "image.digest=sha256:" + "0" * 64,
    ],
}
# The `baseline` checks a DaemonSet may fail, and why: hostPID (NVML reports host PIDs),
# hostPath (/proc, the kubelet's PodResources directory, device nodes, /sys, /sys/fs/cgroup)
# and the probe's engine discovery (SYS_ADMIN and SYS_PTRACE, `DISCOVERY`). Nothing else.
UNAVOIDABLE = {"host namespaces", "hostPath volumes", "non-default capabilities"}
DISCOVERY = 'container "probe" must not include "SYS_ADMIN", "SYS_PTRACE" in securityContext.capabilities.add'


def template(helm: Helm, sets: list[str], *, release: str = "gputally", namespace: str = NAMESPACE,
             extra: list[str] | None = None) -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for item in sets:
        args += ["--set", item]
    text = helm.run([*args, *(extra or [])]).stdout
    return [d for d in yaml.safe_load_all(text) if d]


def render(helm: Helm, variant: str) -> list[dict[str, Any]]:
    return template(helm, VARIANTS[variant])


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [d for d in of_kind(docs, kind) if name in (None, d["metadata"]["name"])]
    return found


def servers(docs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) of every `gputally serve` container."""
    return [
        (w, c)
        for w in docs
        if w["kind"] in WORKLOAD_KINDS
        for c in containers(w)
        if parse_gputally_argv(c["args"]).command == "serve"
    ]


def config_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (configmap,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-config")]
    return yaml.safe_load(configmap["data"]["config.yaml"])


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def volumes(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def probe_container(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    for workload in of_kind(docs, "DaemonSet"):
        for container in containers(workload):
            if container["name"] == "probe":
                return workload, container
    raise AssertionError("no probe container")


@pytest.fixture(scope="module")
def api(kube_admin: Any, helm: Helm) -> Any:
    """The admin client, with the gputally namespace and the Prometheus Operator's CRDs."""
    ensure_namespace(kube_admin, NAMESPACE)
    names = install_crds(kube_admin, sorted(helm.crds.glob("*.yaml")))
    assert set(names) == {
        "servicemonitors.monitoring.coreos.com",
        "podmonitors.monitoring.coreos.com",
        "prometheusrules.monitoring.coreos.com",
    }
    return kube_admin


# -- helm's own checks ---------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["gateway", "sidecar", "pipeline-stage", "scale-out-slurm-monitoring"])
def test_helm_lint(helm: Helm, variant: str) -> None:
    args = ["lint", "--strict", str(CHART)]
    for item in VARIANTS[variant]:
        args += ["--set", item]
    out = helm.run(args).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["shape=gatway"], 'shape "gatway": no files/config/gatway.yaml in the chart'),
        (["probe.vendor=intel"], 'probe.vendor "intel": one of amd, gaudi, nvml'),
    ],
    ids=["shape", "vendor"],
)
def test_a_wrong_value_fails_the_render(helm: Helm, sets: list[str], message: str) -> None:
    args = ["template", "gputally", str(CHART)]
    for item in sets:
        args += ["--set", item]
    proc = helm.run(args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


# -- every variant on the API server -------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_api_server_accepts_every_rendered_object(api: Any, helm: Helm, variant: str) -> None:
    docs = render(helm, variant)
    assert servers(docs), variant
    for doc in docs:
        reply = apply_document(api, doc)
        where = f"{variant}: {doc['kind']}/{doc['metadata']['name']}"
        assert reply.status in (200, 201), f"{where}: {reply}"
        assert not reply.warning, f"{where}: {reply.warning}"


def test_the_custom_resources_are_validated_by_their_schemas(api: Any, helm: Helm) -> None:
    """The CRDs' schemas are enforced: a misspelled field of a PodMonitor is refused."""
    monitor = one(render(helm, "gateway-monitoring"), "PodMonitor")
    monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "30s"
    reply = submit(api, monitor)
    assert reply.status == 400 and 'unknown field "spec.podMetricsEndpoints[0].intervall"' in reply.body["message"], reply


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_pod_security(api: Any, helm: Helm, variant: str) -> None:
    """Deployments and StatefulSets meet `restricted`; DaemonSets fail `baseline` only by
    hostPID and hostPath (UNAVOIDABLE), so they need a `privileged` namespace."""
    restricted, baseline = "gputally-psa-restricted", "gputally-psa-baseline"
    ensure_namespace(api, restricted, {"pod-security.kubernetes.io/warn": "restricted"})
    ensure_namespace(api, baseline, {"pod-security.kubernetes.io/warn": "baseline"})
    for workload in render(helm, variant):
        if workload["kind"] not in WORKLOAD_KINDS:
            continue
        where = f"{variant}: {workload['kind']}/{workload['metadata']['name']}"
        if workload["kind"] != "DaemonSet":
            reply = submit(api, workload, namespace=restricted)
            assert reply.status == 201 and not reply.warning, f"{where}: {reply}"
        else:
            reply = submit(api, workload, namespace=baseline)
            assert reply.status == 201 and reply.warning, f"{where}: {reply}"
            assert pod_security_violations(reply.warning) <= UNAVOIDABLE, f"{where}: {reply.warning}"
            if "non-default capabilities" in reply.warning:
                warning = reply.warning.replace('\\"', '"')
                assert DISCOVERY in warning and warning.count("must not include") == 1, f"{where}: {warning}"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_rendered_config_is_valid(helm: Helm, variant: str, tmp_path: Path) -> None:
    docs = render(helm, variant)
    configmaps = {d["metadata"]["name"]: d for d in of_kind(docs, "ConfigMap")}
    secrets = {d["metadata"]["name"]: d["stringData"] for d in of_kind(docs, "Secret")}
    for workload, container in servers(docs):
        pod = workload["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
        text = configmaps[volume["configMap"]["name"]]["data"]["config.yaml"]
        validate_config(GPUTALLY, text, container, tmp_path, pod=pod, secrets=secrets)


# -- what the values do --------------------------------------------------------------------------


def test_amd_probe(helm: Helm) -> None:
    docs = render(helm, "gateway-amd")
    daemonset, probe = probe_container(docs)
    pod = daemonset["spec"]["template"]["spec"]
    assert parse_gputally_argv(probe["args"]).probe == "amd"
    assert pod["nodeSelector"] == {"feature.node.kubernetes.io/amd-gpu": "true"}
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert volumes(daemonset)["dev-kfd"]["hostPath"] == {"path": "/dev/kfd", "type": "CharDevice"}
    assert volumes(daemonset)["dev-dri"]["hostPath"] == {"path": "/dev/dri", "type": "Directory"}
    assert mounts(probe)["/dev/kfd"]["readOnly"] is True and "/dev/dri" in mounts(probe)
    assert {"name": "AMD_VISIBLE_DEVICES", "value": "all"} in probe["env"]
    assert not [e for e in probe["env"] if e["name"].startswith("NVIDIA_")]


def test_gaudi_probe(helm: Helm) -> None:
    for variant in ("gateway-gaudi", "sidecar-gaudi-secrets"):
        daemonset, probe = probe_container(render(helm, variant))
        pod = daemonset["spec"]["template"]["spec"]
        args = parse_gputally_argv(probe["args"])
        assert (args.probe, args.sys_root) == ("gaudi", "/host/sys"), variant
        assert mounts(probe)["/host/sys"]["readOnly"] is True
        assert volumes(daemonset)["host-sys"]["hostPath"]["path"] == "/sys"
        assert pod["nodeSelector"] == {"habana.ai/gaudi": "true"}
        assert {"key": "habana.ai/gaudi", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        assert {"name": "HABANA_VISIBLE_DEVICES", "value": "all"} in probe["env"]


def test_probe_without_pod_resources_or_engine_discovery_runs_as_10001(helm: Helm) -> None:
    daemonset, probe = probe_container(render(helm, "gateway-no-pod-resources"))
    assert parse_gputally_argv(probe["args"]).pod_resources == "off"
    assert probe["securityContext"]["runAsUser"] == 10001 and probe["securityContext"]["runAsNonRoot"] is True
    assert "add" not in probe["securityContext"]["capabilities"] and "--no-engine-discovery" in probe["args"]
    assert "/host/sys/fs/cgroup" not in mounts(probe)
    assert not [v for v in volumes(daemonset).values() if "pod-resources" in v.get("hostPath", {}).get("path", "")]


@pytest.mark.parametrize("variant", ["gateway", "sidecar"])
def test_engine_discovery_adds_its_two_capabilities_and_the_hosts_cgroups(helm: Helm, variant: str) -> None:
    """Discovery (on by default) reads the host's cgroupfs, other users' sockets (SYS_PTRACE)
    and inside pods' network namespaces (SYS_ADMIN), as root; off, only --engine endpoints."""
    daemonset, probe = probe_container(render(helm, variant))
    assert probe["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN", "SYS_PTRACE"]}
    assert probe["securityContext"]["runAsUser"] == 0
    assert mounts(probe)["/host/sys/fs/cgroup"]["readOnly"] is True
    assert volumes(daemonset)["host-cgroup"]["hostPath"]["path"] == "/sys/fs/cgroup"
    assert str(parse_gputally_argv(probe["args"]).cgroup_root) == "/host/sys/fs/cgroup"
    spec = "http://127.0.0.1:8000/metrics,engine=vllm,model=llama-8b"
    _, off = probe_container(template(helm, [f"shape={variant}", "probe.engines.discovery=false",
                                             "probe.engines.endpoints[0]=" + spec.replace(",", "\\,")]))
    args = parse_gputally_argv(off["args"])
    assert args.engine_discovery is False and args.engine == [spec]
    assert "add" not in off["securityContext"]["capabilities"] and "/host/sys/fs/cgroup" not in mounts(off)


def test_tokens_come_from_secrets(helm: Helm) -> None:
    """slurm.token and exporter.token become Secrets, mounted where the config reads them;
    the backend token through the bearertokenauth extension's filename (re-read on rotation)."""
    docs = render(helm, "gateway-secrets")
    secrets = {d["metadata"]["name"]: d for d in of_kind(docs, "Secret")}
    assert secrets["gputally-slurm"]["stringData"] == {"token": "eyJhbGciOi.jwt"}
    assert secrets["gputally-backend"]["stringData"] == {"token": "backend-secret-token"}
    ((deployment, container),) = servers(docs)
    config = config_of(docs)
    vols = volumes(deployment)
    assert vols["slurm-token"]["secret"] == {"secretName": "gputally-slurm", "optional": False, "defaultMode": 0o440}
    assert vols["backend-token"]["secret"]["secretName"] == "gputally-backend"
    token_file = Path(config["processors"]["slurm"]["slurmrestd"]["token_file"])
    assert mounts(container)[str(token_file.parent)]["name"] == "slurm-token"
    backend_file = Path(config["extensions"]["bearertokenauth/backend"]["filename"])
    assert mounts(container)[str(backend_file.parent)]["name"] == "backend-token"
    assert config["exporters"]["otlp"]["auth"] == {"authenticator": "bearertokenauth/backend"}
    assert "bearertokenauth/backend" in config["service"]["extensions"]
    # Nothing secret in the ConfigMap or the pod spec.
    assert "backend-secret-token" not in json.dumps([d for d in docs if d["kind"] != "Secret"])

    # pipeline-stage exports nothing (the bridge answers in the call): no backend token anywhere.
    docs = render(helm, "pipeline-stage-slurm-monitoring")
    assert {d["metadata"]["name"] for d in of_kind(docs, "Secret")} == {"gputally-slurm"}
    assert "backend-secret-token" not in json.dumps(docs)
    assert "bearertokenauth/backend" not in config_of(docs).get("extensions", {})

    docs = render(helm, "gateway-existing-secrets")
    assert not of_kind(docs, "Secret")
    ((deployment, _),) = servers(docs)
    vols = volumes(deployment)
    assert vols["slurm-token"]["secret"]["secretName"] == "my-slurm-jwt" and not vols["slurm-token"]["secret"]["optional"]
    assert vols["backend-token"]["secret"]["secretName"] == "my-backend"


def test_slurm_is_added_before_usage_or_removed(helm: Helm) -> None:
    def pipelines(variant: str) -> dict[str, list[str]]:
        config = config_of(render(helm, variant))
        return {name: p["processors"] for name, p in config["service"]["pipelines"].items()}

    assert pipelines("scale-out-slurm-monitoring") == {
        name: ["memory_limiter", "k8s", "slurm", "usage", "batch"] for name in ("metrics", "logs")
    }
    # A bridge pipeline has no batch (the collector batches): slurm goes last.
    assert pipelines("pipeline-stage-slurm-monitoring") == {"metrics/bridge": ["memory_limiter", "dcgm", "k8s", "slurm"]}
    gateway = config_of(render(helm, "gateway"))
    assert "slurm" not in gateway["processors"]
    assert all("slurm" not in p["processors"] for p in gateway["service"]["pipelines"].values())
    ((_, container),) = servers(render(helm, "gateway"))
    assert not [e for e in container["env"] if e["name"].startswith("SLURMRESTD_")]


def test_config_values_merge_over_the_shapes_file(helm: Helm, tmp_path: Path) -> None:
    override = {"processors": {"usage": {"idle_after": "1h"}, "k8s": {"extract": {"labels": ["cost-center"]}}}}
    docs = template(helm, ["shape=gateway"], extra=["--set-json", "config=" + json.dumps(override)])
    config = config_of(docs)
    assert config["processors"]["usage"]["idle_after"] == "1h"
    assert config["processors"]["usage"]["energy_price_per_kwh"] == 0.12  # kept from the shape's file
    assert config["processors"]["k8s"] == {"mode": "gateway", "extract": {"labels": ["cost-center"]}}
    ((_, container),) = servers(docs)
    (configmap,) = [d for d in of_kind(docs, "ConfigMap")]
    validate_config(GPUTALLY, configmap["data"]["config.yaml"], container, tmp_path)
    # A new config rolls the pods.
    default = one(render(helm, "gateway"), "Deployment")
    annotation = "checksum/config"
    assert one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"][annotation] != (
        default["spec"]["template"]["metadata"]["annotations"][annotation]
    )


def test_image_digest_wins_over_the_tag(helm: Helm) -> None:
    docs = render(helm, "scale-out-no-persistence-digest")
    images = {c["image"] for w in docs if w["kind"] in WORKLOAD_KINDS for c in containers(w)}
    assert images == {"ghcr.io/gputally/gputally@sha256:" + "0" * 64}
    statefulset = one(docs, "StatefulSet")
    assert "volumeClaimTemplates" not in statefulset["spec"]
    assert "emptyDir" in volumes(statefulset)["usage"]


def test_monitoring_objects(helm: Helm) -> None:
    """The PodMonitor and ServiceMonitor reach the admin port of exactly the server pods; the
    PrometheusRule is collector-config/alerts' rules; the NetworkPolicy admits the admin port
    from the scraper only."""
    rules = yaml.safe_load((ROOT / "collector-config" / "alerts" / "gputally.rules.yaml").read_text())
    for variant in ("gateway-monitoring", "sidecar-amd-monitoring", "pipeline-stage-slurm-monitoring",
                    "scale-out-slurm-monitoring"):
        docs = render(helm, variant)
        ((workload, container),) = servers(docs)
        labels = pod_labels(workload)
        port_names = {p["name"] for p in container["ports"]}
        pod_monitor = one(docs, "PodMonitor")
        assert pod_monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= labels.items(), variant
        assert [e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]] == ["admin"]
        assert "admin" in port_names
        # No other pod of the release (the probe) is selected.
        for other in (w for w in docs if w["kind"] in WORKLOAD_KINDS and w is not workload):
            assert not pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels(other).items()
        service_monitor = one(docs, "ServiceMonitor")
        (metrics_service,) = [s for s in of_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics")]
        assert service_monitor["spec"]["selector"]["matchLabels"].items() <= metrics_service["metadata"]["labels"].items()
        assert metrics_service["spec"]["selector"].items() <= labels.items()
        assert [p["targetPort"] for p in metrics_service["spec"]["ports"]] == ["admin"]
        other_services = [s for s in of_kind(docs, "Service") if s is not metrics_service]
        for service in other_services:  # the ServiceMonitor selects only its own Service
            assert not service_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert one(docs, "PrometheusRule")["spec"]["groups"] == rules["groups"]
        policy = one(docs, "NetworkPolicy")
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        admin_rules = [r for r in policy["spec"]["ingress"] if r["ports"] == [{"port": 8888, "protocol": "TCP"}]]
        assert admin_rules == [{"ports": [{"port": 8888, "protocol": "TCP"}], "from": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}]


def test_dashboards_configmaps_hold_the_dashboards(helm: Helm) -> None:
    sources = sorted((ROOT / "collector-config" / "dashboards").glob("gputally-*.json"))
    docs = template(helm, ["dashboards.enabled=true", "dashboards.namespace=monitoring"])
    maps = [d for d in of_kind(docs, "ConfigMap") if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert len(maps) == len(sources)
    held = {}
    for configmap in maps:
        assert configmap["metadata"]["namespace"] == "monitoring"
        assert configmap["metadata"]["annotations"] == {"grafana_folder": "gputally"}
        ((name, text),) = configmap["data"].items()
        held[name] = text
    assert held == {p.name: p.read_text() for p in sources}
    assert not [d for d in render(helm, "gateway") if d["metadata"].get("labels", {}).get("grafana_dashboard")]


# -- the chart's copies and the plain manifests ------------------------------------------------------


def test_the_chart_copies_equal_their_sources() -> None:
    configs = ROOT / "collector-config"
    for shape in ("gateway", "sidecar", "scale-out"):
        assert (CHART / "files" / "config" / f"{shape}.yaml").read_bytes() == (configs / shape / "gputally.yaml").read_bytes()
    assert (CHART / "files" / "alerts" / "gputally.rules.yaml").read_bytes() == (
        configs / "alerts" / "gputally.rules.yaml"
    ).read_bytes()
    sources = {p.name: p.read_bytes() for p in (configs / "dashboards").glob("gputally-*.json")}
    assert {p.name: p.read_bytes() for p in (CHART / "files" / "dashboards").glob("*.json")} == sources


def test_the_plain_manifests_are_the_chart_rendered(helm: Helm) -> None:
    """sync.py --check: collector-config/*/kubernetes/ is `helm template` of each shape, and
    the chart's copies are current (run `python3 collector-config/helm/sync.py` to fix)."""
    proc = subprocess.run(
        [sys.executable, str(SYNC), "--check"],
        capture_output=True, text=True, check=False, env={**os.environ, "HELM": str(helm.binary)},
    )
    assert proc.returncode == 0, proc.stderr


def test_sync_check_notices_a_difference(helm: Helm, tmp_path: Path) -> None:
    """--check is not vacuous: when the chart renders something else than the committed plain
    manifests (here a helm whose output is changed on its way to sync.py, so nothing in the
    working tree is touched), it names the stale files and exits 1."""
    wrapper = tmp_path / "helm"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"'{helm.binary}' \"$@\" | sed 's/verbs: \\[\"list\", \"watch\"\\]/verbs: [\"list\", \"watch\", \"get\"]/'\n"
    )
    wrapper.chmod(0o755)
    proc = subprocess.run(
        [sys.executable, str(SYNC), "--check"],
        capture_output=True, text=True, check=False, env={**os.environ, "HELM": str(wrapper)},
    )
    assert proc.returncode == 1, proc.stderr
    stale = sorted(line.removeprefix("out of date: ") for line in proc.stderr.splitlines() if line.startswith("out of"))
    assert stale == [f"collector-config/{shape}/kubernetes/rbac.yaml"
                     for shape in ("gateway", "pipeline-stage", "scale-out", "sidecar")], proc.stderr


# -- helm install against the API server -------------------------------------------------------------


def test_helm_install_upgrade_uninstall(api: Any, helm: Helm, kube_cluster: Any) -> None:
    """A release stored in the real API server: installed (every object created), upgraded (a
    value changes the Deployment), uninstalled (every object gone). No kubelet runs, so
    nothing is scheduled; helm waits for nothing."""
    namespace, release = "gputally-helm", "gputally-it"
    kubeconfig = kube_cluster.admin_kubeconfig
    sets = ["shape=gateway", *SECRETS, *MONITORING]
    args = ["install", release, str(CHART), "--namespace", namespace, "--create-namespace"]
    for item in sets:
        args += ["--set", item]
    helm.run(args, kubeconfig=kubeconfig)
    try:
        status = json.loads(helm.run(["status", release, "--namespace", namespace, "-o", "json"],
                                     kubeconfig=kubeconfig).stdout)
        assert status["info"]["status"] == "deployed"
        manifest = [d for d in yaml.safe_load_all(status["manifest"]) if d]
        assert {d["kind"] for d in manifest} >= {
            "Deployment", "DaemonSet", "Service", "ConfigMap", "Secret", "ServiceAccount", "ClusterRole",
            "ClusterRoleBinding", "PodDisruptionBudget", "PodMonitor", "ServiceMonitor", "PrometheusRule",
            "NetworkPolicy",
        }
        for doc in manifest:
            reply = request(api, "GET", _object_path(api, doc, namespace))
            assert reply.status == 200, f"{doc['kind']}/{doc['metadata']['name']}: {reply}"
            assert reply.body["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
            assert reply.body["metadata"]["annotations"]["meta.helm.sh/release-name"] == release

        deployment = one(manifest, "Deployment")
        helm.run(["upgrade", release, str(CHART), "--namespace", namespace, "--reuse-values",
                  "--set", "gateway.replicas=3"], kubeconfig=kubeconfig)
        reply = request(api, "GET", _object_path(api, deployment, namespace))
        assert reply.body["spec"]["replicas"] == 3
    finally:
        helm.run(["uninstall", release, "--namespace", namespace], kubeconfig=kubeconfig)
    deadline = time.monotonic() + 30
    for doc in manifest:
        while (reply := request(api, "GET", _object_path(api, doc, namespace))).status != 404:
            assert time.monotonic() < deadline, f"{doc['kind']}/{doc['metadata']['name']} left: {reply}"
            time.sleep(0.2)
    listed = helm.run(["list", "--namespace", namespace, "-o", "json"], kubeconfig=kubeconfig).stdout
    assert json.loads(listed) == []


def _object_path(api: Any, doc: dict[str, Any], namespace: str) -> str:
    where = doc["metadata"].get("namespace", namespace)
    return f"{collection_path(api, doc, where)}/{doc['metadata']['name']}"
