#!/usr/bin/env bash
# Build the repository's Dockerfile for real, without a Docker engine (issue 16), for
# tests/deploy/test_image.py.
#
#   tests/harness/image/build.sh           build if needed, then print IMAGE=, BUILDAH_ROOT=,
#                                          BUILDAH_RUNROOT=
#   tests/harness/image/build.sh --check   print them if an up-to-date image is cached, else
#                                          exit 3 without building
#
# buildah (Debian's, installed by setup.sh) with chroot isolation and vfs storage: no daemon, no
# overlay mounts, no user namespaces, works as root in a container. Docker Hub is unreachable,
# so the Dockerfile's BASE is a Debian bookworm base made here: mmdebstrap --variant=minbase with
# python3, python3-venv and ca-certificates (about 20-35 s), imported `FROM scratch` + `ADD
# rootfs.tar` (Containerfile.base) as localhost/gputally-test-base:bookworm. The image is
# localhost/gputally:test. Everything lives in a cache outside the repo:
#
#   ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/image/
#       storage/, run/   buildah's --root and --runroot (the base, the image, cached layers)
#       base.stamp       hash of mmdebstrap's arguments and Containerfile.base: the base is
#                        rebuilt when they change
#       stamp            hash of the Dockerfile, .dockerignore, pyproject.toml, README.md, the
#                        package folders and these scripts: the image is rebuilt when it changes
#
# No `--layers`: in vfs storage every cached layer is a full copy of the root filesystem, and
# committing one per instruction cost more (about 100 s a rebuild) than installing the
# dependencies again (about 20 s); without it a stage is committed once, a rebuild takes about
# 45 s, and only the tagged images are kept. (A Docker engine does use the Dockerfile's
# dependencies-first layering.) pip in the
# build reaches PyPI; where TLS is intercepted (as here) the RUN steps see the host's CA bundle,
# bind-mounted read-only for the build only (`bud -v`, in no layer), and pip is pointed at it
# (the Dockerfile's PIP_CERT build argument, used by the build stage only).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
base_image=localhost/gputally-test-base:bookworm
image=localhost/gputally:test
suite=bookworm

# shellcheck source=../cached_build.sh
source "$here/../cached_build.sh"
parse_mode "$@"

cache_root=${GPUTALLY_CACHE:-${HOME:?HOME is unset}/.cache/gputally}
dest=$cache_root/image
storage=$dest/storage
runroot=$dest/run
buildah=(buildah --root "$storage" --runroot "$runroot" --storage-driver vfs)

inputs() {
    (cd "$repo" && find Dockerfile .dockerignore pyproject.toml README.md src receiver exporters processors probes proto \
        -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum)
    cat "$here/build.sh" "$here/Containerfile.base" "$here/../cached_build.sh"
}
stamp=$(inputs | sha256sum | cut -c1-32)
# What makes the base: mmdebstrap's arguments (no documentation, manuals or locales: a smaller
# base copies faster in vfs storage) and Containerfile.base. Only they rebuild it.
debootstrap_args=(--quiet --variant=minbase --include=python3,python3-venv,ca-certificates
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/locale/*' "$suite")
base_stamp=$( (echo "${debootstrap_args[*]}"; cat "$here/Containerfile.base") | sha256sum | cut -c1-32)

has_image() { command -v buildah >/dev/null 2>&1 && [[ -n $("${buildah[@]}" images --quiet "$1" 2>/dev/null) ]]; }
print_result() { echo "IMAGE=$image"; echo "BUILDAH_ROOT=$storage"; echo "BUILDAH_RUNROOT=$runroot"; }
up_to_date() { [[ -f $dest/stamp && $(<"$dest/stamp") == "$stamp" ]] && has_image "$image"; }

reuse_or_lock image "$dest"
for tool in buildah mmdebstrap; do
    command -v "$tool" >/dev/null 2>&1 || { echo "build.sh: no $tool; run tests/harness/image/setup.sh (as root)" >&2; exit 1; }
done
rm -f "$dest/stamp"
start=$(date +%s)

if ! [[ -f $dest/base.stamp && $(<"$dest/base.stamp") == "$base_stamp" ]] || ! has_image "$base_image"; then
    tmp=$(mktemp -d "$dest/.base.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    echo "build.sh: making the $suite base with mmdebstrap" >&2
    mmdebstrap "${debootstrap_args[@]}" "$tmp/rootfs.tar" >&2
    "${buildah[@]}" bud --quiet --isolation chroot --pull=never -f "$here/Containerfile.base" -t "$base_image" "$tmp" >&2
    echo "$base_stamp" >"$dest/base.stamp"
    rm -rf "$tmp"
    trap - EXIT
    echo "build.sh: base made in $(( $(date +%s) - start ))s" >&2
fi

# The host's CA bundle over the base's own (same path, so nothing new appears in a layer), and
# pip told to use it: where TLS is intercepted (as on the machines this runs on) pip's bundled
# certifi does not know the proxy's CA.
bundle=/etc/ssl/certs/ca-certificates.crt
tls=()
[[ -f $bundle ]] && tls=(-v "$bundle:$bundle:ro" --build-arg "PIP_CERT=$bundle")
image_start=$(date +%s)
echo "build.sh: building $repo/Dockerfile on $base_image" >&2
"${buildah[@]}" bud --isolation chroot --pull=never --layers=false --build-arg "BASE=$base_image" \
    "${tls[@]}" -f "$repo/Dockerfile" -t "$image" "$repo" >&2
# Earlier builds' images, now untagged, and their layers (each a full copy in vfs storage).
# Working containers left by an interrupted test run would hold theirs: they go first (this
# storage is the harness's own).
"${buildah[@]}" rm --all >/dev/null 2>&1 || true
"${buildah[@]}" rmi --prune >/dev/null 2>&1 || true
echo "$stamp" >"$dest/stamp"
size=$("${buildah[@]}" images --format '{{.Size}}' "$image")
echo "build.sh: image built in $(( $(date +%s) - image_start ))s ($(( $(date +%s) - start ))s in all); $image is $size" >&2
print_result
