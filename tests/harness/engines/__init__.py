"""Real inference engines for the tests: vLLM (CPU) and llama.cpp's server, each run inside a
cgroup shaped like a Kubernetes pod's container (see README.md)."""
