"""``--debug``: one collection as text a person can check at a glance on a node.

Each GPU with its identity and every point, then each of its processes with pid, owner,
executable, memory, utilization, and what attribution will read from its cgroup (the same
parser the gateway's processors use), the raw cgroup text beneath; then each inference engine
read (its endpoint, process, GPUs and points); then any problem and event of the cycle. A counter that starts with this cycle at 0 (bytes integrated from rates, which
need two readings) is shown as having no window yet, not as a 0 beside a non-zero rate.
"""

from __future__ import annotations

from collections.abc import Iterable

from gputally.cgroup.parse import CgroupInfo, parse_cgroup
from gputally.probes.core.model import AttrValue, Cycle, Entity, Kind, Point

__all__ = ["render"]

_GIB = 1024**3


def _number(value: float | int, unit: str) -> str:
    if unit == "By" and abs(value) >= 1024**2:
        return f"{value} By ({value / _GIB:.2f} GiB)"
    if isinstance(value, float):
        return f"{value:.4g} {unit}"
    return f"{value} {unit}"


def _point(point: Point, windowless: bool = False) -> str:
    attrs = ",".join(f"{k}={v}" for k, v in point.attributes)
    name = f"{point.metric.name}{{{attrs}}}" if attrs else point.metric.name
    if windowless:
        return f"    {name:<62} - {point.metric.unit} (no window yet: a rate needs two readings)"
    return f"    {name:<62} {_number(point.value, point.metric.unit)}"


def _points(entity: Entity, cycle_ns: int | None) -> Iterable[str]:
    """Every point; a counter that starts this cycle at 0 beside a non-zero rate of the same
    series (``By`` beside ``By/s``) has no window yet, and is shown so."""
    rates = {(p.metric.unit, frozenset(p.attributes)) for p in entity.points
             if p.metric.kind is Kind.GAUGE and p.value and p.metric.unit.endswith("/s")}
    for p in entity.points:
        windowless = (p.metric.kind is Kind.COUNTER and p.value == 0 and p.start_ns == cycle_ns
                      and (f"{p.metric.unit}/s", frozenset(p.attributes)) in rates)
        yield _point(p, windowless)


def attribution(info: CgroupInfo) -> str:
    """What the k8s and slurm processors will make of a process's cgroup, in a few words."""
    if info.kind == "kubernetes" or info.pod_uid:
        details = ", ".join(x for x in (info.qos_class, info.runtime) if x)
        text = f"pod {info.pod_uid}" + (f" ({details})" if details else "")
        if info.container_id:
            text += f", container {info.container_id[:12]}"
        return text
    if info.slurm_job_id is not None:
        text = f"Slurm job {info.slurm_job_id}"
        if info.slurm_step is not None:
            text += f" step {info.slurm_step}"
        if info.slurm_task is not None:
            text += f" task {info.slurm_task}"
        return text
    if info.container_id:
        return f"container {info.container_id[:12]} ({info.runtime or 'unknown runtime'}), no pod or job"
    return f"no pod or Slurm job ({info.kind}{f': {info.path}' if info.path else ''})"


def _text(value: AttrValue) -> str:
    if isinstance(value, tuple):  # an array: [a, b], and [] for an empty one (which says something)
        return f"[{', '.join(str(item) for item in value)}]"
    return str(value)


def _gpu_lines(entity: Entity, cycle_ns: int | None = None) -> Iterable[str]:
    a = entity.attributes
    title = "MIG device" if entity.kind == "mig" else "GPU"
    yield f"{title} {entity.label}"
    for key in sorted(a):
        yield f"  {key} = {_text(a[key])}"
    yield "  metrics:"
    yield from _points(entity, cycle_ns)


def _process_lines(entity: Entity, cycle_ns: int | None = None) -> Iterable[str]:
    a = entity.attributes
    values = {p.metric.name + "".join(f"/{v}" for _, v in p.attributes): p.value for p in entity.points}
    memory = values.get("gputally.gpu.process.memory.usage")
    sm = values.get("gputally.gpu.process.utilization/general")
    parts = [f"  process {a.get('process.pid')}"]
    if "process.executable.name" in a:
        parts.append(str(a["process.executable.name"]))
    if "process.owner" in a:
        parts.append(f"owner {a['process.owner']}")
    if memory is not None:
        parts.append(f"memory {memory / _GIB:.2f} GiB")
    parts.append(f"sm {sm:.0%}" if sm is not None else "sm n/a")
    if "process.creation.time" in a:
        parts.append(f"started {a['process.creation.time']}")
    yield "  ".join(parts)
    cgroup = a.get("process.linux.cgroup")
    if cgroup:
        yield f"      attribution: {attribution(parse_cgroup(str(cgroup)))}"
    for line in str(cgroup).splitlines() if cgroup else ["(unknown: the process has gone or /proc is not readable)"]:
        yield f"      cgroup: {line}"
    yield from _points(entity, cycle_ns)


def _engine_lines(entity: Entity, cycle_ns: int | None = None) -> Iterable[str]:
    """An engine endpoint: what it is, where it was read, its process and GPUs, its points."""
    a = entity.attributes
    yield f"engine {entity.label}"
    if "gputally.inference.gpu.ids" in a:
        yield (f"  on GPUs {_text(a['gputally.inference.gpu.ids'])}, "
               f"GPU processes {_text(a.get('gputally.inference.gpu.pids', ()))}")
    parts = [f"  process {a['process.pid']}"] if "process.pid" in a else []
    parts += [str(a[key]) for key in ("process.executable.name",) if key in a]
    parts += [f"owner {a['process.owner']}"] if "process.owner" in a else []
    if parts:
        yield "  ".join(parts)
    cgroup = a.get("process.linux.cgroup")
    if cgroup:
        yield f"      attribution: {attribution(parse_cgroup(str(cgroup)))}"
    for key in sorted(k for k in a if k not in _ENGINE_SHOWN):
        yield f"  {key} = {_text(a[key])}"
    yield "  metrics:"
    yield from _points(entity, cycle_ns)
    for histogram in entity.histograms:
        attrs = ",".join(f"{k}={v}" for k, v in histogram.attributes)
        name = f"{histogram.metric.name}{{{attrs}}}" if attrs else histogram.metric.name
        mean = f", mean {histogram.sum / histogram.count:.4g} {histogram.metric.unit}" if histogram.count else ""
        yield f"    {name:<62} {histogram.count} observed{mean} ({len(histogram.bounds) + 1} buckets)"


_ENGINE_SHOWN = frozenset({"gputally.inference.gpu.ids", "gputally.inference.gpu.pids", "process.pid",
                           "process.executable.name", "process.owner", "process.linux.cgroup"})


def render(cycle: Cycle, *, title: str = "", probe: str = "nvml") -> str:
    gpus = cycle.gpus()
    lines = [
        f"gputally probe {probe}{f' ({title})' if title else ''}: {len(gpus)} device(s), "
        f"{len(cycle.processes())} process(es), collected in {cycle.duration_s * 1000:.1f} ms"
    ]
    for gpu in gpus:
        lines.append("")
        lines.extend(_gpu_lines(gpu, cycle.time_ns))
        processes = [e for e in cycle.processes() if e.attributes.get("hw.id") == gpu.attributes.get("hw.id")]
        lines.append(f"  processes: {len(processes)}")
        for process in processes:
            lines.extend(_process_lines(process, cycle.time_ns))
    engines = cycle.engines()
    if engines:
        lines.append("")
        lines.append(f"engines: {len(engines)}")
        for engine in engines:
            lines.extend(_engine_lines(engine, cycle.time_ns))
    events = [entry for entry in cycle.logs if entry.event_name != "gputally.gpu.snapshot"]
    if cycle.problems or events:
        lines.append("")
    lines.extend(f"! {problem}" for problem in cycle.problems)
    lines.extend(f"! {entry.severity.name} {entry.body}" for entry in events)
    return "\n".join(lines) + "\n"
