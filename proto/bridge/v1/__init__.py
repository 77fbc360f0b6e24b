"""Generated code for the bridge API v1 (from ``bridge.proto`` by ``proto/generate.sh``; do not edit by hand)."""
