#!/usr/bin/env bash
# Build the helm that gputally's chart tests run (issue 16: helm lint, helm template,
# helm install / uninstall against the harness's kube-apiserver).
#
#   tests/harness/helm/build.sh           build if needed, then print HELM=<path>
#   tests/harness/helm/build.sh --check   print the path if an up-to-date build is cached,
#                                         else exit 3 without building (used by the fixture)
#
# `go install helm.sh/helm/v3/cmd/helm@$version` with GOBIN in the cache, outside the repo:
#
#   ${GPUTALLY_CACHE:-$HOME/.cache/gputally}/helm/<version>/
#       helm, stamp
#       crds/   the Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule CRDs,
#               from its Go module (example/prometheus-operator-crd/), pinned below
#
# The stamp hashes this script, so a change to it rebuilds and an unchanged tree returns at
# once. Network use is the Go module proxy only; the Go toolchain is never downloaded
# (GOTOOLCHAIN=local). About 2 minutes on 2 cores. Output on stdout: HELM=... and
# PROMETHEUS_OPERATOR_CRDS=...
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=v3.22.0   # helm.sh/helm/v3 module version = the Helm release
kube_minor=37     # its k8s.io/client-go is v0.37.0: Helm's Makefile stamps Kubernetes 1.37
operator_module=github.com/prometheus-operator/prometheus-operator
operator_version=v0.85.0   # the Prometheus Operator release whose CRDs the tests install

# shellcheck source=../cached_build.sh
source "$here/../cached_build.sh"
parse_mode "$@"

cache_root=${GPUTALLY_CACHE:-${HOME:?HOME is unset}/.cache/gputally}
base=$cache_root/helm
dest=$base/$version
stamp=$(cat "$here/build.sh" "$here/../cached_build.sh" | sha256sum | cut -c1-32)

print_result() { echo "HELM=$dest/helm"; echo "PROMETHEUS_OPERATOR_CRDS=$dest/crds"; }
up_to_date() { [[ -x $dest/helm && -d $dest/crds && -f $dest/stamp && $(<"$dest/stamp") == "$stamp" ]]; }

reuse_or_lock helm "$base"
find_go
export GOTOOLCHAIN=local CGO_ENABLED=0
unset GOFLAGS   # `go install pkg@version` builds the module as released

start=$(date +%s)
tmp=$(mktemp -d "$base/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "build.sh: building helm $version with $(go env GOVERSION) into $dest" >&2
# The variables Helm's Makefile sets: its version (else `helm version` is a dev build), and the
# Kubernetes version that `helm template` and `helm lint` assume without a cluster (1.<minor of
# client-go>; unset, it is 1.20 and a chart's kubeVersion: ">=1.29" refuses to render).
h=helm.sh/helm/v3
ldflags="-s -w -X $h/internal/version.version=$version"
for pkg in pkg/lint/rules pkg/chartutil; do
    ldflags+=" -X $h/$pkg.k8sVersionMajor=1 -X $h/$pkg.k8sVersionMinor=$kube_minor"
done
GOBIN=$tmp go install -trimpath -ldflags="$ldflags" "helm.sh/helm/v3/cmd/helm@$version" >&2
"$tmp/helm" version --short >&2
"$tmp/helm" version --template '{{.Version}}' | grep -qx "$version" \
    || { echo "build.sh: the built helm does not report $version" >&2; exit 1; }
# The stamped Kubernetes version is what `helm template` renders for.
mkdir -p "$tmp/kube-version/templates"
printf 'apiVersion: v2\nname: kube-version\nversion: 0.0.0\n' >"$tmp/kube-version/Chart.yaml"
printf 'kind: ConfigMap\napiVersion: v1\nmetadata: {name: v}\ndata: {v: "{{ .Capabilities.KubeVersion.Version }}"}\n' \
    >"$tmp/kube-version/templates/v.yaml"
"$tmp/helm" template "$tmp/kube-version" | grep -q "{v: \"v1.$kube_minor.0\"}" \
    || { echo "build.sh: helm template does not assume Kubernetes 1.$kube_minor" >&2; exit 1; }
rm -r "$tmp/kube-version"

# The Prometheus Operator's CRDs for ServiceMonitor, PodMonitor and PrometheusRule, as the
# operator's release ships them (example/prometheus-operator-crd/ in its Go module), so the
# chart's monitoring objects are validated against their real schemas by the test API server.
echo "build.sh: fetching the CRDs of $operator_module@$operator_version" >&2
operator_dir=$(go mod download -json "$operator_module@$operator_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
mkdir "$tmp/crds"
for kind in servicemonitors podmonitors prometheusrules; do
    cp "$operator_dir/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$tmp/crds/"
done
chmod 644 "$tmp"/crds/*
echo "$stamp" >"$tmp/stamp"

rm -rf "$dest"
chmod 755 "$tmp"
mv -T "$tmp" "$dest"
trap - EXIT
echo "build.sh: built in $(( $(date +%s) - start ))s; $(du -sh "$dest/helm" | cut -f1) helm in $dest" >&2
print_result
