"""The vendor-neutral core of the node probes: entities and points (``model``), the metric
catalog, process facts and attribution hints, the kubelet's allocations, OTLP encoding
(``otlp_shape``), the collection loop (``runner``) and the options every probe shares
(``command``).

Nothing is re-exported here: every ``gputally`` command loads the probe CLI through its entry
point, and importing the package must stay free (the loop pulls in the exporter helper).
"""
