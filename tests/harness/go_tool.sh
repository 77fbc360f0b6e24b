# Sourced by the build.sh of each Go tool the tests run (h2spec, staticcheck, mdatagen), after
# cached_build.sh: the tool is pinned as a `tool` of the Go module beside its build.sh (every
# dependency in go.sum), built once into a cache outside the repo,
#
#   ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/<name>/<version>/<name>
#
# with a stamp hashed from that go.mod, go.sum and the scripts, so a change to any of them
# rebuilds and an unchanged tree returns at once. Network use is the Go module proxy only; the
# Go toolchain is never downloaded. Output on stdout is one line: VAR=<path>.
#
#   go_tool NAME VAR MODULE PACKAGE [ARGS...]   (ARGS: how the built tool prints its version)

go_tool() {
    local name=$1 var=$2 module=$3 package=$4
    shift 4
    local version
    version=$(awk -v module="$module" '$1 == module { print $2; exit }' go.mod)
    if [[ -z $version ]]; then
        echo "build.sh: cannot read the $name version ($module) from $here/go.mod" >&2
        exit 1
    fi
    cache_root=${GPUTALLY_CACHE:-${HOME:?HOME is unset}/.cache/gputally}
    dest=$cache_root/$name/$version
    stamp=$(cat go.mod go.sum build.sh ../cached_build.sh ../go_tool.sh | sha256sum | cut -c1-32)
    tool_name=$name
    tool_var=$var

    print_result() { echo "$tool_var=$dest/$tool_name"; }
    up_to_date() { [[ -x $dest/$tool_name && -f $dest/stamp && $(<"$dest/stamp") == "$stamp" ]]; }

    reuse_or_lock "$name" "$cache_root/$name"
    find_go
    export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

    echo "build.sh: building $name $version with $("$go" env GOVERSION) into $dest" >&2
    local start
    start=$(date +%s)
    mkdir -p "$cache_root/$name"
    tmp=$(mktemp -d "$cache_root/$name/.build.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT

    "$go" build -trimpath -ldflags="-s -w" -o "$tmp/$name" "$package"
    if (($#)); then
        "$tmp/$name" "$@" >&2
    fi
    echo "$stamp" >"$tmp/stamp"

    rm -rf "$dest"
    chmod 755 "$tmp"
    mv -T "$tmp" "$dest"
    trap - EXIT
    echo "build.sh: built in $(( $(date +%s) - start ))s; $(du -sh "$dest/$name" | cut -f1) binary in $dest" >&2
    print_result
}
