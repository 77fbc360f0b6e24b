#!/bin/sh
# Install what tests/deploy/test_image.py needs to build and run the Dockerfile without a
# Docker engine, if it is missing, then build the image (tests/harness/image/build.sh; cached,
# so an unchanged tree returns at once). Idempotent; run as root (CI does).
#   buildah      builds the Dockerfile (chroot isolation, vfs storage: no daemon, no overlay
#                mounts, no user namespaces needed) and runs commands in the image
#   mmdebstrap   makes the Debian base the test image is built on (Docker Hub is unreachable)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
need=""
for pair in buildah:buildah mmdebstrap:mmdebstrap; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need="$need ${pair#*:}"
done
if [ -n "$need" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "image harness: missing packages:$need; run this script as root" >&2
        exit 1
    fi
    start=$(date +%s)
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends buildah mmdebstrap >/dev/null
    echo "image harness: installed$need in $(( $(date +%s) - start )) s"
else
    echo "image harness: buildah and mmdebstrap installed"
fi
exec bash "$here/build.sh"
