#!/usr/bin/env bash
# Build h2spec, the HTTP/2 conformance checker tests/h2/test_h2spec.py runs against the native
# gRPC server (issue 26).
#
#   tests/harness/h2spec/build.sh           build if needed, then print H2SPEC=<path>
#   tests/harness/h2spec/build.sh --check   print the path if an up-to-date build is cached,
#                                           else exit 3 without building
#
# github.com/summerwind/h2spec v2.2.1+incompatible is the `tool` of the Go module next to this script; ../go_tool.sh builds it
# into ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/h2spec/<version>/h2spec.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

# shellcheck source=../cached_build.sh
source "$here/../cached_build.sh"
# shellcheck source=../go_tool.sh
source "$here/../go_tool.sh"
parse_mode "$@"
go_tool h2spec H2SPEC github.com/summerwind/h2spec github.com/summerwind/h2spec/cmd/h2spec --version
