"""A real kube-apiserver + etcd on loopback for the Kubernetes processor's tests (#8).

Build the binaries with ``tests/harness/kube/build.sh``; `harness.kube.cluster` runs
them, `harness.kube.fixtures` is the pytest plugin with the ``kube_cluster`` fixture.
"""
