"""The component contract: receivers, processors and exporters, and what the service gives them.

Lifecycle (as in the OpenTelemetry Collector): ``start()`` returns quickly and hands
background work to tasks of its own; ``shutdown()`` stops intake, flushes within the
service's deadline, and is safe to call twice and before ``start()``. The service starts
exporters, then processors, then receivers, and stops them in reverse, so nothing drains into
a stage that has already stopped.

The factories that build them from config, one class per kind, are in
:mod:`gputally.pipeline.factory`.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from gputally.config.types import AuthSettings
from gputally.errors import ConfigError, GputallyError
from gputally.otlp.batch import Batch, Signal

if TYPE_CHECKING:
    from gputally.auth import BearerTokenAuth
    from gputally.storage import FileStorageConfig
    from gputally.telemetry import SelfTelemetry

__all__ = ["ALL_SIGNALS", "Component", "ComponentContext", "Consumer", "CountedRuntime", "Exporter", "FailurePolicy", "InlinePipeline", "Processor", "ProcessorFailed", "Receiver", "RuntimeProcessor", "SharedComponents", "SharedRuntime"]

ALL_SIGNALS = frozenset(Signal)


class FailurePolicy(enum.StrEnum):
    """What happens to a batch when a processor raises on it (see :attr:`Processor.on_failure`).

    Whatever the policy, the pipeline logs the first failure of each processor with its
    traceback and counts every batch's items in ``gputally_processor_failed_items_total``
    labelled with the outcome (``passed``, ``dropped``, ``refused``).
    """

    PASS = "pass"
    """Hand the batch on as it came in: nothing is lost, nothing is added."""
    DROP = "drop"
    """Drop the batch; the sender is acknowledged (the data was meant to be dropped anyway)."""
    REFUSE = "refuse"
    """Answer the sender with an internal error (HTTP 500 / gRPC INTERNAL, not retried):
    nothing is passed on, and the sender knows its data was not taken."""


class ProcessorFailed(GputallyError):
    """A processor whose policy is ``REFUSE`` raised: the request is answered as an internal
    error. The pipeline has already logged the cause."""


class Component(abc.ABC):
    """Anything with a lifecycle."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Begin work; return quickly (background work goes to tasks)."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Stop intake and flush. Idempotent; safe before :meth:`start`."""

    def degraded(self) -> str | None:
        """Why the component works below par right now (``None`` when all is well).

        Shown by ``/readyz`` without making the service unready: a processor whose metadata
        source is unreachable keeps passing data with cached attribution, and a person or a
        probe can still see why attribution may be stale.
        """
        return None


class Consumer(Protocol):
    """What a receiver hands batches to (a pipeline, or a fan-out over several)."""

    async def consume(self, batch: Batch) -> None:
        """Take ``batch``; raise :class:`gputally.errors.Refused` to push back on the sender."""


class InlinePipeline(Protocol):
    """A pipeline as an in-line receiver (``bridge``) uses it: run a batch through the
    processors and get back what comes out, exporting none of it."""

    id: str
    signal: Signal
    annotates: bool
    """Whether its processors change only resource attributes (each factory's ``annotates``)."""

    async def process(self, batch: Batch) -> Batch | None:
        """What the processors make of ``batch``; None when they dropped all of it. Raises
        :class:`gputally.errors.Refused` when a stage pushes back."""


class Receiver(Component):
    """Accepts OTLP from the network and hands each request to its consumers."""

    def listening(self) -> dict[str, str]:
        """Bound addresses by transport (``{"grpc": "127.0.0.1:4317"}``), once started."""
        return {}


class Processor(Component):
    """Changes, filters or holds batches. One instance serves one pipeline.

    ``process`` must not do I/O: lookups come from caches that the processor refreshes in
    background tasks started by :meth:`start`. It returns the batch to pass on, or ``None``
    when nothing goes further now (all filtered out, or held for :meth:`flush`).
    It may raise :class:`gputally.errors.Refused` to push back on the sender.
    """

    flush_interval: float | None = None
    """When set, the pipeline calls :meth:`flush` this often (seconds) and sends on its result."""

    on_failure: FailurePolicy = FailurePolicy.PASS
    """What the pipeline does with a batch when :meth:`process` raises (a bug, not
    :class:`~gputally.errors.Refused`). ``PASS`` suits processors that only add or reshape
    (attribution: data without its attributes beats no data); a processor whose job is to
    remove data (``filter``) must never pass it on unprocessed and says ``REFUSE`` or ``DROP``."""

    @abc.abstractmethod
    async def process(self, batch: Batch) -> Batch | None: ...

    async def flush(self) -> Batch | None:
        """Release held data (on the timer and at shutdown)."""
        return None

    async def drain(self) -> Batch | None:
        """Release everything at shutdown, called once before the last :meth:`flush` calls.

        For processors whose timer releases data only when it is due (the ``usage``
        processor's counters): this is the one call that says it is now or never."""
        return await self.flush()

    # -- acknowledgement: only processors that hold requests past process() need these ------

    def defer_acknowledgements(self) -> bool:
        """Asked once, before :meth:`start`, by a pipeline whose exporters keep what they take
        across a crash (``sending_queue.storage``): from now on, may a request be acknowledged
        only once everything of it this processor held has reached them?

        A processor that holds data answers True and from then on hands out a :meth:`receipt`
        for each request it holds and learns each outcome through :meth:`settle`. The default,
        False, is right for processors that never hold a request (they return it, changed or
        not, from :meth:`process`)."""
        return False

    def receipt(self, batch: Batch) -> Awaitable[None] | None:
        """For ``batch``, just given to :meth:`process`: what completes once all of it that was
        held has been handed on and settled, raising :class:`~gputally.errors.Refused` when
        downstream refused it. None when nothing of it is held. Asked only after
        :meth:`defer_acknowledgements` said True, right after :meth:`process` returned."""
        return None

    def settle(self, batch: Batch, error: BaseException | None) -> None:
        """The outcome of a batch this processor handed on (from :meth:`process` or
        :meth:`flush`): ``None`` once the rest of the pipeline took it, else why it did not.
        Called only after :meth:`defer_acknowledgements` said True."""


class SharedRuntime(Protocol):
    """What the instances of one processor ID share (see :class:`SharedComponents`): counted
    users, so the first ``acquire`` starts its background work and the last ``release`` stops it."""

    async def acquire(self) -> None: ...

    async def release(self) -> None: ...

    def degraded(self) -> str | None: ...


class CountedRuntime(abc.ABC):
    """A :class:`SharedRuntime`'s counting, written once: the first :meth:`acquire` runs
    :meth:`_start_work`, the last :meth:`release` runs :meth:`_stop_work`, and a release with
    no user left does nothing. A start that raises leaves the count as it was, so the next
    acquire tries again."""

    def __init__(self) -> None:
        self._users = 0

    @property
    def users(self) -> int:
        """Instances that acquired the runtime and have not released it."""
        return self._users

    async def acquire(self) -> None:
        self._users += 1
        if self._users == 1:
            try:
                await self._start_work()
            except BaseException:
                self._users -= 1
                raise

    async def release(self) -> None:
        if self._users == 0:
            return
        self._users -= 1
        if self._users == 0:
            await self._stop_work()

    def degraded(self) -> str | None:
        return None

    @abc.abstractmethod
    async def _start_work(self) -> None:
        """The first user came: start the background work (return quickly)."""

    @abc.abstractmethod
    async def _stop_work(self) -> None:
        """The last user went: stop it, within a deadline."""


RuntimeT = TypeVar("RuntimeT", bound=SharedRuntime)


class RuntimeProcessor(Processor, Generic[RuntimeT]):
    """A processor instance (one per pipeline) over its ID's shared runtime: ``start`` acquires
    it and ``shutdown`` releases it, once each, whatever the number of calls."""

    def __init__(self, runtime: RuntimeT) -> None:
        self.runtime = runtime
        self._started = False

    async def start(self) -> None:
        if not self._started:
            self._started = True
            await self.runtime.acquire()

    async def shutdown(self) -> None:
        if self._started:
            self._started = False
            await self.runtime.release()

    def degraded(self) -> str | None:
        return self.runtime.degraded()


class Exporter(Component):
    """Sends batches to a backend through its own bounded queue.

    ``export`` only enqueues: it raises :class:`gputally.errors.Refused` when the queue is
    full (after counting the dropped items), so the receiver can tell the sender to back off.
    """

    @abc.abstractmethod
    async def export(self, batch: Batch) -> None: ...

    @property
    def ready(self) -> bool:
        """True once the backend has been reached (or when there is none to reach)."""
        return True

    @property
    def durable(self) -> bool:
        """True when :meth:`export` returns only once the batch would survive a crash of this
        process (written to disk, or delivered). Pipelines then acknowledge a request only
        after what processors held of it has been exported."""
        return False


T = TypeVar("T")


class SharedComponents:
    """What the instances of one component in several pipelines share, per service: one
    runtime per component ID (one watch, one cache, one polling loop, one log line per
    outage), and one set of metric families per component type, as the Collector's
    ``sharedcomponent`` does. The service makes one and hands it to every component."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str], Any] = {}

    def get(self, owner: str, key: str, create: Callable[[], T], *, reuse: Callable[[T], bool] = lambda _: True) -> T:
        """The item ``owner`` (a module name) keeps under ``key`` (a component ID, or "" for
        one per service), made by ``create`` the first time, or again when ``reuse`` says the
        one held no longer fits (its config changed)."""
        item: T | None = self._items.get((owner, key))
        if item is None or not reuse(item):
            item = self._items[(owner, key)] = create()
        return item


@dataclass(frozen=True)
class ComponentContext:
    """What the service gives every component it creates."""

    id: str
    """The component's ID as written in config: ``type`` or ``type/name``."""
    telemetry: SelfTelemetry
    authenticators: Mapping[str, BearerTokenAuth] = field(default_factory=dict)
    shutdown_timeout: float = 30.0
    """Seconds the component may take to drain on shutdown."""
    is_ready: Callable[[], bool] = lambda: True
    """Whether the whole service is ready (exporters connected); for health endpoints."""
    shared: SharedComponents = field(default_factory=SharedComponents)
    """One per service, the same for every component it creates (see :class:`SharedComponents`)."""
    pipelines: Mapping[str, Signal] = field(default_factory=dict)
    """The pipelines that name this component, by ID, with their signal (the debug exporter
    says which pipeline a batch came through)."""
    storage: Mapping[str, FileStorageConfig] = field(default_factory=dict)
    """The ``file_storage`` extensions by ID."""
    inline: Mapping[str, InlinePipeline] = field(default_factory=dict)
    """For an in-line receiver (its factory's ``inline``): the pipelines it feeds, by ID."""

    def storage_directory(self, storage_id: str) -> Path:
        """The directory of the ``file_storage`` extension a component's ``storage`` key names."""
        try:
            return self.storage[storage_id].directory
        except KeyError:
            raise ConfigError(f"{self.id}: storage: no file_storage extension {storage_id!r}") from None

    def authenticator(self, auth: AuthSettings | None) -> BearerTokenAuth | None:
        if auth is None:
            return None
        try:
            return self.authenticators[auth.authenticator]
        except KeyError:
            raise ConfigError(f"{self.id}: auth.authenticator: no extension {auth.authenticator!r}") from None
