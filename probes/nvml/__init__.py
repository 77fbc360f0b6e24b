"""The NVIDIA probe (``gputally probe nvml``), in layers::

    DeviceSource   live (pynvml) | replay (recordings) | record (wraps either); source names the calls
    ProcessInfoSource   hints.ProcFs (a host /proc) | replay (recorded proc_facts)
        -> collector   one cycle: NVML initialised once, GPUs read concurrently in worker threads
        -> entities    readings -> entities with points and log entries, through the pure mapping
                       modules device_metrics, process_metrics, gpm, events (the core catalog
                       names them)

The vendor-neutral core (:mod:`gputally.probes.core`, :mod:`gputally.probes.delivery`) does the rest for every vendor: allocations, OTLP shape, the
runner and delivery.
"""
