#!/usr/bin/env bash
# Check that collector/gputallyprocessor's generated files are what its metadata.yaml makes:
# run mdatagen on a copy of the component and compare every file it writes with the committed
# one (contrib's `make generate` and a clean `git diff`). After editing metadata.yaml, run
#   (cd collector/gputallyprocessor && "$(tests/harness/mdatagen/build.sh | cut -d= -f2)" metadata.yaml)
#
#   tests/harness/mdatagen/check.sh MDATAGEN
set -euo pipefail

mdatagen=${1:?usage: check.sh MDATAGEN (the binary tests/harness/mdatagen/build.sh prints)}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
component=$(cd "$here/../../../collector/gputallyprocessor" && pwd)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
copy=$tmp/gputallyprocessor   # mdatagen names the Go package after its folder
cp -r "$component" "$copy"
(cd "$copy" && GOTOOLCHAIN=local "$mdatagen" metadata.yaml)

stale=0
while IFS= read -r -d '' file; do
    name=${file#"$copy"/}
    if ! cmp -s "$file" "$component/$name"; then
        echo "check.sh: $name differs from what mdatagen makes of metadata.yaml" >&2
        stale=1
    fi
done < <(find "$copy" -type f \( -name 'generated_*' -o -name documentation.md \) -print0)
if ((stale)); then
    echo "check.sh: regenerate: (cd collector/gputallyprocessor && $mdatagen metadata.yaml)" >&2
    exit 1
fi
echo "check.sh: collector/gputallyprocessor's generated files are current (mdatagen $("$mdatagen" --version 2>/dev/null | head -1 || true))" >&2
