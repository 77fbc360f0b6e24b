#!/usr/bin/env bash
# Regenerate the code committed next to gputally's .proto files, so that it is reproducible.
#
#   proto/generate.sh
#
# Python (every proto/*/v1/*.proto; committed beside it as *_pb2.py, *_pb2.pyi, *_pb2_grpc.py):
#   grpcio-tools 1.64.1 (bundles protoc 26.1, protobuf gencode 5.26.1). That gencode does not
#   pin a runtime, so it loads under every protobuf that pyproject admits (>=5.26, 7.x today);
#   newer grpcio-tools emit a check that refuses older runtimes. Installed into a throwaway
#   venv under $PROTO_TOOLS. The *_pb2_grpc.py files import their *_pb2 by the top-level name
#   protoc knows (bridge.v1); they are rewritten to the installed one (gputally.proto.bridge.v1).
#
# Go (proto/bridge/v1/bridge.proto only; into collector/gputallyprocessor/internal/bridgepb):
#   protoc from PATH or $PROTOC (grpcio-tools' bundled protoc 26.1 was used: PROTOC may name a
#   script running `$PROTO_TOOLS/venv/bin/python -m grpc_tools.protoc "$@"`),
#   protoc-gen-go v1.36.12 (= the google.golang.org/protobuf the Collector v0.161.0 requires),
#   protoc-gen-go-grpc v1.6.2 (generated code needs grpc-go >= 1.64; the Collector has 1.83),
#   both installed with `go install` into $PROTO_TOOLS/bin (GOTOOLCHAIN=local).
#
# Tools are reused when their versions match; $PROTO_TOOLS defaults to /tmp/gputally-proto-tools.
set -euo pipefail

GRPCIO_TOOLS_VERSION=1.64.1
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
GO_MODULE=github.com/gputally/gputally/collector/gputallyprocessor

proto=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$proto")
tools=${PROTO_TOOLS:-/tmp/gputally-proto-tools}
mkdir -p "$tools/bin"

# --- Python ----------------------------------------------------------------------------------
py=$tools/venv/bin/python
tools_version=$("$py" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))' 2>/dev/null || true)
if [[ $tools_version != "$GRPCIO_TOOLS_VERSION" ]]; then
    echo "generate.sh: installing grpcio-tools $GRPCIO_TOOLS_VERSION into $tools/venv" >&2
    python3 -m venv "$tools/venv"
    "$py" -m pip install -q "grpcio-tools==$GRPCIO_TOOLS_VERSION"
fi
cd "$proto"
for file in */v1/*.proto; do
    "$py" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. "$file"
    dir=$(dirname "$file")                       # e.g. bridge/v1
    stem=$(basename "$file" .proto)              # e.g. bridge
    # protoc's import: "from bridge.v1 import bridge_pb2 as ..."; installed: gputally.proto.bridge.v1
    sed -i "s#^from ${dir//\//.} import ${stem}_pb2 as#from gputally.proto.${dir//\//.} import ${stem}_pb2 as#" \
        "$dir/${stem}_pb2_grpc.py"
    grep -q "^from gputally.proto.${dir//\//.} import ${stem}_pb2 as" "$dir/${stem}_pb2_grpc.py" ||
        { echo "generate.sh: could not rewrite the import in $dir/${stem}_pb2_grpc.py" >&2; exit 1; }
done

# --- Go --------------------------------------------------------------------------------------
export GOTOOLCHAIN=local
PATH=/usr/local/go/bin:$PATH
installed_version() { go version -m "$1" 2>/dev/null | awk '$1 == "mod" { print $3; exit }'; }
if [[ $(installed_version "$tools/bin/protoc-gen-go") != "$PROTOC_GEN_GO_VERSION" ]]; then
    GOBIN=$tools/bin go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
fi
if [[ $(installed_version "$tools/bin/protoc-gen-go-grpc") != "$PROTOC_GEN_GO_GRPC_VERSION" ]]; then
    GOBIN=$tools/bin go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION"
fi
protoc=${PROTOC:-protoc}
command -v "$protoc" >/dev/null || { echo "generate.sh: no protoc (apt-get install protobuf-compiler, or set PROTOC)" >&2; exit 1; }
out=$repo/collector/gputallyprocessor
"$protoc" -I. \
    --plugin=protoc-gen-go="$tools/bin/protoc-gen-go" --go_out="$out" --go_opt=module=$GO_MODULE \
    --plugin=protoc-gen-go-grpc="$tools/bin/protoc-gen-go-grpc" --go-grpc_out="$out" --go-grpc_opt=module=$GO_MODULE \
    bridge/v1/bridge.proto
echo "generate.sh: regenerated Python under $proto and Go under $out/internal/bridgepb" >&2
