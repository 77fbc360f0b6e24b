"""``gputally probe nvml`` exactly as the command runs, plus one observer: after each batch the
exporter accepted (``export`` returned, so the probe counts it as handed over), one line
``<signal> <time_unix_nano> <items>`` is appended to ``GPUTALLY_ACCEPTED_LOG``.

Run by ``test_queue_crash.py`` as a subprocess it kills with SIGKILL; everything else (replay
source, collector, exporter, queue on disk) is the shipped code.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from gputally.cli.main import main
from gputally.exporterhelper.sender import QueuedExporter
from gputally.otlp.batch import Batch
from gputally.pipeline.component import Exporter
from gputally.probes.delivery import exporter as delivery


def first_point_time(batch: Batch) -> int:
    for rm in batch.message.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points = getattr(metric, metric.WhichOneof("data")).data_points
                if points:
                    return int(points[0].time_unix_nano)
    return 0


class Observed(Exporter):
    def __init__(self, inner: QueuedExporter, log_path: str) -> None:
        self._inner = inner
        self._log = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    @property
    def ready(self) -> bool:
        return self._inner.ready

    def __getattr__(self, name: str) -> Any:
        """The rest (add_listener, queued, capacity, destination) is the real exporter's."""
        return getattr(self._inner, name)

    async def start(self) -> None:
        await self._inner.start()

    async def shutdown(self) -> None:
        await self._inner.shutdown()

    async def export(self, batch: Batch) -> None:
        await self._inner.export(batch)
        if batch.signal.value == "metrics":
            self._log.write(f"metrics {first_point_time(batch)} {batch.items}\n")


def create_exporter(**kwargs: Any) -> tuple[str, Exporter]:
    exporter_id, exporter = _create(**kwargs)
    return exporter_id, Observed(exporter, os.environ["GPUTALLY_ACCEPTED_LOG"])


_create = delivery.create_exporter
delivery.create_exporter = create_exporter  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
