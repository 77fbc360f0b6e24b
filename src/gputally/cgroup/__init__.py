"""Shared library: what a process's cgroup says about who runs it (pod and container, or Slurm job).

Used by the ``k8s`` and ``slurm`` processors, the probes' ``--debug`` view and
``gputally explain-cgroup``. See ``README.md`` here for what it promises.
"""

from .parse import MAX_TEXT, CgroupInfo, Kind, parse_cgroup

__all__ = ["MAX_TEXT", "CgroupInfo", "Kind", "parse_cgroup"]
