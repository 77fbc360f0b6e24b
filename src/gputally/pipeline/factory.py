"""Factories: how the service builds each kind of component from its config section.

One factory class per kind, each with the exact ``create`` signature the service calls, so a
factory for the wrong kind, or a ``create`` that takes the wrong arguments, is a type error
where it is declared rather than a ``TypeError`` at startup. Third-party packages register
them under the entry-point groups ``gputally.receivers``, ``gputally.processors`` and
``gputally.exporters``::

    [project.entry-points."gputally.processors"]
    myproc = "my_package.myproc:factory"
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from gputally.config.types import Strict
from gputally.otlp.batch import Signal
from gputally.pipeline.component import ALL_SIGNALS, ComponentContext, Consumer, Exporter, Processor, Receiver

__all__ = ["AnyFactory", "ExporterFactory", "ProcessorFactory", "ReceiverCreate", "ReceiverFactory", "Stability"]

Stability = Literal["development", "alpha", "beta", "stable", "deprecated"]
"""How far a component is along for one signal, in the Collector's words: ``development`` (not
for use), ``alpha`` (config may change), ``beta`` (config stable, changes announced), ``stable``,
``deprecated``."""

ConfigT = TypeVar("ConfigT", bound=Strict)
ConfigT_contra = TypeVar("ConfigT_contra", bound=Strict, contravariant=True)


class ReceiverCreate(Protocol[ConfigT_contra]):
    """A receiver's ``create``: one receiver per receiver ID, handed one consumer per signal
    that has a pipeline naming it; ``reuse_port`` lets several processes share its ports."""

    def __call__(
        self,
        config: ConfigT_contra,
        context: ComponentContext,
        consumers: Mapping[Signal, Consumer],
        *,
        reuse_port: bool,
    ) -> Receiver: ...


@dataclass(frozen=True, kw_only=True)
class _Factory(Generic[ConfigT]):
    """What every kind's factory has: its type name as written in config, and its config model."""

    type_name: str
    """The component type as written in config (``otlp``, ``batch``, ``otlp/name``'s ``otlp``)."""
    config: type[ConfigT]
    """The model of its config section (fields are the YAML keys)."""
    signals: frozenset[Signal] = ALL_SIGNALS
    """The pipeline signals it may serve; config validation refuses the others."""
    stability: Mapping[Signal, Stability] = field(default_factory=dict)
    """Its stability per signal, as its README states it and ``gputally components`` prints it;
    a signal it serves but does not list is ``development``."""

    def stability_of(self, signal: Signal) -> Stability:
        return self.stability.get(signal, "development")

    def parse(self, section: object) -> ConfigT:
        """The validated config of one section (an empty section means every default)."""
        return self.config.model_validate(section if section is not None else {})


@dataclass(frozen=True, kw_only=True)
class ReceiverFactory(_Factory[ConfigT]):
    """Builds a receiver: ``create(config, context, consumers, reuse_port=...)``."""

    create: ReceiverCreate[ConfigT]
    inline: bool = False
    """Whether it answers each request with what its pipeline made of it (the ``bridge``
    receiver), instead of handing it on to the pipeline's exporters. It finds its pipelines in
    :attr:`ComponentContext.inline`; config validation keeps processors that hold data out of
    them and other receivers from feeding them."""


@dataclass(frozen=True, kw_only=True)
class ProcessorFactory(_Factory[ConfigT]):
    """Builds a processor: ``create(config, context, signal)``, one instance per pipeline."""

    create: Callable[[ConfigT, ComponentContext, Signal], Processor]
    holds_data: bool = False
    """Whether :meth:`Processor.process` may keep a request to release it later from
    :meth:`Processor.flush` (``batch``): refused in pipelines whose receiver answers in line,
    since what it holds would reach the exporters instead of the caller."""
    annotates: bool | Callable[[ConfigT], bool] = False
    """Whether, with its config, :meth:`Processor.process` changes nothing but resource
    attributes (sets or removes them) and drops nothing: a bridge answers a pipeline made only
    of such processors with what changed (a patch) rather than the whole batch. A wrong True
    where a processor changes points or drops items loses those changes in the Collector;
    the default, False, only costs the caller a whole-batch answer."""
    mutates_data: bool
    """Whether :meth:`Processor.process` changes the batch it is given in place (the Collector's
    ``MutatesData`` capability). A receiver feeding several pipelines hands the same batch to
    every pipeline whose processors only read it, and a copy to each that changes it. There
    is no default: a wrong False lets one pipeline's changes leak into another."""


    def annotates_with(self, config: ConfigT) -> bool:
        """:attr:`annotates` for one config section."""
        return self.annotates if isinstance(self.annotates, bool) else self.annotates(config)


@dataclass(frozen=True, kw_only=True)
class ExporterFactory(_Factory[ConfigT]):
    """Builds an exporter: ``create(config, context)``, one per exporter ID, shared by the
    pipelines that name it."""

    create: Callable[[ConfigT, ComponentContext], Exporter]
    durable: Callable[[ConfigT], bool] | None = None
    """Whether, with this config, an acknowledged batch survives a crash (kept on disk, or sent
    before ``export`` returns); None for exporters without a sending queue. Config validation
    warns when one receiver's data reaches durable and volatile exporters alike."""


AnyFactory = ReceiverFactory[Any] | ProcessorFactory[Any] | ExporterFactory[Any]
"""A factory of any kind."""
