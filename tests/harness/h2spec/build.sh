#!/usr/bin/env bash
# Build h2spec, the HTTP/2 conformance checker tests/h2/test_h2spec.py runs against the native
# gRPC server (issue 26).
#
#   tests/harness/h2spec/build.sh           build if needed, then print H2SPEC=<path>
#   tests/harness/h2spec/build.sh --check   print the path if an up-to-date build is cached,
#                                           else exit 3 without building (used by the fixture)
#
# h2spec comes from the Go module next to this script (github.com/summerwind/h2spec
# v2.2.1+incompatible as a `tool`, every dependency pinned in go.sum). It goes to a cache
# outside the repo,
#
#   ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/h2spec/<version>/h2spec
#
# with a stamp hashed from go.mod, go.sum and this script, so a change to any of them rebuilds
# and an unchanged tree returns at once. Network use is the Go module proxy only (go.sum is
# complete); the Go toolchain is never downloaded. Output on stdout is one line: H2SPEC=...
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

# shellcheck source=../cached_build.sh
source "$here/../cached_build.sh"
parse_mode "$@"

version=$(awk '$1 == "github.com/summerwind/h2spec" { print $2; exit }' go.mod)
if [[ -z $version ]]; then
    echo "build.sh: cannot read the h2spec version from $here/go.mod" >&2
    exit 1
fi

cache_root=${GPUTALLY_CACHE:-${HOME:?HOME is unset}/.cache/gputally}
dest=$cache_root/h2spec/$version
stamp=$(cat go.mod go.sum build.sh ../cached_build.sh | sha256sum | cut -c1-32)

print_result() { echo "H2SPEC=$dest/h2spec"; }
up_to_date() { [[ -x $dest/h2spec && -f $dest/stamp && $(<"$dest/stamp") == "$stamp" ]]; }

reuse_or_lock h2spec "$cache_root/h2spec"
find_go
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

echo "build.sh: building h2spec $version with $("$go" env GOVERSION) into $dest" >&2
start=$(date +%s)
mkdir -p "$cache_root/h2spec"
tmp=$(mktemp -d "$cache_root/h2spec/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

"$go" build -trimpath -ldflags="-s -w" -o "$tmp/h2spec" github.com/summerwind/h2spec/cmd/h2spec
"$tmp/h2spec" --version >&2
echo "$stamp" >"$tmp/stamp"

rm -rf "$dest"
chmod 755 "$tmp"
mv -T "$tmp" "$dest"
trap - EXIT
echo "build.sh: built in $(( $(date +%s) - start ))s; $(du -sh "$dest/h2spec" | cut -f1) binary in $dest" >&2
print_result
