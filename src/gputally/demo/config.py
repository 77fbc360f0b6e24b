"""The config ``serve`` runs for the demo: OTLP in on a free loopback port, ``k8s`` (gateway
mode: the pods as the probe's PodResources and CRI hints name them) and ``slurm`` (the demo's
slurmrestd) before ``usage``, OTLP/HTTP out to the demo's own sink."""

from __future__ import annotations

import socket
from pathlib import Path

__all__ = ["PRICE_PER_GPU_HOUR", "ENERGY_PRICE_PER_KWH", "free_port", "kubeconfig", "serve_config"]

PRICE_PER_GPU_HOUR = 3.20
ENERGY_PRICE_PER_KWH = 0.12


def free_port() -> int:
    """A free TCP port on loopback (the kernel's pick; released before ``serve`` binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kubeconfig(path: Path) -> Path:
    """A kubeconfig whose API server is a loopback port nothing listens on: the demo has no
    Kubernetes API, so ``k8s`` names pods from what the node said, as it does while the API
    server is out of reach (the pods' uids, names and namespaces from PodResources and CRI)."""
    path.write_text(f"""\
apiVersion: v1
kind: Config
clusters:
- name: demo
  cluster: {{server: "https://127.0.0.1:{free_port()}", insecure-skip-tls-verify: true}}
users:
- name: demo
  user: {{token: none}}
contexts:
- name: demo
  context: {{cluster: demo, user: demo}}
current-context: demo
""")
    return path


def serve_config(*, grpc_port: int, admin_port: int, sink_port: int, slurmrestd_port: int, kube: Path,
                 node: str, idle_after: str) -> str:
    """YAML for ``gputally serve``: k8s -> slurm -> usage, the usage prices of the demo."""
    return f"""\
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{grpc_port}
processors:
  k8s:
    mode: gateway
    kubeconfig: {kube}
  slurm:
    backend: slurmrestd
    node_name: {node}
    slurmrestd:
      endpoint: http://127.0.0.1:{slurmrestd_port}
      token: demo
  usage:
    idle_after: {idle_after}
    settle: 0s
    emit_interval: 1s
    prices:
      - {{model: "NVIDIA H200*", per_gpu_hour: {PRICE_PER_GPU_HOUR}}}
    energy_price_per_kwh: {ENERGY_PRICE_PER_KWH}
exporters:
  otlphttp:
    endpoint: http://127.0.0.1:{sink_port}
    compression: none
    retry_on_failure:
      enabled: false
service:
  pipelines:
    metrics:
      receivers: [otlp]
      processors: [k8s, slurm, usage]
      exporters: [otlphttp]
    logs:
      receivers: [otlp]
      processors: [k8s, slurm, usage]
      exporters: [otlphttp]
  telemetry:
    metrics:
      address: 127.0.0.1:{admin_port}
    logs:
      level: warn
  shutdown_timeout: 10s
"""
