"""The container runtime interface, CRI (see ``v1/api.proto``)."""
