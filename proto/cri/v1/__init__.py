"""Generated code for the CRI runtime.v1 RuntimeService (from ``api.proto``; do not edit by hand)."""
