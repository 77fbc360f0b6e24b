"""OTLP message helpers: the batch that flows through pipelines, and cheap point counting."""

from gputally.otlp.batch import REQUEST_TYPES, RESPONSE_TYPES, Batch, Signal

__all__ = ["REQUEST_TYPES", "RESPONSE_TYPES", "Batch", "Signal"]
