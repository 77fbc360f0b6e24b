#!/bin/sh
# Install systemd-analyze (Debian package `systemd`) for tests/deploy/test_systemd_units.py,
# if it is missing. Idempotent; run as root (CI does). Nothing is started: the tests only
# run `systemd-analyze verify` and `systemd-analyze security --offline` on unit files.
set -eu
if command -v systemd-analyze >/dev/null 2>&1; then
    echo "systemd harness: systemd-analyze installed"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "systemd harness: systemd-analyze is missing; run this script as root" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends systemd >/dev/null
echo "systemd harness: installed systemd"
