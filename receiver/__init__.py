"""The ``otlp`` receiver: OTLP metrics, logs and traces over gRPC and HTTP.

See ``README.md`` in this folder for the config keys.
"""

from gputally.pipeline.component import Factory

from .config import GRPCSettings, HTTPSettings, OTLPReceiverConfig, Protocols
from .receiver import OTLPReceiver, create

__all__ = ["GRPCSettings", "HTTPSettings", "OTLPReceiver", "OTLPReceiverConfig", "Protocols", "factory"]

factory: Factory[OTLPReceiverConfig] = Factory(type="otlp", config=OTLPReceiverConfig, create=create)
"""Registers the receiver under the type name ``otlp``."""
