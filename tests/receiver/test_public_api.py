"""The receiver package's public surface, pinned so a change to it is deliberate."""

from __future__ import annotations

import gputally.receiver


def test_public_names() -> None:
    assert sorted(gputally.receiver.__all__) == [
        "GRPCSettings",
        "HTTPSettings",
        "OTLPReceiver",
        "OTLPReceiverConfig",
        "Protocols",
        "factory",
    ]
    for name in gputally.receiver.__all__:
        assert getattr(gputally.receiver, name) is not None
