"""Node probes: read GPUs on a node and send raw telemetry as OTLP to ``gputally serve``.

Grouped by what each part does (see ``README.md`` here)::

    core/      vendor-neutral: entities and points, the metric catalog, process facts and
               attribution hints, the kubelet's allocations, OTLP encoding, the interval loop
    snapshot/  what the AMD and Gaudi probes share: the snapshot source, its replay and
               recording, and the collector
    delivery/  the server's exporter (queue, retry) built from the probe's flags
    nvml/ amd/ gaudi/   one subpackage per vendor
    cli        ``gputally probe`` dispatch

Nothing here imports a vendor subpackage except :mod:`~gputally.probes.cli`, the dispatch, and
nothing imports another component: the exporter is found through the registry.
"""
