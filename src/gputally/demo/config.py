"""The config ``serve`` runs for the demo: OTLP in on a free loopback port, ``usage`` naming
owners from the recording's cgroups, OTLP/HTTP out to the demo's own sink."""

from __future__ import annotations

import socket

__all__ = ["free_port", "serve_config"]


def free_port() -> int:
    """A free TCP port on loopback (the kernel's pick; released before ``serve`` binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_config(*, grpc_port: int, admin_port: int, sink_port: int, idle_after: str) -> str:
    """YAML for ``gputally serve``. With no Kubernetes API or Slurm to ask, an owner is the
    cgroup its processes ran in (``process.linux.cgroup``, sent by the probe): the demo names
    it from that path. No scheduler allocated the GPU, so allocated time (and cost) lands on
    ``unallocated``; busy time, memory and the idle holder are per owner."""
    return f"""\
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{grpc_port}
processors:
  usage:
    owners:
      - {{kind: cgroup, key: [process.linux.cgroup]}}
    idle_after: {idle_after}
    settle: 0s
    emit_interval: 1s
    default_price_per_gpu_hour: 2.5
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
      processors: [usage]
      exporters: [otlphttp]
    logs:
      receivers: [otlp]
      processors: [usage]
      exporters: [otlphttp]
  telemetry:
    metrics:
      address: 127.0.0.1:{admin_port}
    logs:
      level: warn
  shutdown_timeout: 10s
"""
