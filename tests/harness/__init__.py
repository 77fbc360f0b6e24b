"""Test harnesses that run real services (e.g. a Kubernetes control plane) for the suite."""
