"""The engine fixtures for the tests in this folder (the root conftest registers the other
harnesses' plugins; these are imported where they are used)."""

from harness.engines.fixtures import llamacpp_server, vllm_server

__all__ = ["llamacpp_server", "vllm_server"]
