"""What the deployment-shape tests share: the shipped configs, a real ``gputally serve``
process, the NVML replay as OTLP requests, and counting points in the file exporter's output.

The shapes' configs under ``collector-config/`` are run as shipped; a test changes only what
a user would (addresses, credentials, the backend) with `override`, key by key.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from harness.processes import terminate
from harness.serve import Listening, wait_listening
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gputally.probes.core.allocations import PodAllocations
from gputally.probes.core.otlp_shape import OtlpEncoder
from gputally.probes.nvml.collector import NvmlCollector
from gputally.probes.nvml.replay import ReplaySource, load_recording

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "collector-config"
RECORDING = REPO.parent / "shared" / "fixtures" / "nvml" / "h200-two-workloads.json"
METRICS_EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"

K8S_ADDED = ("k8s.", "container.", "cloud.", "host.type", "gputally.k8s.")
"""Prefixes of the resource keys the k8s processor adds."""
PROBE_SENT = ("gputally.k8s.podresources.holders",)
"""Keys under those prefixes that the probe sends (its PodResources holders hint), never added."""
SLURM_ADDED = ("slurm.",)
"""Prefix of the resource keys the slurm processor adds."""

# (resource attributes, metric name, point attributes, time): one data point's identity.
Key = tuple[frozenset[tuple[str, str]], str, frozenset[tuple[str, str]], int]
_KINDS = ("gauge", "sum", "histogram", "exponentialHistogram", "summary")


def shipped(shape: str, name: str) -> dict[str, Any]:
    """``collector-config/<shape>/<name>`` as a mapping."""
    return yaml.safe_load((CONFIGS / shape / name).read_text())


def override(config: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with each dotted key of ``changes`` set (None deletes it).

    Component ids contain slashes, never dots, so ``"exporters.otlphttp/backend"`` is one path.
    """
    result = copy.deepcopy(dict(config))
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = result
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = copy.deepcopy(value)
    return result


def file_backend(config: Mapping[str, Any], out: Path, pipelines: Iterable[str]) -> dict[str, Any]:
    """``config`` with its backend exporter replaced by a file exporter writing JSON lines to
    ``out``, in ``pipelines``: what "your backend" becomes in a test."""
    changes: dict[str, Any] = {
        "exporters.otlphttp/backend": None,
        "exporters.file/backend": {"path": str(out), "format": "json", "flush_interval": "100ms"},
    }
    for name in pipelines:
        exporters = config["service"]["pipelines"][name]["exporters"]
        changes[f"service.pipelines.{name}.exporters"] = [
            "file/backend" if e == "otlphttp/backend" else e for e in exporters
        ]
    return override(config, changes)


def _value(any_value: Mapping[str, Any]) -> str:
    (kind, value), = any_value.items()
    if kind == "arrayValue":
        return json.dumps([_value(v) for v in value.get("values", [])])
    return str(value)


def _json_attrs(attributes: Iterable[Mapping[str, Any]]) -> frozenset[tuple[str, str]]:
    return frozenset((kv["key"], _value(kv["value"])) for kv in attributes)


def _pb_value(value: Any) -> str:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return json.dumps([_pb_value(v) for v in value.array_value.values])
    return str(getattr(value, kind))


def _pb_attrs(attributes: Iterable[Any]) -> frozenset[tuple[str, str]]:
    return frozenset((kv.key, _pb_value(kv.value)) for kv in attributes)


def file_resources(out: Path) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """Every resource in the file exporter's JSON lines: (attributes, the resourceMetrics).

    Only whole lines are read: the collector may be writing the last one while a test polls."""
    if not out.exists():
        return []
    text = out.read_text()
    found = []
    for line in text[: text.rfind("\n") + 1].splitlines():
        if line.strip():
            for rm in json.loads(line).get("resourceMetrics", []):
                found.append((dict(_json_attrs(rm.get("resource", {}).get("attributes", []))), rm))
    return found


def metrics_of(rm: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The metrics of one resource in the file exporter's output, all scopes together."""
    return [metric for sm in rm.get("scopeMetrics", []) for metric in sm.get("metrics", [])]


USAGE_COUNTERS = {"gputally.usage.allocated.time": "allocated", "gputally.usage.busy.time": "busy",
            "gputally.usage.idle.time": "idle", "gputally.usage.energy": "energy"}


def usage_at_backend(out: Path) -> dict[str, dict[str, Any]]:
    """owner id -> the newest value of each usage counter, and the owner's resource attributes."""
    found: dict[str, dict[str, Any]] = {}
    newest: dict[tuple[str, str], int] = {}
    for attributes, rm in file_resources(out):
        owner = attributes.get("gputally.usage.owner.id")
        if owner is None:
            continue
        entry = found.setdefault(owner, {"attributes": attributes})
        for metric in metrics_of(rm):
            name = USAGE_COUNTERS.get(metric["name"])
            for point in points_of(metric) if name else ():
                at = int(point["timeUnixNano"])
                if at >= newest.get((owner, name), 0):
                    newest[(owner, name)] = at
                    entry[name] = float(point.get("asDouble", 0.0))
                    entry["attributes"] = attributes
    return found


def points_of(metric: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The data points of one metric in the file exporter's output, whatever its kind."""
    return [point for kind in _KINDS for point in metric.get(kind, {}).get("dataPoints", [])]


def file_points(out: Path, drop: Iterable[str] = ()) -> Counter[Key]:
    """Every data point in the file exporter's output, its resource without the keys in ``drop``
    (the attributes gputally added), so it compares with what was sent."""
    dropped = set(drop)
    points: Counter[Key] = Counter()
    for attributes, rm in file_resources(out):
        resource = frozenset((k, v) for k, v in attributes.items() if k not in dropped)
        for metric in metrics_of(rm):
            for point in points_of(metric):
                points[(resource, metric["name"], _json_attrs(point.get("attributes", [])),
                        int(point.get("timeUnixNano", 0)))] += 1
    return points


def points_at(out: Path, times: set[int], added: tuple[str, ...] = ()) -> Counter[Key]:
    """The output's points with a timestamp in ``times`` (the test's own, not its warm-up's),
    their resources without the keys that start with one of ``added`` (what the pipeline adds)."""
    drop = {k for attributes, _ in file_resources(out) for k in attributes
            if added and k.startswith(added) and k not in PROBE_SENT}
    return Counter({key: n for key, n in file_points(out, drop=drop).items() if key[3] in times})


def resource_times(rm: Mapping[str, Any]) -> set[int]:
    """The timestamps of the points of one resource in the file exporter's output."""
    return {int(point.get("timeUnixNano", 0)) for metric in metrics_of(rm) for point in points_of(metric)}


def request_points(requests: Iterable[ExportMetricsServiceRequest]) -> Counter[Key]:
    """Every data point in ``requests``, keyed as `file_points` keys them."""
    points: Counter[Key] = Counter()
    for request in requests:
        for rm in request.resource_metrics:
            resource = _pb_attrs(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for point in getattr(metric, metric.WhichOneof("data")).data_points:
                        points[(resource, metric.name, _pb_attrs(point.attributes), point.time_unix_nano)] += 1
    return points


def added_keys(out: Path, sent: Counter[Key]) -> set[str]:
    """Resource keys in the output that no sent resource had: what the pipeline added."""
    had = {k for key in sent for k, _ in key[0]}
    return {k for attributes, _ in file_resources(out) for k in attributes} - had


async def replay_requests(recording: Mapping[str, Any], cycles: int, node: str, *,
                          pod_resources: Path | None = None) -> list[ExportMetricsServiceRequest]:
    """What the NVIDIA probe sends for the first ``cycles`` snapshots of a recording.

    ``pod_resources``: the node's kubelet socket (a `tests.processors.k8s.kubelet.Kubelet` serving it):
    the probe asks it every cycle and its GPUs carry their holders, as ``--pod-resources``
    makes the real probe do (the runner's two steps, :mod:`gputally.probes.core.allocations`)."""
    source = ReplaySource(copy.deepcopy(dict(recording)))
    probe = NvmlCollector(source, source, node_name=node, events=False)
    allocations = PodAllocations(pod_resources, refresh_s=1e-9) if pod_resources is not None else None
    encoder = OtlpEncoder()
    requests = []
    try:
        for _ in range(cycles):
            cycle = await probe.collect()
            if allocations is not None:
                await allocations.refresh()
                allocations.decorate(cycle.entities)
            requests.append(encoder.metrics(cycle.entities, cycle.time_ns))
    finally:
        await probe.close()
        if allocations is not None:
            await allocations.close()
    return requests


RECORDED_POD_UID = "6ee8558e-a273-417d-9a57-57f3c7773bd4"
RECORDED_CONTAINER = "2cbbbe2a9f38fa2255006fd6faed661a55f92bf6f924aae08261634ab5ff0f67"
RECORDED_GPU = "GPU-1e061ec2-3930-fe87-1e34-cb91101c1bd9"


def h200_recording(*, pod_uid: str | None = None, slurm_job: int | None = None) -> dict[str, Any]:
    """The H200 recording, its Kubernetes process moved into pod ``pod_uid`` and its Slurm
    process into job ``slurm_job`` (the API server and slurmctld choose those ids)."""
    recording = copy.deepcopy(load_recording(RECORDING))
    for snapshot in recording["snapshots"]:
        for facts in snapshot.get("proc_facts", {}).values():
            cgroup = facts.get("cgroup") or ""
            if pod_uid:
                cgroup = cgroup.replace(RECORDED_POD_UID.replace("-", "_"), pod_uid.replace("-", "_"))
            if slurm_job is not None:
                cgroup = cgroup.replace("/job_4242/", f"/job_{slurm_job}/")
            if cgroup:
                facts["cgroup"] = cgroup
            if slurm_job is not None and facts.get("env_selected", {}).get("SLURM_JOB_ID") == "4242":
                facts["env_selected"]["SLURM_JOB_ID"] = str(slurm_job)
    return recording


async def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def quiet(out: Path, seconds: float = 1.5, timeout: float = 30.0) -> None:
    """Wait until ``out`` has not grown for ``seconds``: what a stopped gputally sent last (its
    final usage counters) went through the collector's batch processor into the file. Stopping
    the collector earlier can make its v0.161 file exporter panic on a batch flushed at shutdown."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    size, since = -1, loop.time()
    while loop.time() < deadline:
        now = out.stat().st_size if out.exists() else 0
        if now != size:
            size, since = now, loop.time()
        elif loop.time() - since >= seconds:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{out} kept growing for {timeout} s")


async def warm_up(export: Any, request: ExportMetricsServiceRequest, out: Path, keys: Iterable[str],
                  log_tail: Callable[[], str], timeout: float = 30.0) -> None:
    """Send earlier copies of ``request`` until the backend shows each of ``keys`` on some
    resource: caches fill in the background, and the test's own points must meet them warm.
    The copies' points have other timestamps, so they never count as the test's."""
    wanted = list(keys)

    def warm() -> bool:
        seen = [a for a, _ in file_resources(out)]
        return all(any(key in a for a in seen) for key in wanted)

    deadline = asyncio.get_running_loop().time() + timeout
    n = 0
    while not warm():
        assert asyncio.get_running_loop().time() < deadline, f"never attributed {wanted}:\n{log_tail()}"
        n += 1
        await export(retimed(request, -n * 10**12).SerializeToString(), timeout=5)
        for _ in range(5):
            if warm():
                return
            await asyncio.sleep(0.1)


def retimed(request: Any, delta_ns: int) -> Any:
    """A copy of ``request`` with every point moved by ``delta_ns``: the same resources,
    points that cannot be mistaken for the real ones."""
    copy = type(request).FromString(request.SerializeToString())
    for rm in copy.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in getattr(metric, metric.WhichOneof("data")).data_points:
                    point.time_unix_nano += delta_ns
    return copy


class GputallyProcess:
    """``gputally serve --config FILE`` as its own process, stopped by pid (SIGTERM drains).

    Configure its listeners on ``127.0.0.1:0``: `start` reads back where they listen."""

    def __init__(self, config: Mapping[str, Any], workdir: Path, *, name: str = "gputally",
                 env: Mapping[str, str] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.config_path = workdir / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        self.log_path = workdir / f"{name}.log"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.listening = Listening()
        """Where it listens, once started."""

    def start(self, timeout: float = 30.0) -> GputallyProcess:
        """Start, and wait until it has started and said where it listens."""
        executable = Path(sys.executable).with_name("gputally")
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(executable), "serve", "--config", str(self.config_path)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                start_new_session=True,
            )
        self.listening = wait_listening(self.proc, self.log_path, timeout, name=self.name)
        return self

    def port(self, transport: str = "grpc", receiver: str | None = None) -> int:
        """The port of ``receiver``'s ``transport`` (`Listening.port`)."""
        return self.listening.port(transport, receiver)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM by pid, SIGKILL after ``timeout``; the exit code. Idempotent."""
        return terminate(self.proc, timeout) if self.proc is not None else None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def scale_out_start(
    otelcol: Callable[..., Any], replicas: list[GputallyProcess], workdir: Path, out: Path, *,
    replica: Callable[[int], Mapping[str, Any]], front: Callable[[Any], Mapping[str, Any]] | None = None,
) -> Callable[[Any], Any]:
    """``start(ports)`` for ``start_on_ports``: the scale-out shape (collector-config/scale-out/)
    with two ``gputally serve`` replicas on port 0, then the front collector, told their ports
    and writing ``metrics/attributed`` and ``logs`` to ``out``. The replicas export to the
    collector's otlp/gputally receiver, so they are told its port (``ports["return"]``) first:
    when another process took it, everything is started again. ``replica(n)`` is replica
    ``n``'s config changes beyond its listeners; ``front(ports)`` the collector's. ``replicas`` holds
    the replicas started (the test stops them)."""

    def start(ports: Any) -> Any:
        replicas.clear()
        try:
            for n in range(2):
                replicas.append(GputallyProcess(override(shipped("scale-out", "gputally.yaml"), {
                    "receivers.otlp.protocols.grpc.endpoint": "127.0.0.1:0",
                    "service.telemetry.metrics.address": "127.0.0.1:0",
                    **replica(n),
                }), workdir / f"replica-{n}", name=f"replica-{n}", env={
                    "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{ports['return']}",
                }).start())
            config = file_backend(override(shipped("scale-out", "otelcol.yaml"), {
                "receivers.otlp.protocols.grpc.endpoint": "127.0.0.1:0",
                "receivers.otlp/gputally.protocols.grpc.endpoint": f"127.0.0.1:{ports['return']}",
                # No DNS here: the replicas by address.
                "exporters.loadbalancing.resolver": {"static": {"hostnames": [
                    f"127.0.0.1:{r.port('grpc')}" for r in replicas]}},
                **(front(ports) if front is not None else {}),
            }), out, ["metrics/attributed", "logs"])
            return otelcol(lambda _: config, name="front", ports=ports)
        except BaseException:  # PortTaken (started again), or the test fails
            for r in replicas:
                r.stop()
            raise

    return start


def prometheus_counters(url: str, prefix: str) -> dict[str, float]:
    """Sum of each Prometheus series whose name starts with ``prefix`` at ``url``, by
    ``name{labels}`` as written."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            series, _, value = line.rpartition(" ")
            found[series] = found.get(series, 0.0) + float(value)
    return found
