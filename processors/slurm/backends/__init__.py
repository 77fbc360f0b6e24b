"""Job-metadata backends behind one interface (:class:`~.base.Backend`), and the choice among them."""

from __future__ import annotations

import shutil
from collections.abc import Mapping

from gputally.errors import ConfigError
from gputally.processors.slurm.config import SlurmConfig

from .base import Backend
from .cli import CliBackend
from .pyslurm import PyslurmBackend, pyslurm_available
from .restd import RestdBackend

__all__ = ["Backend", "CliBackend", "PyslurmBackend", "RestdBackend", "make_backend"]


def make_backend(config: SlurmConfig, *, environ: Mapping[str, str]) -> Backend:
    """The backend ``config.backend`` names; for ``auto``, the first that can work here:
    slurmrestd when configured, else the CLI when ``scontrol`` is found, else pyslurm."""
    kind = config.backend
    if kind == "auto":
        if config.slurmrestd is not None:
            kind = "slurmrestd"
        elif shutil.which(config.cli.scontrol, path=environ.get("PATH")) is not None:
            kind = "cli"
        elif pyslurm_available(config.pyslurm.slurm_conf_in(environ)):
            kind = "pyslurm"
        else:
            raise ConfigError(
                "slurm: backend 'auto' found nothing to use: no 'slurmrestd' section, "
                f"no {config.cli.scontrol!r} on PATH, no pyslurm with a slurm.conf"
            )
    if kind == "slurmrestd":
        assert config.slurmrestd is not None  # the config model checks this
        return RestdBackend(config.slurmrestd)
    if kind == "cli":
        if shutil.which(config.cli.scontrol, path=environ.get("PATH")) is None:
            raise ConfigError(f"slurm.cli.scontrol: {config.cli.scontrol!r} is not an executable on PATH")
        return CliBackend(config.cli, environ=environ)
    conf = config.pyslurm.slurm_conf_in(environ)
    if not conf.is_file():
        raise ConfigError(f"slurm.pyslurm.slurm_conf: {conf} does not exist (pyslurm cannot be imported without it)")
    return PyslurmBackend(config.pyslurm, environ=environ)
