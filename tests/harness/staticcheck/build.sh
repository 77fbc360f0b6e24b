#!/usr/bin/env bash
# Build staticcheck, the Go linter `make go-test` runs over the Collector processor
# (collector/gputallyprocessor, issue 36), beside `go vet` and `go test -race`.
#
#   tests/harness/staticcheck/build.sh           build if needed, then print STATICCHECK=<path>
#   tests/harness/staticcheck/build.sh --check   print the path if an up-to-date build is cached,
#                                                else exit 3 without building
#
# honnef.co/go/tools/cmd/staticcheck v0.8.2 is the `tool` of the Go module next to this script; ../go_tool.sh builds it
# into ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/staticcheck/<version>/staticcheck.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

# shellcheck source=../cached_build.sh
source "$here/../cached_build.sh"
# shellcheck source=../go_tool.sh
source "$here/../go_tool.sh"
parse_mode "$@"
go_tool staticcheck STATICCHECK honnef.co/go/tools honnef.co/go/tools/cmd/staticcheck --version
