"""gputally's bridge API (see ``v1/bridge.proto`` and ``README.md``): a Collector hands a batch to a gputally pipeline."""
