"""Config of the ``dcgm`` processor: which point labels name a GPU and what they become.

dcgm-exporter writes its GPU identity as Prometheus labels; the defaults are its own label
names. Deployments that relabel (``metric_relabel_configs``, a ``transform`` processor) can
name their labels here. A role set to ``null`` is not read: its label stays on the points.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from gputally.config.types import Strict

__all__ = ["DcgmConfig", "LabelsConfig"]


class LabelsConfig(Strict):
    """``labels:``: the point label that holds each part of a GPU's identity."""

    uuid: str = Field(default="UUID", min_length=1)
    """GPU UUID -> ``hw.id``. Only points with this label move; it cannot be switched off."""
    index: str | None = Field(default="gpu", min_length=1)
    """GPU index -> ``gputally.gpu.index`` (an int; a value that is not a whole number stays on the point)."""
    device: str | None = Field(default="device", min_length=1)
    """Device name (``nvidia0``) -> ``hw.name``."""
    model: str | None = Field(default="modelName", min_length=1)
    """Product name -> ``hw.model``."""
    pci_bus_id: str | None = Field(default="pci_bus_id", min_length=1)
    """PCI address -> ``gputally.gpu.pci.bus_id``."""
    driver_version: str | None = Field(default="DCGM_FI_DRIVER_VERSION", min_length=1)
    """Driver version -> ``hw.driver_version``."""
    hostname: str | None = Field(default="Hostname", min_length=1)
    """Node the GPU is in -> ``host.name`` (only where the resource has none)."""

    @model_validator(mode="after")
    def _distinct(self) -> LabelsConfig:
        seen: dict[str, str] = {}
        for role, label in self.model_dump().items():
            if label is None:
                continue
            if label in seen:
                raise ValueError(f"roles {seen[label]!r} and {role!r} both read label {label!r}")
            seen[label] = role
        return self


class DcgmConfig(Strict):
    """``processors: dcgm:``. Every key is optional: ``dcgm:`` alone reads dcgm-exporter's labels."""

    labels: LabelsConfig = LabelsConfig()
    """The label names to read, by role; roles left out keep their default."""
