#!/usr/bin/env bash
# Build staticcheck, the Go linter `make go-test` runs over the Collector processor
# (collector/gputallyprocessor, issue 36), beside `go vet` and `go test -race`.
#
#   tests/harness/staticcheck/build.sh           build if needed, then print STATICCHECK=<path>
#   tests/harness/staticcheck/build.sh --check   print the path if an up-to-date build is cached,
#                                                else exit 3 without building
#
# staticcheck comes from the Go module next to this script (honnef.co/go/tools/cmd/staticcheck
# v0.8.2 as a `tool`, every dependency pinned in go.sum). It goes to a cache
# outside the repo,
#
#   ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/staticcheck/<version>/staticcheck
#
# with a stamp hashed from go.mod, go.sum and this script, so a change to any of them rebuilds
# and an unchanged tree returns at once. Network use is the Go module proxy only (go.sum is
# complete); the Go toolchain is never downloaded. Output on stdout is one line: STATICCHECK=...
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

# shellcheck source=../cached_build.sh
source "$here/../cached_build.sh"
parse_mode "$@"

version=$(awk '$1 == "honnef.co/go/tools" { print $2; exit }' go.mod)
if [[ -z $version ]]; then
    echo "build.sh: cannot read the staticcheck version from $here/go.mod" >&2
    exit 1
fi

cache_root=${GPUTALLY_CACHE:-${HOME:?HOME is unset}/.cache/gputally}
dest=$cache_root/staticcheck/$version
stamp=$(cat go.mod go.sum build.sh ../cached_build.sh | sha256sum | cut -c1-32)

print_result() { echo "STATICCHECK=$dest/staticcheck"; }
up_to_date() { [[ -x $dest/staticcheck && -f $dest/stamp && $(<"$dest/stamp") == "$stamp" ]]; }

reuse_or_lock staticcheck "$cache_root/staticcheck"
find_go
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

echo "build.sh: building staticcheck $version with $("$go" env GOVERSION) into $dest" >&2
start=$(date +%s)
mkdir -p "$cache_root/staticcheck"
tmp=$(mktemp -d "$cache_root/staticcheck/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

"$go" build -trimpath -ldflags="-s -w" -o "$tmp/staticcheck" honnef.co/go/tools/cmd/staticcheck
"$tmp/staticcheck" --version >&2
echo "$stamp" >"$tmp/stamp"

rm -rf "$dest"
chmod 755 "$tmp"
mv -T "$tmp" "$dest"
trap - EXIT
echo "build.sh: built in $(( $(date +%s) - start ))s; $(du -sh "$dest/staticcheck" | cut -f1) binary in $dest" >&2
print_result
