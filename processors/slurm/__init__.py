"""``slurm``: attribute GPUs and GPU processes to Slurm jobs (job, user, account, partition, QoS)."""

from .attributes import ATTRIBUTES
from .backends import Backend, CliBackend, PyslurmBackend, RestdBackend
from .config import CacheConfig, CliConfig, GresConfig, PyslurmConfig, SlurmConfig, SlurmrestdConfig
from .errors import SlurmError, SlurmUnavailable
from .factory import factory
from .jobs import JobCache
from .model import JobInfo
from .processor import SlurmProcessor, SlurmRuntime

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
