"""The kubelet PodResources API (see ``v1/api.proto``)."""
