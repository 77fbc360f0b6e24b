"""Generated code for the kubelet PodResources API v1 (from ``api.proto``; do not edit by hand)."""
