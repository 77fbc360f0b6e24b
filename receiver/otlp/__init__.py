"""The ``otlp`` receiver: OTLP metrics, logs and traces over gRPC and HTTP.

See ``README.md`` in this folder for the config keys.
"""

from .config import GRPCSettings, HTTPSettings, OTLPReceiverConfig, Protocols
from .factory import factory
from .receiver import OTLPReceiver

__all__ = ["GRPCSettings", "HTTPSettings", "OTLPReceiver", "OTLPReceiverConfig", "Protocols", "factory"]
