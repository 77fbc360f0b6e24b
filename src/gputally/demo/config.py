"""The config ``serve`` runs for the demo: OTLP in on a loopback port of the kernel's choice, ``k8s`` (gateway
mode: the pods as the probe's PodResources and CRI hints name them) and ``slurm`` (the demo's
slurmrestd) before ``usage``, OTLP/HTTP out to the demo's own sink."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["PRICE_PER_GPU_HOUR", "ENERGY_PRICE_PER_KWH", "kubeconfig", "refused_port", "serve_config"]

PRICE_PER_GPU_HOUR = 3.20
ENERGY_PRICE_PER_KWH = 0.12


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port bound and never listening while the block runs: a connection to it is
    refused, and nothing else can take it meanwhile (a port found free and let go could be)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def kubeconfig(path: Path, port: int) -> Path:
    """A kubeconfig whose API server is ``port`` on loopback, where nothing listens: the demo has no
    Kubernetes API, so ``k8s`` names pods from what the node said, as it does while the API
    server is out of reach (the pods' uids, names and namespaces from PodResources and CRI)."""
    path.write_text(f"""\
apiVersion: v1
kind: Config
clusters:
- name: demo
  cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}
users:
- name: demo
  user: {{token: none}}
contexts:
- name: demo
  context: {{cluster: demo, user: demo}}
current-context: demo
""")
    return path


def serve_config(*, sink_port: int, slurmrestd_port: int, kube: Path, node: str, idle_after: str) -> str:
    """YAML for ``gputally serve``: k8s -> slurm -> usage, the usage prices of the demo. Its
    OTLP receiver and admin endpoint take ports of the kernel's choice, which serve says at
    log level info (:mod:`gputally.util.listening`)."""
    return f"""\
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:0
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
      address: 127.0.0.1:0
    logs:
      level: info
  shutdown_timeout: 10s
"""
