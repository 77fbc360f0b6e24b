"""The probe's engine options: ``--engine URL[,key=value...]`` (repeatable) and their checks.

An explicit endpoint is for what discovery cannot see (an engine outside the GPU processes'
containers, a Slurm job or bare-metal server whose cgroup is the root) or should not guess:

    --engine http://127.0.0.1:8000/metrics,engine=vllm,model=llama-8b,pid=4242
    --engine http://10.0.0.5:8080/metrics,engine=llamacpp,cgroup=/slurm/uid_1000/job_77

``engine``: one of :data:`~gputally.probes.engines.model.ENGINES` (default: told from the
exposition); ``model``: the served model's name where the engine's metrics name none;
``pid``: the engine's process (its hints, and the GPUs of its container, go on the points);
``cgroup``: the engine's cgroup path, for attribution and for its GPUs when no pid is known.
An explicit endpoint is read from the probe's own network namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from gputally.probes.engines.model import ENGINES, Endpoint

__all__ = ["ExplicitEndpoint", "parse_engine"]

_KEYS = ("engine", "model", "pid", "cgroup")


@dataclass(frozen=True)
class ExplicitEndpoint:
    """One ``--engine``: where to read, and what it is said to be."""

    endpoint: Endpoint
    cgroup: str | None = None
    """The engine's cgroup path (``/kubepods/...``, ``/slurm/uid_U/job_J``), where given."""
    spec: str = ""
    """As written, for messages."""


def parse_engine(spec: str) -> ExplicitEndpoint:
    """One ``--engine`` value; ValueError says what is wrong with it."""
    url, *pairs = [part.strip() for part in spec.split(",")]
    parsed = urlsplit(url)
    if parsed.scheme != "http":
        raise ValueError(f"{url!r}: give an http:// URL (engines serve plain-text metrics over HTTP)")
    try:
        port = parsed.port
    except ValueError as exc:
        raise ValueError(f"{url!r}: {exc}") from exc
    if not parsed.hostname or port is None:
        raise ValueError(f"{url!r}: give a host and a port (http://HOST:PORT/PATH)")
    if parsed.query or parsed.fragment:
        raise ValueError(f"{url!r}: no query or fragment, only a path")
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not value:
            raise ValueError(f"{pair!r}: write KEY=VALUE ({', '.join(_KEYS)})")
        if key not in _KEYS:
            raise ValueError(f"{key!r}: unknown key (known: {', '.join(_KEYS)})")
        if key in values:
            raise ValueError(f"{key!r}: given twice")
        values[key] = value
    engine = values.get("engine")
    if engine is not None and engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: not one of {', '.join(ENGINES)}")
    pid: int | None = None
    if "pid" in values:
        if not values["pid"].isdigit() or int(values["pid"]) < 1:
            raise ValueError(f"pid={values['pid']!r}: a process id (a positive number)")
        pid = int(values["pid"])
    cgroup = values.get("cgroup")
    if cgroup is not None and not cgroup.startswith("/"):
        raise ValueError(f"cgroup={cgroup!r}: a cgroup path, starting with /")
    endpoint = Endpoint(host=parsed.hostname, port=port, path=parsed.path or "/metrics", engine=engine,
                        model=values.get("model"), pid=pid)
    return ExplicitEndpoint(endpoint=endpoint, cgroup=cgroup.rstrip("/") or "/" if cgroup else None, spec=spec)
