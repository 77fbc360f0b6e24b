"""The engine fixtures, for the inference end-to-end tests (see tests/harness/engines)."""

from harness.engines.fixtures import llamacpp_server, vllm_server

__all__ = ["llamacpp_server", "vllm_server"]
