"""The ``slurm`` processor at run time: each resource (a GPU, or a process on a GPU) gets the
``slurm.*`` attributes of the job that owns it.

Per resource, once per batch (never per data point):

* A process (``process.pid``): the job from its ``process.linux.cgroup`` hint (the shared
  :func:`~gputally.cgroup.parse.parse_cgroup`); when that says nothing and the resource
  comes from this node, from this node's /proc (cgroup, then ``SLURM_JOB_ID`` in its
  environment), read in the background. A resource with the cgroup hint and neither a pid
  nor ``hw.id`` (an inference engine read as ``--engine URL,cgroup=PATH``) goes by its cgroup.
* A GPU (``hw.id`` without ``process.pid`` or ``hw.parent``): the job holding its GRES index
  on its node (``host.name``), from the running jobs' allocations, so an allocated idle GPU
  has an owner.

Job metadata comes from :class:`~gputally.processors.slurm.jobs.JobCache`; ``process`` only
reads memory and queues lookups. Each answer is memoised under the resource's encoding until
one of the caches it came from changes, because an entity sends the same resource every
cycle and reading attributes from Python is the expensive part. The attributes are spliced
into the request's encoding (:mod:`gputally.otlp.splice`), so its points are never decoded.
A resource that already carries ``slurm.job.id`` is left alone (an upstream gputally
attributed it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from prometheus_client import CollectorRegistry, Counter

from gputally.cgroup.parse import CgroupInfo, parse_cgroup
from gputally.errors import ConfigError
from gputally.otlp.batch import Batch
from gputally.otlp.signals import Signal
from gputally.otlp.splice import split
from gputally.pipeline.component import ComponentContext, CountedRuntime, RuntimeProcessor
from gputally.util.tasks import supervised

from .attributes import JOB_ID, resource_blob
from .backends import Backend, make_backend
from .config import SlurmConfig
from .gres import GpuMap, GresConf, nvidia_minors
from .jobs import JobCache
from .local import Found, LocalProcesses
from .model import JobInfo

__all__ = ["SlurmProcessor", "SlurmRuntime", "create"]

log = logging.getLogger(__name__)

# What the NVIDIA probe sends (probes/core/collector.py, probes/core/hints.py).
HW_ID = "hw.id"
HW_NAME = "hw.name"
"""``nvidia<minor>`` for a GPU whose device minor NVML reported (``gpu<index>`` otherwise)."""
HW_PARENT = "hw.parent"
"""Set on MIG devices, which have no GRES index of their own here."""
GPU_INDEX = "gputally.gpu.index"
BUS_ID = "gputally.gpu.pci.bus_id"
HOST = "host.name"
PID = "process.pid"
CGROUP = "process.linux.cgroup"
START = "process.creation.time"
_HINTS = frozenset({HW_ID, HW_NAME, HW_PARENT, GPU_INDEX, BUS_ID, HOST, PID, CGROUP, START})
_NVIDIA_MINOR = re.compile(r"nvidia(\d+)")
_PARSED_LIMIT = 4096
_BLOB_LIMIT = 4096
_MEMO_LIMIT = 8192
"""Resources remembered by their encoding; a GPU node sends the same few dozen every cycle."""
_STOP_TIMEOUT = 5.0


@dataclass(frozen=True)
class _Metrics:
    resources: Counter
    """Resources seen, by how they were attributed (``cgroup``, ``environ``, ``gres``, ``none``)."""
    lookups: Counter
    backend_errors: Counter


def _metrics(registry: CollectorRegistry) -> _Metrics:
    """The counter families; made once per service and kept in its shared store."""
    return _Metrics(
        resources=Counter("gputally_slurm_resources", "Resources seen by how their Slurm job was found.",
                          ["processor", "source"], registry=registry),
        lookups=Counter("gputally_slurm_lookups", "Job metadata lookups by outcome.",
                        ["processor", "outcome"], registry=registry),
        backend_errors=Counter("gputally_slurm_backend_errors",
                               "Failed calls to the Slurm backend (each one a gap in fresh metadata).",
                               ["processor", "backend"], registry=registry),
    )


@dataclass(frozen=True, slots=True)
class _Answer:
    """What one resource gets: the blob to merge (or none), how its job was found, and what
    to keep fresh while the answer is reused (the job's cache entry, the node's allocations)."""

    blob: bytes | None = None
    source: str | None = None
    job_id: int | None = None
    node: str | None = None


_NOTHING = _Answer()


@dataclass(frozen=True, slots=True)
class _Memo:
    generation: tuple[int, int, int]
    answer: _Answer


class SlurmRuntime(CountedRuntime):
    """What the ``slurm`` processors of one ID share across pipelines: the backend, the job
    cache and its polling, the /proc reader, the GPU map and the counters. One per processor
    ID and service, so the gateway's metrics and logs pipelines poll Slurm once and log each
    outage once. :meth:`acquire` / :meth:`release` count the pipelines using it: the first
    starts the background work, the last stops it."""

    def __init__(
        self,
        config: SlurmConfig,
        *,
        backend: Backend,
        node_name: str,
        local_hosts: frozenset[str] = frozenset(),
        gpu_map: GpuMap | None = None,
        component_id: str = "slurm",
        registry: CollectorRegistry | None = None,
        metrics: _Metrics | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self.node_name = node_name
        self.local_hosts = local_hosts | {node_name}
        self.id = component_id
        self.registry = registry or CollectorRegistry()
        """Where this processor's counters live (the service's ``/metrics`` registry)."""
        metrics = metrics or _metrics(self.registry)
        self.by_source = {s: metrics.resources.labels(processor=component_id, source=s)
                          for s in ("cgroup", "environ", "gres", "none")}
        lookups = {
            o: metrics.lookups.labels(processor=component_id, outcome=o) for o in ("found", "not_found", "error")
        }
        errors = metrics.backend_errors.labels(processor=component_id, backend=backend.name)
        cache = config.cache
        self.jobs = JobCache(
            backend, ttl=cache.ttl, negative_ttl=cache.negative_ttl, max_entries=cache.max_entries,
            refresh_interval=cache.refresh_interval,
            on_lookup=lambda outcome: lookups[outcome].inc(), on_error=errors.inc,
        )
        self.local = (
            LocalProcesses(config.proc_root, ttl=cache.ttl, max_entries=cache.max_entries, on_found=self.jobs.get)
            if config.proc_root is not None else None
        )
        self.gpus = gpu_map or GpuMap(minors=config.gres.minors, learn=config.gres.learn_from_processes)
        self._tasks: list[asyncio.Task[None]] = []

    async def _start_work(self) -> None:
        await self.backend.start()
        self._tasks.append(supervised(self.jobs.run(), name=f"{self.id}: slurm job lookups"))
        if self.local is not None:
            self._tasks.append(supervised(self.local.run(), name=f"{self.id}: slurm /proc lookups"))
        log.info("%s: attributing Slurm jobs through %s", self.id, self.backend.name)

    async def _stop_work(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(task, _STOP_TIMEOUT)
        await self.backend.close()

    @property
    def running(self) -> bool:
        """Its background lookups run (some pipeline has started it and not stopped it)."""
        return bool(self._tasks)

    def degraded(self) -> str | None:
        return self.jobs.degraded()

    async def settle(self) -> None:
        """Wait until every lookup queued so far has been answered (for tests and one-shot tools)."""
        if self.local is not None:
            await self.local.settle()
        await self.jobs.settle()

    def generation(self) -> tuple[int, int, int]:
        local = self.local.generation if self.local is not None else 0
        return (self.jobs.generation, local, self.gpus.generation)


class SlurmProcessor(RuntimeProcessor[SlurmRuntime]):
    """Adds ``slurm.*`` resource attributes; see the module docstring. One per pipeline, over
    the processor ID's shared :class:`SlurmRuntime`."""

    def __init__(self, runtime: SlurmRuntime, *, signal: Signal) -> None:
        super().__init__(runtime)
        self.config = runtime.config
        self.signal = signal
        self._parsed: dict[str, CgroupInfo] = {}
        self._blobs: dict[tuple[Any, ...], bytes] = {}
        self._memos: dict[bytes, _Memo] = {}

    @property
    def backend(self) -> Backend:
        return self.runtime.backend

    @property
    def registry(self) -> CollectorRegistry:
        return self.runtime.registry

    async def lookups_answered(self) -> None:
        """Wait until every lookup queued so far has been answered (for tests and one-shot tools)."""
        await self.runtime.settle()

    # --- the hot path ----------------------------------------------------------------------

    async def process(self, batch: Batch) -> Batch | None:
        changed = False
        runtime = self.runtime
        counts = dict.fromkeys(runtime.by_source, 0)
        generation = runtime.generation()
        memos = self._memos
        request = split(batch.serialize())  # resources as bytes: the points are never decoded
        for entry in request.entries:
            # Reading attributes from Python costs ~0.4 us each, and an entity sends the same
            # resource encoding every cycle. Answers are reused until one of the caches they
            # came from changes (its generation grows).
            key = entry.resource
            memo = memos.get(key)
            if memo is not None and memo.generation == generation:
                answer = memo.answer
                if answer.job_id is not None:
                    runtime.jobs.get(answer.job_id)  # keeps the job's TTL refresh and LRU place
                if answer.node is not None:
                    runtime.jobs.allocations(answer.node)  # keeps the node's allocations refreshed
            else:
                answer = self._attribution(Resource.FromString(key))
                if len(memos) >= _MEMO_LIMIT:
                    memos.clear()
                memos[key] = _Memo(generation, answer)
            if answer.source is not None:
                counts[answer.source] += 1
            if answer.blob is not None:
                entry.resource = key + answer.blob  # appended KeyValues are added attributes
                changed = True
        for source, count in counts.items():
            if count:
                runtime.by_source[source].inc(count)
        if changed:
            batch.rewrite(request.SerializeToString())
        return batch

    def _attribution(self, resource: Any) -> _Answer:
        hints: dict[str, Any] = {}
        present: set[str] = set()
        for kv in resource.attributes:
            key = kv.key
            if key in _HINTS:
                hints[key] = kv.value
            elif key.startswith("slurm."):
                present.add(key)
        if JOB_ID in present:
            return _NOTHING  # attributed upstream
        pid = _int(hints.get(PID))
        host = _str(hints.get(HOST))
        if pid is not None or (_str(hints.get(CGROUP)) and HW_ID not in hints):
            return self._process(pid, host, hints, present)  # a process, or an engine read with cgroup=
        if HW_ID in hints and HW_PARENT not in hints and self.config.gres.enabled:
            return self._gpu(host, hints, present)
        return _NOTHING

    def _process(self, pid: int | None, host: str | None, hints: Mapping[str, Any], present: set[str]) -> _Answer:
        found: Found | None = None
        text = _str(hints.get(CGROUP))
        if text:
            info = self._cgroup(text)
            if info.kind == "slurm" and info.slurm_job_id is not None:
                found = Found(info.slurm_job_id, info.slurm_step, info.slurm_uid, "cgroup")
        runtime = self.runtime
        if found is None and pid is not None and runtime.local is not None and (
                host is None or host in runtime.local_hosts):
            found = runtime.local.lookup(pid, _str(hints.get(START)))
        if found is None:
            return _Answer(source="none")
        job = runtime.jobs.get(found.job_id)
        uuid = _str(hints.get(HW_ID))
        if job is not None and uuid is not None:
            node = self._node(host)
            indexes = job.gpu_indexes(node)
            if len(indexes) == 1:
                runtime.gpus.learn(node, uuid, indexes[0])
        return _Answer(self._blob(found, job, present), found.source, found.job_id)

    def _gpu(self, host: str | None, hints: Mapping[str, Any], present: set[str]) -> _Answer:
        runtime = self.runtime
        node = self._node(host)
        allocations = runtime.jobs.allocations(node)
        name = _str(hints.get(HW_NAME))
        minor = _NVIDIA_MINOR.fullmatch(name) if name else None
        index = runtime.gpus.index(
            node, uuid=_str(hints.get(HW_ID)), nvml_index=_int(hints.get(GPU_INDEX)), bus_id=_str(hints.get(BUS_ID)),
            minor=int(minor.group(1)) if minor else None,
        )
        job_id = allocations.get(index) if index is not None else None
        if job_id is None:
            return _Answer(source="none", node=node)
        found = Found(job_id, None, None, "gres")
        return _Answer(self._blob(found, runtime.jobs.get(job_id), present), "gres", job_id, node)

    def _node(self, host: str | None) -> str:
        """The Slurm node name of a resource: this node's name for local hosts, else the short host name."""
        if host is None or host in self.runtime.local_hosts:
            return self.runtime.node_name
        return host.split(".", 1)[0]

    def _cgroup(self, text: str) -> CgroupInfo:
        info = self._parsed.get(text)
        if info is None:
            if len(self._parsed) >= _PARSED_LIMIT:
                self._parsed.clear()
            info = self._parsed[text] = parse_cgroup(text)
        return info

    def _blob(self, found: Found, job: JobInfo | None, present: set[str]) -> bytes:
        if present:  # some slurm.* keys set upstream: build without them, uncached
            return resource_blob(found, job, cluster=self.config.cluster_name, skip=present)
        key = (found, job)
        blob = self._blobs.get(key)
        if blob is None:
            if len(self._blobs) >= _BLOB_LIMIT:
                self._blobs.clear()
            blob = self._blobs[key] = resource_blob(found, job, cluster=self.config.cluster_name)
        return blob


def _int(value: Any) -> int | None:
    """An int attribute (the probe sends ``process.pid`` and ``gputally.gpu.index`` as int; strings are accepted)."""
    if value is None:
        return None
    kind = value.WhichOneof("value")
    if kind == "int_value":
        return int(value.int_value)
    if kind == "string_value" and value.string_value.isdigit():
        return int(value.string_value)
    return None


def _str(value: Any) -> str | None:
    if value is None or value.WhichOneof("value") != "string_value":
        return None
    return value.string_value or None


def create(config: SlurmConfig, context: ComponentContext, signal: Signal) -> SlurmProcessor:
    """Factory hook: one processor per pipeline over one :class:`SlurmRuntime` per processor ID.
    Reads the environment and gres.conf here, at startup, so a bad setting fails the start
    instead of a later lookup."""
    metrics = context.shared.get(__name__, "", lambda: _metrics(context.telemetry.registry))
    runtime = context.shared.get(__name__, context.id, lambda: _runtime(config, context, metrics),
                                 reuse=lambda held: held.config == config)
    return SlurmProcessor(runtime, signal=signal)


def _runtime(config: SlurmConfig, context: ComponentContext, metrics: _Metrics) -> SlurmRuntime:
    environ = dict(os.environ)
    backend = make_backend(config, environ=environ)
    hostname = socket.gethostname()
    node_name = config.node_name_in(environ, hostname)
    gres_conf = None
    if config.gres.conf is not None:
        try:
            gres_conf = GresConf.parse(config.gres.conf.read_text())
        except OSError as exc:
            raise ConfigError(f"{context.id}: gres.conf: cannot read {config.gres.conf}: {exc}") from exc
    driver = nvidia_minors(config.proc_root / "driver" / "nvidia" / "gpus") if config.proc_root is not None else {}
    gpu_map = GpuMap(
        gres_conf=gres_conf, minors=config.gres.minors, driver_minors=driver, local_node=node_name,
        learn=config.gres.learn_from_processes,
    )
    return SlurmRuntime(
        config, backend=backend, node_name=node_name, local_hosts=frozenset({hostname, hostname.split(".", 1)[0]}),
        gpu_map=gpu_map, component_id=context.id, registry=context.telemetry.registry, metrics=metrics,
    )
