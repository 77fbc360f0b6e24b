"""Receivers: one folder each. ``otlp/`` takes OTLP over gRPC and HTTP from probes and Collectors.

Each is registered as an entry point in the ``gputally.receivers`` group; none imports another.
"""
