"""The ``otlp`` receiver: OTLP metrics, logs and traces over gRPC and HTTP.

See ``README.md`` in this folder for the config keys.
"""

from gputally.pipeline.factory import ReceiverFactory

from .config import GRPCSettings, HTTPSettings, OTLPReceiverConfig, Protocols
from .receiver import OTLPReceiver, create

__all__ = ["GRPCSettings", "HTTPSettings", "OTLPReceiver", "OTLPReceiverConfig", "Protocols", "factory"]

factory: ReceiverFactory[OTLPReceiverConfig] = ReceiverFactory(type_name="otlp", config=OTLPReceiverConfig, create=create)
"""Registered under the ``gputally.receivers`` entry point ``otlp``."""
