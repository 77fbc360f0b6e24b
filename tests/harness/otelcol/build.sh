#!/usr/bin/env bash
# Build the otelcol that gputally's end-to-end tests run (issue 7).
#
#   tests/harness/otelcol/build.sh           build if needed, then print OTELCOL=<path>
#   tests/harness/otelcol/build.sh --check   print the path if an up-to-date build is cached,
#                                            else exit 3 without building (used by the fixture)
#   OTELCOL_MANIFEST=collector-config/builder-bench.yaml tests/harness/otelcol/build.sh
#                                            another manifest (the benchmark's small otelcol;
#                                            a relative path is from the checkout's root),
#                                            cached beside the test one as <name>-<version>/;
#                                            set it for that one command, not in the shell
#
# The distribution is collector-config/builder.yaml, built by the OpenTelemetry Collector
# Builder (ocb) of the same release, installed with `go install` into the cache. Everything
# goes to a cache outside the repo,
#
#   ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/otelcol/
#       bin/builder                    ocb
#       <version>/otelcol-gputally-test the collector, with its generated sources and a stamp
#
# The stamp hashes builder.yaml, this script and the sources of gputally's own processor
# (collector/gputallyprocessor, without its tests and docs), so a change to any of them
# rebuilds and an unchanged tree returns at once. Network use is the Go module proxy only;
# the Go toolchain is never downloaded (GOTOOLCHAIN=local). Output on stdout is one line:
# OTELCOL=...
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
test_manifest=$(realpath "$repo/collector-config/builder.yaml")
manifest=$(cd "$repo" && realpath "${OTELCOL_MANIFEST:-$test_manifest}")
builder_version=v0.161.0   # go.opentelemetry.io/collector/cmd/builder; same release as the manifest's core modules

# shellcheck source=../cached_build.sh
source "$here/../cached_build.sh"
parse_mode "$@"

# dist.name and dist.version from the manifest, without a YAML parser.
distval() { awk -v k="$1" '/^dist:/ { d = 1; next } /^[^ #]/ { d = 0 } d && $1 == k":" { print $2; exit }' "$manifest"; }
name=$(distval name)
version=$(distval version)
if [[ -z $name || -z $version ]]; then
    echo "build.sh: cannot read dist.name / dist.version from $manifest" >&2
    exit 1
fi

cache_root=${GPUTALLY_CACHE:-${HOME:?HOME is unset}/.cache/gputally}
base=$cache_root/otelcol
dest=$base/$version   # the test distribution's; any other manifest's is <name>-<version>
[[ $manifest == "$test_manifest" ]] || dest=$base/$name-$version
processor=collector/gputallyprocessor   # built from the checkout (the manifest's replace)
# What goes into the binary, by path relative to the checkout, so two checkouts of one tree
# share a build: Go sources, go.mod and go.sum, generated code; not tests, testdata or docs.
processor_sources() {
    (cd "$repo" && find "$processor" -type f ! -name '*_test.go' ! -path '*/testdata/*' ! -name '*.md' |
        LC_ALL=C sort | xargs sha256sum)
}
stamp=$( { cat "$manifest" "$here/build.sh" "$here/../cached_build.sh"; processor_sources; } | sha256sum | cut -c1-32)

print_result() { echo "OTELCOL=$dest/$name"; }
up_to_date() { [[ -x $dest/$name && -f $dest/stamp && $(<"$dest/stamp") == "$stamp" ]]; }

reuse_or_lock otelcol "$base"
find_go
export GOTOOLCHAIN=local CGO_ENABLED=0
unset GOFLAGS   # ocb runs `go get` / `go mod tidy` in its generated module

start=$(date +%s)
builder=$base/bin/builder
if [[ ! -x $builder ]] || ! "$builder" version 2>/dev/null | grep -q "${builder_version#v}"; then
    echo "build.sh: installing ocb $builder_version into $base/bin" >&2
    GOBIN=$base/bin go install "go.opentelemetry.io/collector/cmd/builder@$builder_version"
fi

tmp=$(mktemp -d "$base/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# ocb takes the output path only from the manifest: build from a copy pointed at $tmp.
# Likewise the processor's replace: ocb resolves a relative path from its output folder, so
# the copy names the checkout's folder absolutely.
sed -e "s#^\\(  output_path:\\).*#\\1 $tmp#" \
    -e "s#=> \\.\\./$processor\$#=> $repo/$processor#" "$manifest" >"$tmp/builder.yaml"
grep -q "^  output_path: $tmp\$" "$tmp/builder.yaml" || { echo "build.sh: no dist.output_path line in $manifest" >&2; exit 1; }
grep -q "=> $repo/$processor\$" "$tmp/builder.yaml" || { echo "build.sh: no replace of ../$processor in $manifest" >&2; exit 1; }

echo "build.sh: building $name $version with $(go env GOVERSION) into $dest" >&2
# ocb generates main.go, components.go and go.mod, then runs `go mod tidy`, which also loads
# the *tests* of every component package; some of their test-only modules (e.g. contrib's
# otlpencodingextension, imported by fileexporter's tests) are refused by the module
# proxy, so ocb's tidy fails although the collector itself needs none of them. So: let ocb
# generate (its exit status is only reported), then tidy with -e and compile here, with the
# flags ocb would use (debug_compilation: false): -trimpath -ldflags="-s -w".
if ! "$builder" --config "$tmp/builder.yaml" --skip-compilation >"$tmp/ocb.log" 2>&1; then
    echo "build.sh: ocb's own go mod tidy failed (expected: refused test-only modules, first lines below); continuing with go mod tidy -e" >&2
    grep -E '403|not available|error' "$tmp/ocb.log" | head -5 >&2 || true
fi
if [[ ! -f $tmp/go.mod || ! -f $tmp/components.go ]]; then
    cat "$tmp/ocb.log" >&2
    echo "build.sh: ocb did not generate the sources" >&2
    exit 1
fi
(
    cd "$tmp"
    go mod tidy -e >"$tmp/tidy.log" 2>&1 || { cat "$tmp/tidy.log" >&2; exit 1; }
    go build -trimpath -ldflags="-s -w" -o "$name" . >&2
)
"$tmp/$name" --version >&2
"$tmp/$name" components >"$tmp/components.txt"
echo "$stamp" >"$tmp/stamp"

rm -rf "$dest"
chmod 755 "$tmp"
mv -T "$tmp" "$dest"
trap - EXIT
echo "build.sh: built in $(( $(date +%s) - start ))s; $(du -sh "$dest/$name" | cut -f1) binary in $dest" >&2
print_result
