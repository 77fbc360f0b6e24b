"""Every registered receiver starts and stops by the component contract (pipeline/component.py):
shutdown is safe before start and twice, start returns at once and listens, shutdown stops
listening and leaves no task of the receiver running."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import pytest

from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext, Receiver
from gputally.pipeline.factory import ReceiverFactory
from gputally.telemetry import SelfTelemetry


@dataclass(frozen=True)
class Case:
    config: dict[str, Any]
    """The smallest config that listens on a port of the kernel's choosing."""


# Every receiver registered under gputally.receivers: one missing here fails the first test.
RECEIVERS = {
    "otlp": Case({"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}}),
    "bridge": Case({"endpoint": "127.0.0.1:0"}),
}


class Passing:
    """A consumer and an in-line pipeline that take everything."""

    id = "metrics/lifecycle"
    signal = Signal.METRICS

    async def consume(self, batch: Batch) -> None:
        return None

    async def process(self, batch: Batch) -> Batch | None:
        return batch


def registered() -> dict[str, ReceiverFactory[Any]]:
    return {ep.name: ep.load() for ep in entry_points(group="gputally.receivers")}


def test_every_registered_receiver_is_listed_here() -> None:
    factories = registered()
    assert sorted(factories) == sorted(RECEIVERS)
    for name, factory in factories.items():
        assert isinstance(factory, ReceiverFactory) and factory.type_name == name


def connects(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(RECEIVERS))
async def test_lifecycle(name: str) -> None:
    factory = registered()[name]
    pipeline = Passing()
    context = ComponentContext(id=name, telemetry=SelfTelemetry(), inline={pipeline.id: pipeline})
    consumers = {signal: pipeline for signal in Signal}

    never_started = factory.create(factory.parse(RECEIVERS[name].config), context, consumers, reuse_port=False)
    assert isinstance(never_started, Receiver)
    await asyncio.wait_for(never_started.shutdown(), 1)
    await asyncio.wait_for(never_started.shutdown(), 1)

    receiver = factory.create(factory.parse(RECEIVERS[name].config), context, consumers, reuse_port=False)
    before = asyncio.all_tasks()
    await asyncio.wait_for(receiver.shutdown(), 1)
    await asyncio.wait_for(receiver.start(), 5)
    addresses = list(receiver.listening().values())
    assert addresses and all(not a.endswith(":0") for a in addresses), addresses
    assert all(connects(a) for a in addresses)
    await asyncio.wait_for(receiver.shutdown(), 6)
    await asyncio.wait_for(receiver.shutdown(), 1)
    await asyncio.sleep(0)
    assert receiver.listening() == {}
    assert not any(connects(a) for a in addresses)
    assert [t for t in asyncio.all_tasks() - before if not t.done()] == []
