"""gputally: GPU telemetry with workload attribution."""
__version__ = "0.1.0"
