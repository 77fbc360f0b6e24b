#!/usr/bin/env bash
# Make the tiny random Llama that the engine tests serve (issue 33), in both engines' formats.
#
#   tests/harness/engines/tinyllama/build.sh           make it if needed, then print
#                                                      TINY_HF=<folder> and TINY_GGUF=<file>
#   tests/harness/engines/tinyllama/build.sh --check   print the paths if an up-to-date model is
#                                                      cached, else exit 3 without making it
#
# Needs the two engine builds first (it runs in the vLLM venv, and uses the converter kept by
# the llama.cpp build). make_model.py generates text, trains a 1,000-piece SentencePiece BPE
# tokenizer on it and saves a seeded random LlamaForCausalLM as a Hugging Face folder; the
# llama.cpp sdist's convert_hf_to_gguf.py turns that into an f32 GGUF. Nothing is downloaded,
# from a model hub or anywhere (HF_HUB_OFFLINE=1, no network needed).
#
#   ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/engines/tinyllama/<key>/
#       hf/   tiny-f32.gguf   stamp
#
# <key> (and the stamp) hash this script, make_model.py and the two engine builds' stamps, so a
# change to any of them makes the model again.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# shellcheck source=../../cached_build.sh
source "$here/../../cached_build.sh"
parse_mode "$@"

# The engines this model is made with (their --check fails when they are not built).
engine_paths() { "$here/../vllm/build.sh" --check && "$here/../llamacpp/build.sh" --check; }
if ! paths=$(engine_paths 2>/dev/null); then
    if [[ $mode == check ]]; then
        echo "build.sh: the engines are not built; run $here/../vllm/build.sh and $here/../llamacpp/build.sh" >&2
        exit 3
    fi
    "$here/../vllm/build.sh" >/dev/null
    "$here/../llamacpp/build.sh" >/dev/null
    paths=$(engine_paths)
fi
value() { sed -n "s/^$1=//p" <<<"$paths"; }
vllm_python=$(value VLLM_PYTHON)
convert=$(value LLAMA_CONVERT)

cache_root=${GPUTALLY_CACHE:-${HOME:?HOME is unset}/.cache/gputally}
base=$cache_root/engines/tinyllama
stamp=$( { cat "$here/build.sh" "$here/make_model.py" "$here/../../cached_build.sh";
           cat "$(dirname "$(dirname "$vllm_python")")/stamp" "$(dirname "$convert")/stamp"; } | sha256sum | cut -c1-32)
dest=$base/${stamp:0:12}

print_result() { echo "TINY_HF=$dest/hf"; echo "TINY_GGUF=$dest/tiny-f32.gguf"; }
up_to_date() { [[ -f $dest/hf/config.json && -f $dest/tiny-f32.gguf && -f $dest/stamp && $(<"$dest/stamp") == "$stamp" ]]; }

reuse_or_lock "tiny Llama" "$base"

start=$(date +%s)
tmp=$(mktemp -d "$base/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=$tmp/hf-home
"$vllm_python" "$here/make_model.py" "$tmp"
rm -rf "$tmp/tokenizer-training" "$tmp/hf-home"
PYTHONPATH=$convert/gguf-py "$vllm_python" "$convert/convert_hf_to_gguf.py" "$tmp/hf" \
    --outtype f32 --outfile "$tmp/tiny-f32.gguf" >"$tmp/convert.log" 2>&1 || { tail -30 "$tmp/convert.log" >&2; exit 1; }
rm -f "$tmp/convert.log"
echo "$stamp" >"$tmp/stamp"

rm -rf "$dest"
chmod 755 "$tmp"
mv -T "$tmp" "$dest"
trap - EXIT
echo "build.sh: made in $(( $(date +%s) - start ))s; $(du -sh "$dest/hf" | cut -f1) HF folder, $(du -sh "$dest/tiny-f32.gguf" | cut -f1) GGUF in $dest" >&2
print_result
