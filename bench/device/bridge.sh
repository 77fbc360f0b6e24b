#!/usr/bin/env bash
# On the GPU machine (16 cores), from the repository root, after bench/device/prepare.sh here:
#   run  bash bench/device/bridge.sh      carry [".device-wheels", ".device-bin"]
# Installs gputally from the carried wheels and runs bench/bridge.py where the servers have
# cores of their own (on 6 CPUs or more it puts the load generator and the sink on the last
# two): issue 25's target of at most 1 ms p99 added at 1,000 requests/s, which two shared
# cores cannot show. Fixed rate and one call at a time, 2 rounds of 5 s; then the fixed rate
# again with `--workers 4`; about 5 minutes. Writes $OUT/bridge.txt and bridge-workers.txt.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
echo "$(nproc) CPUs; $(python3 --version)"
python3 -m venv /tmp/gt && /tmp/gt/bin/pip install -q --no-index --find-links .device-wheels \
  -r .device-wheels/requirements.txt && /tmp/gt/bin/pip install -q --no-index --no-deps --no-build-isolation -e . \
  || { echo "install from .device-wheels failed"; exit 1; }
otelcol=/tmp/otelcol-gputally-bench
gunzip -c .device-bin/otelcol-gputally-bench.gz > $otelcol && chmod +x $otelcol && $otelcol --version \
  || { echo "no .device-bin/otelcol-gputally-bench.gz: run bench/device/prepare.sh here"; exit 1; }
timeout 330 /tmp/gt/bin/python bench/bridge.py --otelcol "$otelcol" --seconds 5 --rounds 2 --no-closed-loop \
  > "$out/bridge.txt" 2>&1
rc=$?
echo "bridge rc=$rc"
grep -v '^  ' "$out/bridge.txt"
# The same at the fixed rate with gputally on 4 processes and the processor's pool of 4
# connections (issue 35: calls in flight spread over cores instead of queueing on one).
timeout 200 /tmp/gt/bin/python bench/bridge.py --otelcol "$otelcol" --seconds 5 --rounds 2 --no-closed-loop \
  --no-one-at-a-time --workers 4 > "$out/bridge-workers.txt" 2>&1
rc_workers=$?
echo "bridge --workers 4 rc=$rc_workers"
grep -v '^  ' "$out/bridge-workers.txt"
[ $rc -eq 0 ] && exit $rc_workers
exit $rc
