"""``slurm``: attribute GPUs and GPU processes to Slurm jobs (job, user, account, partition, QoS)."""

from gputally.otlp.batch import Signal
from gputally.pipeline.factory import ProcessorFactory

from .attributes import ATTRIBUTES
from .backends import Backend, CliBackend, PyslurmBackend, RestdBackend
from .config import CacheConfig, CliConfig, GresConfig, PyslurmConfig, SlurmConfig, SlurmrestdConfig
from .errors import SlurmError, SlurmUnavailable
from .jobs import JobCache
from .model import JobInfo
from .processor import SlurmProcessor, SlurmRuntime, create

__all__ = [
    "ATTRIBUTES",
    "Backend",
    "CacheConfig",
    "CliBackend",
    "CliConfig",
    "GresConfig",
    "JobCache",
    "JobInfo",
    "PyslurmBackend",
    "PyslurmConfig",
    "RestdBackend",
    "SlurmConfig",
    "SlurmError",
    "SlurmProcessor",
    "SlurmRuntime",
    "SlurmUnavailable",
    "SlurmrestdConfig",
    "factory",
]

factory: ProcessorFactory[SlurmConfig] = ProcessorFactory(
    type_name="slurm", config=SlurmConfig, create=create, signals=frozenset(Signal),
    mutates_data=True,  # adds attributes in place
)
"""Registered under the ``gputally.processors`` entry point ``slurm``."""
