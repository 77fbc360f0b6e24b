# Sourced by the harness build scripts (kube/build.sh, otelcol/build.sh): the parts every
# cached Go build shares. Each script sets `here` (its folder), `dest` (the cache folder of this version) and
# defines `up_to_date` (is the build in $dest current?) and `print_result` (its stdout
# lines), then calls, in order:
#
#   parse_mode "$@"          sets mode=build|check; --help prints the script's header
#   reuse_or_lock WHAT DIR   exits 0 with the result when the cached build is current, exits 3
#                            in --check mode when it is not, else waits for DIR's build lock
#                            (one build per cache at a time) and looks again
#   find_go                  sets `go` (GO=, PATH, or /usr/local/go/bin) and puts its folder
#                            first on PATH for tools that call `go` themselves

parse_mode() {
    mode=build
    case "${1:-}" in
        "") ;;
        --check) mode=check ;;
        -h|--help) sed -n '2,/^set -euo/p' "$here/build.sh" | sed '$d'; exit 0 ;;
        *) echo "build.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
}

reuse_or_lock() {
    local what=$1 lock_dir=$2
    if up_to_date; then
        print_result
        exit 0
    fi
    if [[ $mode == check ]]; then
        echo "build.sh: no up-to-date $what in $dest; run $here/build.sh" >&2
        exit 3
    fi
    # One build at a time per cache (parallel make, two checkouts): wait, then look again.
    mkdir -p "$lock_dir"
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$lock_dir/.build.lock"
        flock 9
        if up_to_date; then
            print_result
            exit 0
        fi
    fi
}

find_go() {
    go=${GO:-}
    if [[ -z $go ]]; then
        if command -v go >/dev/null 2>&1; then go=$(command -v go)
        elif [[ -x /usr/local/go/bin/go ]]; then go=/usr/local/go/bin/go
        else echo "build.sh: no Go toolchain (set GO=/path/to/go)" >&2; exit 1
        fi
    fi
    PATH=$(dirname "$go"):$PATH
    export PATH
}
