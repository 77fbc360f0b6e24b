"""The ``bridge`` receiver: a Collector's ``gputally`` processor calls it with a batch, and it
answers with what one gputally pipeline made of it (``proto/bridge/README.md``)."""

from .config import BridgeReceiverConfig
from .factory import factory
from .receiver import BridgeReceiver

__all__ = ["BridgeReceiver", "BridgeReceiverConfig", "factory"]
