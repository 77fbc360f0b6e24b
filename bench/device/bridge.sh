#!/usr/bin/env bash
# On the GPU machine (16 cores), from the repository root, after bench/device/prepare.sh here:
#   run  bash bench/device/bridge.sh      carry [".device-wheels", ".device-bin"]
# Installs gputally from the carried wheels and runs bench/bridge.py where the servers have
# cores of their own (on 6 CPUs or more it puts the load generator and the sink on the last
# two): issue 25's target of at most 1 ms p99 added at 1,000 requests/s, which two shared
# cores cannot show. Fixed rate and one call at a time, 2 rounds of 5 s; about 3 minutes.
# Writes $OUT/bridge.txt.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
echo "$(nproc) CPUs; $(python3 --version)"
python3 -m venv /tmp/gt && /tmp/gt/bin/pip install -q --no-index --find-links .device-wheels \
  -r .device-wheels/requirements.txt && /tmp/gt/bin/pip install -q --no-index --no-deps --no-build-isolation -e . \
  || { echo "install from .device-wheels failed"; exit 1; }
otelcol=/tmp/otelcol-gputally-bench
gunzip -c .device-bin/otelcol-gputally-bench.gz > $otelcol && chmod +x $otelcol && $otelcol --version \
  || { echo "no .device-bin/otelcol-gputally-bench.gz: run bench/device/prepare.sh here"; exit 1; }
timeout 400 /tmp/gt/bin/python bench/bridge.py --otelcol "$otelcol" --seconds 5 --rounds 2 --no-closed-loop \
  > "$out/bridge.txt" 2>&1
rc=$?
echo "bridge rc=$rc"
grep -v '^  ' "$out/bridge.txt"
exit $rc
