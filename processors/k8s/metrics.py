"""The processor's self-metrics, read from runtime state when ``/metrics`` is scraped.

Counting happens in plain ints on the hot path (a prometheus ``Counter.inc`` takes a lock,
which would cost more than the attribution itself); this collector turns them into metric
families at scrape time. One collector per service registry serves every ``k8s`` processor
ID in it, labelled ``processor``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .runtime import K8sRuntime

__all__ = ["K8sCollector"]


class K8sCollector(Collector):
    """``gputally_k8s_*`` for every runtime in ``runtimes`` (processor ID -> runtime)."""

    def __init__(self, runtimes: Mapping[str, K8sRuntime]) -> None:
        self._runtimes = runtimes

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["processor", *labels])

        def counter(name: str, doc: str, *labels: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=["processor", *labels])

        pods = gauge("gputally_k8s_pods_cached", "Pods in the cache, live or deleted (kept for late data).", "state")
        synced = gauge("gputally_k8s_synced", "1 once the first pod list has been applied.")
        restarts = counter(
            "gputally_k8s_watch_restarts",
            "Pod list/watch restarts by reason (timeout: normal end, gone: 410 relist, error, forbidden).",
            "reason",
        )
        events = counter("gputally_k8s_watch_events", "Pod watch events applied.")
        attributed = counter(
            "gputally_k8s_attribution",
            "Resources seen, by how their owner was found (cgroup, podresources, none; pending: not known yet).",
            "signal", "source",
        )
        errors = counter("gputally_k8s_errors", "Failures of metadata sources, by cause.", "source", "cause")
        devices = gauge("gputally_k8s_device_allocations", "GPU allocations in the last PodResources list.")
        owners = gauge("gputally_k8s_owners_cached", "Resolved ReplicaSet/Job owners in the cache.")
        for name, runtime in sorted(self._runtimes.items()):
            store = runtime.store
            pods.add_metric([name, "live"], len(store))
            pods.add_metric([name, "deleted"], store.deleted_count)
            synced.add_metric([name], 1.0 if store.synced else 0.0)
            stats = runtime.reflector.stats
            for reason, count in sorted(stats.restarts.items()):
                restarts.add_metric([name, reason], count)
            events.add_metric([name], stats.events)
            for (signal, source), count in sorted(runtime.attributions.items()):
                attributed.add_metric([name, signal, source], count)
            for (source, cause), count in sorted(runtime.problems.counts.items()):
                errors.add_metric([name, source, cause], count)
            if runtime.podresources is not None and runtime.podresources.devices is not None:
                devices.add_metric([name], runtime.podresources.devices.allocations)
            owners.add_metric([name], len(runtime.owners))
        yield from (pods, synced, restarts, events, attributed, errors, devices, owners)
