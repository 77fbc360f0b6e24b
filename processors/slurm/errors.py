"""Errors of the Slurm processor's backends, under gputally's one exception tree::

    GputallyError
    └── SlurmError               a backend could not answer
        └── SlurmUnavailable     slurmctld/slurmrestd unreachable, slow or refusing: try later

Foreign exceptions (subprocess, aiohttp, JSON, pyslurm's RPCError) are translated into these
where the backends call out, with ``raise ... from``. "Slurm does not know this job" is not
an error: backends return ``None``.
"""

from __future__ import annotations

from gputally.errors import GputallyError

__all__ = ["SlurmError", "SlurmUnavailable"]


class SlurmError(GputallyError):
    """A Slurm backend could not answer."""


class SlurmUnavailable(SlurmError):
    """The backend is unreachable, timed out or refused; the same question may work later."""
