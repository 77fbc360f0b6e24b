"""A real helm (and the Prometheus Operator's CRDs) for the chart tests (issue 16).

Build it with ``tests/harness/helm/build.sh``; `harness.helm.tool` finds and runs it,
`harness.helm.fixtures` is the pytest plugin with the ``helm`` fixture.
"""
