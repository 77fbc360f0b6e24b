#!/usr/bin/env bash
# Here, from the repository root: what bench/device/bridge.sh needs on the GPU machine (Python
# 3.12, no package registry or module proxy reachable there), in two ignored folders to hand
# over with the device run's `carry` (at most 64 MiB in all):
#   .device-wheels/  gputally's dependencies as wheels, by ../shared/device/prepare.sh (~40 MB)
#   .device-bin/     the benchmark's small otelcol, collector-config/builder-bench.yaml,
#                    gzipped (33 MB, 12 MB packed, so both fit)
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -f ../shared/device/prepare.sh ]] || { echo "prepare.sh: no ../shared/device/prepare.sh beside the checkout" >&2; exit 1; }
bash ../shared/device/prepare.sh
built=$(OTELCOL_MANIFEST=collector-config/builder-bench.yaml tests/harness/otelcol/build.sh)
rm -rf .device-bin && mkdir -p .device-bin
gzip -9 -c "${built#OTELCOL=}" > .device-bin/otelcol-gputally-bench.gz
du -shc .device-wheels .device-bin
