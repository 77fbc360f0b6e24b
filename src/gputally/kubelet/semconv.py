"""Attribute names the ``k8s`` processor reads (probe hints) and writes (attribution).

Written names follow the OpenTelemetry semantic conventions where one exists; what the
conventions lack lives under ``gputally.k8s.*`` so no semconv namespace is squatted.
"""

from __future__ import annotations

__all__ = [
    "ATTRIBUTION",
    "CLOUD_AVAILABILITY_ZONE",
    "CLOUD_PROVIDER",
    "CLOUD_REGION",
    "CONTAINER_ID",
    "CONTAINER_NAME",
    "CRONJOB_NAME",
    "DAEMONSET_NAME",
    "DEPLOYMENT_NAME",
    "HOST_TYPE",
    "JOB_NAME",
    "NAMESPACE_NAME",
    "NODE_NAME",
    "OWNER_KIND",
    "OWNER_NAME",
    "PODS",
    "PODRESOURCES_HOLDERS",
    "PODRESOURCES_UIDS",
    "POD_UIDS",
    "POD_ANNOTATION_PREFIX",
    "POD_LABEL_PREFIX",
    "POD_NAME",
    "POD_UID",
    "REPLICASET_NAME",
    "STATEFULSET_NAME",
    "WRITTEN_PREFIXES",
]

# --- read: what the probe sends (see probes/core/hints.py and probes/core/collector.py) -------------
HW_ID = "hw.id"
"""GPU UUID (``GPU-...``), MIG device UUID (``MIG-...``) or another vendor's device id."""
HW_NAME = "hw.name"
"""``nvidia<minor>`` for NVIDIA GPUs: the ``/dev/nvidiaN`` minor, as some device plugins name devices."""
HW_PARENT = "hw.parent"
"""On a MIG device: the UUID of its GPU."""
GPU_INDEX = ("gputally.gpu.index", "hw.gpu.index")
"""The GPU's index as the driver numbers it (first key present wins)."""
GPU_PCI_BUS_ID = ("gputally.gpu.pci.bus_id", "hw.gpu.pci_bus_id")
MIG_GPU_INSTANCE = "gputally.gpu.mig.gpu_instance_id"
MIG_COMPUTE_INSTANCE = "gputally.gpu.mig.compute_instance_id"
PROCESS_PID = "process.pid"
PROCESS_CGROUP = "process.linux.cgroup"
"""The text of ``/proc/PID/cgroup`` as the probe read it."""
PROCESS_START = "process.creation.time"
"""ISO 8601 start time: with the pid, identifies a process even after its pid is reused."""
PODRESOURCES_HOLDERS = "gputally.k8s.podresources.holders"
"""On a GPU or MIG device: what the kubelet's PodResources API said on the node (the probe
read it, see probes/core/allocations.py), a sorted array of ``namespace/pod/container/resource``.
Empty: the kubelet was asked and nobody holds the device; absent: nothing is known."""
PODRESOURCES_UIDS = "gputally.k8s.podresources.uids"
"""On a GPU or MIG device beside the holders hint: the uid of each holding pod, as the
container runtime (CRI) on the node said it, a sorted array of ``namespace/pod/uid``. Pods the
runtime did not list are left out; absent: the runtime was not asked."""

# --- written -------------------------------------------------------------------------
POD_NAME = "k8s.pod.name"
POD_UID = "k8s.pod.uid"
NAMESPACE_NAME = "k8s.namespace.name"
CONTAINER_NAME = "k8s.container.name"
CONTAINER_ID = "container.id"
NODE_NAME = "k8s.node.name"
REPLICASET_NAME = "k8s.replicaset.name"
DEPLOYMENT_NAME = "k8s.deployment.name"
STATEFULSET_NAME = "k8s.statefulset.name"
DAEMONSET_NAME = "k8s.daemonset.name"
JOB_NAME = "k8s.job.name"
CRONJOB_NAME = "k8s.cronjob.name"
POD_LABEL_PREFIX = "k8s.pod.label."
POD_ANNOTATION_PREFIX = "k8s.pod.annotation."
CLOUD_PROVIDER = "cloud.provider"
CLOUD_REGION = "cloud.region"
CLOUD_AVAILABILITY_ZONE = "cloud.availability_zone"
HOST_TYPE = "host.type"
OWNER_KIND = "gputally.k8s.owner.kind"
"""Kind of the pod's top-level controller: ``Deployment``, ``StatefulSet``, ``Job``, ``CronJob``,
``DaemonSet``, ``ReplicaSet``, or a custom resource's kind (``RayCluster``...)."""
OWNER_NAME = "gputally.k8s.owner.name"
PODS = "gputally.k8s.pods"
"""On a device: every pod holding it, as a sorted array of ``namespace/name``."""
POD_UIDS = "gputally.k8s.pod.uids"
"""On a device: every holding pod with its uid where known (API server, CRI, or the probe's
hint), as a sorted array of ``namespace/name/uid`` (``namespace/name/`` where not): what
accounts a device's holders by uid."""
ATTRIBUTION = "gputally.k8s.attribution"
"""How the owner was found: ``cgroup``, ``podresources`` or ``none``."""

WRITTEN_PREFIXES = ("k8s.", "container.id", "cloud.", "host.type", "gputally.k8s.")
"""A resource already holding one of these keys keeps its value (attributes are inserted, never overwritten)."""
