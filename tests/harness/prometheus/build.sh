#!/usr/bin/env bash
# Build the Prometheus that gputally's tests run: the alert-rule tests (promtool) and the
# OTLP -> Prometheus end-to-end tests (prometheus with --web.enable-otlp-receiver).
#
#   tests/harness/prometheus/build.sh           build if needed, then print PROMETHEUS=<path>
#                                               and PROMTOOL=<path>
#   tests/harness/prometheus/build.sh --check   print the paths if an up-to-date build is
#                                               cached, else exit 3 without building (used by
#                                               the fixtures)
#
# `go install github.com/prometheus/prometheus/cmd/{prometheus,promtool}@$version` with GOBIN
# in the cache, outside the repo:
#
#   ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/prometheus/<version>/
#       prometheus, promtool, stamp
#
# <version> is the Go module version (v0.316.0 is Prometheus 3.16.0). The plain build has no
# `builtinassets` tag, so the web UI's assets are not embedded (the UI pages answer with an
# error); the HTTP API, /api/v1/otlp and promtool work without them. The stamp hashes this
# script, so a change to it rebuilds and an unchanged tree returns at once. Network use is the
# Go module proxy only; the Go toolchain is never downloaded (GOTOOLCHAIN=local).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=v0.316.0         # github.com/prometheus/prometheus module version ...
release=3.16.0           # ... = this Prometheus release, stamped into --version

# shellcheck source=../cached_build.sh
source "$here/../cached_build.sh"
parse_mode "$@"

cache_root=${GPUTALLY_CACHE:-${HOME:?HOME is unset}/.cache/gputally}
base=$cache_root/prometheus
dest=$base/$version
stamp=$(cat "$here/build.sh" "$here/../cached_build.sh" | sha256sum | cut -c1-32)

print_result() { echo "PROMETHEUS=$dest/prometheus"; echo "PROMTOOL=$dest/promtool"; }
up_to_date() { [[ -x $dest/prometheus && -x $dest/promtool && -f $dest/stamp && $(<"$dest/stamp") == "$stamp" ]]; }

reuse_or_lock prometheus "$base"
find_go
export GOTOOLCHAIN=local CGO_ENABLED=0
unset GOFLAGS   # no -mod=vendor or -tags from the environment: `go install pkg@version` builds the module as released

start=$(date +%s)
tmp=$(mktemp -d "$base/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "build.sh: building prometheus and promtool $version with $(go env GOVERSION) into $dest" >&2
# One `go install` for both commands: they share one module graph and build cache.
# The version variables are what Prometheus's Makefile (promu) sets; without them --version
# and /api/v1/status/buildinfo say nothing.
vpkg=github.com/prometheus/common/version
ldflags="-s -w -X $vpkg.Version=$release -X $vpkg.Revision=$version -X $vpkg.Branch=module -X $vpkg.BuildUser=gputally-build.sh"
GOBIN=$tmp go install -trimpath -ldflags="$ldflags" \
    "github.com/prometheus/prometheus/cmd/prometheus@$version" \
    "github.com/prometheus/prometheus/cmd/promtool@$version" >&2
"$tmp/prometheus" --version >&2
"$tmp/promtool" --version >/dev/null
echo "$stamp" >"$tmp/stamp"

rm -rf "$dest"
chmod 755 "$tmp"
mv -T "$tmp" "$dest"
trap - EXIT
echo "build.sh: built in $(( $(date +%s) - start ))s; $(du -sh "$dest/prometheus" | cut -f1) prometheus, $(du -sh "$dest/promtool" | cut -f1) promtool in $dest" >&2
print_result
