#!/usr/bin/env bash
# Build mdatagen, the Collector's metadata generator: `make go-test` regenerates
# collector/gputallyprocessor's metadata.yaml outputs and fails if they differ from those committed
# (issue 36). v0.158.0: the newest whose dependencies the Go module proxy serves here (v0.161.0's
# go.opentelemetry.io/collector/internal/schemagen is refused, 403).
#
#   tests/harness/mdatagen/build.sh           build if needed, then print MDATAGEN=<path>
#   tests/harness/mdatagen/build.sh --check   print the path if an up-to-date build is cached,
#                                             else exit 3 without building
#
# go.opentelemetry.io/collector/cmd/mdatagen v0.158.0 is the `tool` of the Go module next to this script; ../go_tool.sh builds it
# into ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/mdatagen/<version>/mdatagen.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

# shellcheck source=../cached_build.sh
source "$here/../cached_build.sh"
# shellcheck source=../go_tool.sh
source "$here/../go_tool.sh"
parse_mode "$@"
go_tool mdatagen MDATAGEN go.opentelemetry.io/collector/cmd/mdatagen go.opentelemetry.io/collector/cmd/mdatagen
