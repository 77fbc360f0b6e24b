"""h2spec, the HTTP/2 conformance checker, for the native gRPC server's test (issue 26).

Build it with ``tests/harness/h2spec/build.sh``; `harness.h2spec.tool` finds and runs it,
`harness.h2spec.fixtures` is the pytest plugin with the ``h2spec`` fixture.
"""
