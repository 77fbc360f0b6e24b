"""Config of the ``slurm`` processor: where job metadata comes from, and how GPUs map to jobs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from gputally.config.types import ClientTLSSettings, Duration, Strict

__all__ = ["CacheConfig", "CliConfig", "GresConfig", "PyslurmConfig", "SlurmConfig", "SlurmrestdConfig"]


class SlurmrestdConfig(Strict):
    """``slurmrestd:``: Slurm's REST API with JWT auth; needs no Slurm config on this machine."""

    endpoint: str = Field(pattern=r"^https?://")
    """Base URL, for example ``http://slurmrestd.hpc:6820``."""
    api_version: str = Field(default="v0.0.38", pattern=r"^v\d+\.\d+\.\d+$")
    """OpenAPI version in the URL path: ``v0.0.38`` for Slurm 22.05 (newer versions are read
    tolerantly, but only v0.0.38 is tested)."""
    user: str = "root"
    """Sent as ``X-SLURM-USER-NAME``: the user the token was issued for (``scontrol token username=...``)."""
    token: SecretStr | None = None
    """The JWT, sent as ``X-SLURM-USER-TOKEN``. Prefer ``token_file`` (or ``${env:SLURM_JWT}``)."""
    token_file: Path | None = None
    """File holding the JWT; re-read when it changes, so a rotated token is picked up."""
    timeout: Duration = 5.0
    """Limit on one HTTP request."""
    tls: ClientTLSSettings | None = None
    """TLS towards an ``https://`` endpoint (a proxy in front of slurmrestd)."""

    @model_validator(mode="after")
    def _one_token(self) -> SlurmrestdConfig:
        if (self.token is None) == (self.token_file is None):
            raise ValueError("exactly one of 'token' and 'token_file' is needed")
        return self


class CliConfig(Strict):
    """``cli:``: ``scontrol`` and ``squeue`` run as fixed argument lists (never a shell)."""

    scontrol: str = "scontrol"
    """``scontrol`` to run (a name looked up on PATH, or a path)."""
    squeue: str = "squeue"
    """``squeue`` to run; it must support ``--json`` (Slurm 21.08 and newer)."""
    timeout: Duration = 10.0
    """Limit on one command; it is killed after that."""
    slurm_conf: Path | None = None
    """``SLURM_CONF`` for the commands; their default search when unset."""


class PyslurmConfig(Strict):
    """``pyslurm:``: the Slurm C API through pyslurm, which must match the cluster's Slurm major version."""

    slurm_conf: Path | None = None
    """The slurm.conf that must exist before pyslurm is imported (importing it without one
    kills the process). Default: ``$SLURM_CONF``, else ``/etc/slurm/slurm.conf``."""
    timeout: Duration = 10.0
    """Limit on one call (it runs in a thread)."""

    def slurm_conf_in(self, environ: Mapping[str, str]) -> Path:
        """The slurm.conf pyslurm will read: ``slurm_conf``, ``$SLURM_CONF``, or the default."""
        if self.slurm_conf is not None:
            return self.slurm_conf
        return Path(environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")


class CacheConfig(Strict):
    """``cache:``: job metadata kept in memory, refreshed in the background."""

    ttl: Duration = 300.0
    """How long a job's metadata is used before it is looked up again (it is still served
    while the new lookup runs)."""
    negative_ttl: Duration = 30.0
    """How long "Slurm does not know this job" is believed."""
    max_entries: int = Field(default=10000, ge=1)
    """Most jobs kept; the least recently used goes first."""
    refresh_interval: Duration = 30.0
    """How often running jobs' GPU allocations are reloaded (one call for the whole cluster),
    while GPUs are being attributed. Also the longest wait between retries when Slurm is down."""

    @field_validator("refresh_interval")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be positive")
        return value


class GresConfig(Strict):
    """``gres:``: how a GRES index (Slurm's GPU number on a node) becomes a physical GPU."""

    enabled: bool = True
    """Attribute GPU resources (``hw.id`` without ``process.pid``) to the job that holds them,
    so an allocated but idle GPU has an owner."""
    conf: Path | None = None
    """A gres.conf (cluster-wide with ``NodeName=`` lines, or the node's own): its ``File=``
    order gives the device of each GRES index. Read at start."""
    minors: list[int] | None = None
    """Explicit device minors in GRES index order for every node (``[0, 1, 2, 3]``); wins over ``conf``."""
    learn_from_processes: bool = True
    """Learn GRES index -> GPU from jobs holding one GPU whose process runs on it; wins over both."""


class SlurmConfig(Strict):
    """``processors: slurm:``."""

    backend: Literal["auto", "cli", "slurmrestd", "pyslurm"] = "auto"
    """Where job metadata comes from. ``auto``: ``slurmrestd`` when that section is given, else
    ``cli`` when ``scontrol`` is found, else ``pyslurm`` when it is installed and a slurm.conf exists."""
    slurmrestd: SlurmrestdConfig | None = None
    cli: CliConfig = CliConfig()
    pyslurm: PyslurmConfig = PyslurmConfig()
    proc_root: Path | None = None
    """Where this machine's /proc is (``/proc``, or ``/host/proc`` in a container). When set,
    processes on this node without a cgroup hint are looked up there (cgroup, then
    ``SLURM_JOB_ID`` in their environment), and the NVIDIA driver's minors are read for the
    GRES mapping. Leave unset on a central gateway: its /proc is not the nodes'."""
    node_name: str | None = None
    """This machine's Slurm node name, for resources without ``host.name``. Default:
    ``$SLURMD_NODENAME``, else the short host name (:meth:`node_name_in`)."""
    cluster_name: str | None = None
    """``slurm.cluster.name`` to set; default: what the backend reports."""
    cache: CacheConfig = CacheConfig()
    gres: GresConfig = GresConfig()

    def node_name_in(self, environ: Mapping[str, str], hostname: str) -> str:
        """``node_name``, else ``SLURMD_NODENAME`` from ``environ``, else ``hostname`` up to its first dot."""
        return self.node_name or environ.get("SLURMD_NODENAME") or hostname.split(".", 1)[0]

    @model_validator(mode="after")
    def _backend_section(self) -> SlurmConfig:
        if self.backend == "slurmrestd" and self.slurmrestd is None:
            raise ValueError("backend 'slurmrestd' needs a 'slurmrestd' section with an endpoint and a token")
        return self
