#!/usr/bin/env bash
# Build kube-apiserver and etcd for gputally's Kubernetes test harness (issue #8).
#
#   tests/harness/kube/build.sh           build if needed, then print the binaries' paths
#   tests/harness/kube/build.sh --check   print the paths if an up-to-date build is cached,
#                                         else exit 3 without building (used by the fixture)
#
# Both binaries come from the Go module next to this script: kube-apiserver from
# k8s.io/kubernetes (with every k8s.io/* staging module pinned by a replace line), etcd
# from go.etcd.io/etcd/server/v3 through cmd/etcd. They go to a cache outside the repo,
#
#   ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/kube/<k8s-version>-<etcd-version>/
#
# together with a stamp hashed from go.mod, go.sum, cmd/etcd/main.go and this script, so
# a change to any of them rebuilds and an unchanged tree returns at once. Network use is
# the Go module proxy only (go.sum is complete); the Go toolchain is never downloaded.
# Output on stdout is two lines a shell can eval: KUBE_APISERVER=... and ETCD=...
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

# shellcheck source=../cached_build.sh
source "$here/../cached_build.sh"
parse_mode "$@"

# The versions are whatever go.mod pins; read them without asking the go command.
modver() {  # the version go.mod requires of module $1 (a require line, single or in a block)
    awk -v m="$1" '/^replace/ { exit } { for (i = 1; i < NF; i++) if ($i == m && $(i + 1) ~ /^v/) { print $(i + 1); exit } }' go.mod
}
k8s_version=$(modver k8s.io/kubernetes)
etcd_version=$(modver go.etcd.io/etcd/server/v3)
if [[ -z $k8s_version || -z $etcd_version ]]; then
    echo "build.sh: cannot read the k8s.io/kubernetes / etcd versions from $here/go.mod" >&2
    exit 1
fi

cache_root=${GPUTALLY_CACHE:-${HOME:?HOME is unset}/.cache/gputally}
dest=$cache_root/kube/$k8s_version-$etcd_version
stamp=$(cat go.mod go.sum cmd/etcd/main.go build.sh ../cached_build.sh | sha256sum | cut -c1-32)

print_result() {
    echo "KUBE_APISERVER=$dest/kube-apiserver"
    echo "ETCD=$dest/etcd"
}

up_to_date() {
    [[ -x $dest/kube-apiserver && -x $dest/etcd && -f $dest/stamp && $(<"$dest/stamp") == "$stamp" ]]
}
reuse_or_lock "kube-apiserver and etcd" "$cache_root/kube"
find_go

export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0
minor=${k8s_version#v1.}; minor=${minor%%.*}
cbv=k8s.io/component-base/version
ldflags="-s -w -X $cbv.gitVersion=$k8s_version -X $cbv.gitMajor=1 -X $cbv.gitMinor=$minor"
ldflags+=" -X $cbv.gitTreeState=clean -X $cbv.buildDate=1970-01-01T00:00:00Z"

echo "build.sh: building kube-apiserver $k8s_version and etcd $etcd_version with $("$go" env GOVERSION) into $dest" >&2
start=$(date +%s)
tmp=$(mktemp -d "$cache_root/kube/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

"$go" build -trimpath -ldflags="$ldflags" -o "$tmp/" k8s.io/kubernetes/cmd/kube-apiserver ./cmd/etcd
"$tmp/kube-apiserver" --version >&2
"$tmp/etcd" --version >&2
echo "$stamp" >"$tmp/stamp"

rm -rf "$dest"
chmod 755 "$tmp"
mv -T "$tmp" "$dest"
trap - EXIT
echo "build.sh: built in $(( $(date +%s) - start ))s; $(du -sh "$dest" | cut -f1) in $dest" >&2
print_result
