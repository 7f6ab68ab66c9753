#!/usr/bin/env bash
# Builds the local control plane from the Go module proxy into a cache outside the checkout:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, helm, promtool,
#   and the prometheus-operator CRDs the chart's optional objects need.
# Binaries land in $VIGIL_CACHE/bin/<name>-<version>; a second run finds them and does nothing.
# Usage: testbed/build.sh [--print-bin-dir]
set -euo pipefail

KUBE_VERSION=${VIGIL_KUBE_VERSION:-v1.36.3}
ETCD_VERSION=${VIGIL_ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${VIGIL_KWOK_VERSION:-v0.8.0}
HELM_VERSION=${VIGIL_HELM_VERSION:-v3.22.0}
# Tools the tests need besides the cluster: promtool (tests the alert rules), and the
# prometheus-operator CRDs (ServiceMonitor, PrometheusRule) so the chart's optional objects are
# checked by a real API server. v0.316.0 is Prometheus 3.16's Go module version.
PROMETHEUS_VERSION=${VIGIL_PROMETHEUS_VERSION:-v0.316.0}
PROMETHEUS_OPERATOR_VERSION=${VIGIL_PROMETHEUS_OPERATOR_VERSION:-v0.85.0}
CACHE=${VIGIL_CACHE:-$HOME/.cache/vigil}
BIN=$CACHE/bin
SRC=$CACHE/src

# The module proxy only; never a toolchain download (the machine's Go must do).
export GOTOOLCHAIN=${GOTOOLCHAIN:-local} CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { printf '[testbed build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[testbed build] ERROR: %s\n' "$*" >&2; exit 1; }

if [[ ${1:-} == --print-bin-dir ]]; then echo "$BIN"; exit 0; fi

command -v go >/dev/null || die "no 'go' on PATH: install Go >= 1.26 (https://go.dev/doc/install) and run again."
go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
(( go_minor >= 26 )) || die "Go $(go env GOVERSION) is too old: Kubernetes ${KUBE_VERSION}, kwok and helm need Go >= 1.26."
mkdir -p "$BIN" "$SRC"

# Runs a go command, and on failure says which module step failed and what usually causes it.
run_go() {
  local what=$1; shift
  local out; out=$(mktemp)
  if ! "$@" >"$out" 2>&1; then
    tail -n 30 "$out" >&2
    if grep -qE 'dial tcp|proxyconnect|i/o timeout|no such host|connection refused' "$out"; then
      die "$what: the Go module proxy ($(go env GOPROXY)) could not be reached. Check GOPROXY and the network."
    elif grep -qE 'not found|unknown revision|invalid version|410 Gone|404 Not Found' "$out"; then
      die "$what: the module proxy refused a module version (see above). Try another version via VIGIL_*_VERSION."
    fi
    die "$what failed (Go's output above)."
  fi
  rm -f "$out"
}

have() { [[ -x $BIN/$1-$2 ]]; }

# Prints a go.mod 'replace' block that pins each of a module's local (staging) replaces
# to the published version: derived from the module's own go.mod, not hard-coded.
published_replaces() {
  local gomod=$1 version=$2
  awk -v v="$version" '
    /=> \.\.?\// && !/FORBIDDEN/ { if ($1 == "replace") { $1 = "" ; sub(/^ /, "") } ; print "replace " $1 " => " $1 " " v }
  ' "$gomod"
}

wrapper_module() { # dir module-path requires... ; then the replace lines on stdin
  local dir=$1 name=$2; shift 2
  mkdir -p "$dir"
  { echo "module $name"; echo; echo "go 1.26.0"; echo;
    for r in "$@"; do echo "require $r"; done; echo; cat; } >"$dir/go.mod"
}

stamp_flags() { # version
  local v=$1 major minor
  major=$(sed -E 's/^v([0-9]+)\..*/\1/' <<<"$v"); minor=$(sed -E 's/^v[0-9]+\.([0-9]+)\..*/\1/' <<<"$v")
  local f="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    f+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$f"
}

build_kubernetes() {
  local missing=()
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do have "$c" "$KUBE_VERSION" || missing+=("$c"); done
  (( ${#missing[@]} )) || { log "kubernetes $KUBE_VERSION: cached"; return; }
  local dir=$SRC/kubernetes-$KUBE_VERSION staging=v0.${KUBE_VERSION#v1.}
  log "kubernetes $KUBE_VERSION: fetching module (staging modules pinned to $staging)"
  run_go "download k8s.io/kubernetes@$KUBE_VERSION" go mod download k8s.io/kubernetes@"$KUBE_VERSION"
  local gomod; gomod=$(go mod download -json k8s.io/kubernetes@"$KUBE_VERSION" | sed -nE 's/.*"GoMod": "(.*)",?/\1/p')
  published_replaces "$gomod" "$staging" | wrapper_module "$dir" vigil.dev/testbed/kubernetes "k8s.io/kubernetes $KUBE_VERSION"
  for c in "${missing[@]}"; do
    log "kubernetes $KUBE_VERSION: building $c (a cold build takes several minutes per binary on 2 cores)"
    (cd "$dir" && run_go "build $c" go build -trimpath -ldflags "$(stamp_flags "$KUBE_VERSION")" \
      -o "$BIN/$c-$KUBE_VERSION.tmp" "k8s.io/kubernetes/cmd/$c")
    mv "$BIN/$c-$KUBE_VERSION.tmp" "$BIN/$c-$KUBE_VERSION"
  done
}

build_etcd() {
  have etcd "$ETCD_VERSION" && { log "etcd $ETCD_VERSION: cached"; return; }
  local dir=$SRC/etcd-$ETCD_VERSION
  log "etcd $ETCD_VERSION: fetching module"
  run_go "download go.etcd.io/etcd/server/v3@$ETCD_VERSION" go mod download go.etcd.io/etcd/server/v3@"$ETCD_VERSION"
  local gomod; gomod=$(go mod download -json go.etcd.io/etcd/server/v3@"$ETCD_VERSION" | sed -nE 's/.*"GoMod": "(.*)",?/\1/p')
  published_replaces "$gomod" "$ETCD_VERSION" | wrapper_module "$dir" vigil.dev/testbed/etcd "go.etcd.io/etcd/server/v3 $ETCD_VERSION"
  log "etcd $ETCD_VERSION: building"
  (cd "$dir" && run_go "build etcd" go build -trimpath -ldflags "-s -w" -o "$BIN/etcd-$ETCD_VERSION.tmp" go.etcd.io/etcd/server/v3)
  mv "$BIN/etcd-$ETCD_VERSION.tmp" "$BIN/etcd-$ETCD_VERSION"
}

build_plain() { # name module/cmd/path version ldflags
  local name=$1 pkg=$2 version=$3 ldflags=${4:-"-s -w"}
  have "$name" "$version" && { log "$name $version: cached"; return; }
  local gobin; gobin=$(mktemp -d)
  log "$name $version: building $pkg@$version"
  GOFLAGS= GOBIN=$gobin run_go "go install $pkg@$version" go install -trimpath -ldflags "$ldflags" "$pkg@$version"
  mv "$gobin/$name" "$BIN/$name-$version"; rmdir "$gobin"
}

# kwok with the patches in testbed/patches/kwok-*.patch, built from its module's source under
# $SRC. The binary's name carries a hash of the patches, so a changed patch rebuilds it.
# (Today one patch: kwok v0.8.0 drops a pod's stage when the API server answers 500, as it does
# while etcd restarts, and the pod then stood Pending until its next event, minutes later; a
# kubelet retries its status updates, so the simulated one must too.)
KWOK_PATCHES=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/patches
KWOK_BUILD=$KWOK_VERSION-p$(cat "$KWOK_PATCHES"/kwok-*.patch | sha256sum | cut -c1-8)
build_kwok() {
  have kwok "$KWOK_BUILD" && { log "kwok $KWOK_BUILD: cached"; return; }
  local mod=sigs.k8s.io/kwok@$KWOK_VERSION src=$SRC/kwok-$KWOK_BUILD
  log "kwok $KWOK_BUILD: building $mod with $(ls "$KWOK_PATCHES"/kwok-*.patch | xargs -n1 basename | tr '\n' ' ')"
  run_go "download $mod" go mod download "$mod"
  local dir; dir=$(go mod download -json "$mod" | sed -nE 's/.*"Dir": "(.*)",?/\1/p')
  rm -rf "$src"; cp -r "$dir" "$src"; chmod -R u+w "$src"
  local p; for p in "$KWOK_PATCHES"/kwok-*.patch; do (cd "$src" && git apply -p1 "$p") || die "$p does not apply to $mod"; done
  (cd "$src" && GOFLAGS= run_go "build kwok" go build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" -o "$BIN/kwok-$KWOK_BUILD" ./cmd/kwok)
}

# The CRDs that prometheus-operator ships, copied from its module (no binary is built).
fetch_prometheus_operator_crds() {
  local dest=$CACHE/crds/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION
  [[ -f $dest/monitoring.coreos.com_servicemonitors.yaml ]] && { log "prometheus-operator CRDs $PROMETHEUS_OPERATOR_VERSION: cached"; return; }
  log "prometheus-operator CRDs $PROMETHEUS_OPERATOR_VERSION: fetching module"
  local mod=github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION
  run_go "download $mod" go mod download "$mod"
  local dir; dir=$(go mod download -json "$mod" | sed -nE 's/.*"Dir": "(.*)",?/\1/p')
  mkdir -p "$dest.tmp"
  cp "$dir"/example/prometheus-operator-crd/monitoring.coreos.com_{servicemonitors,prometheusrules}.yaml "$dest.tmp/"
  chmod u+w "$dest.tmp"/*; rm -rf "$dest"; mv "$dest.tmp" "$dest"
  ln -sfn "prometheus-operator-$PROMETHEUS_OPERATOR_VERSION" "$CACHE/crds/prometheus-operator"
}

# kstatus: sigs.k8s.io/cli-utils' status library (what Flux and kpt compute health with), behind
# the tiny reader in testbed/tools/kstatus (JSON objects on stdin, one status line each; the
# kstatus tests use it). The cli-utils version is the one its go.mod requires. Built in a copy
# under $SRC, so -mod=mod never edits the checkout; the stamp holds a hash of the tool's files,
# so an edit of the tool rebuilds it and nothing else does.
KSTATUS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/tools/kstatus
KSTATUS_VERSION=$(sed -nE 's/^[[:space:]]*(require[[:space:]]+)?sigs\.k8s\.io\/cli-utils[[:space:]]+(v[^[:space:]]+).*/\2/p' "$KSTATUS_DIR/go.mod")
build_kstatus() {
  [[ -n $KSTATUS_VERSION ]] || die "no sigs.k8s.io/cli-utils version in $KSTATUS_DIR/go.mod"
  local stamp; stamp=$(cd "$KSTATUS_DIR" && cat go.mod go.sum main.go | sha256sum | cut -c1-16)
  if have kstatus "$KSTATUS_VERSION" && [[ $(cat "$BIN/kstatus-$KSTATUS_VERSION.stamp" 2>/dev/null) == "$stamp" ]]; then
    log "kstatus (cli-utils $KSTATUS_VERSION): cached"; return
  fi
  local dir=$SRC/kstatus-$KSTATUS_VERSION
  log "kstatus (cli-utils $KSTATUS_VERSION): building"
  rm -rf "$dir"; mkdir -p "$dir"; cp "$KSTATUS_DIR"/{go.mod,go.sum,main.go} "$dir/"
  (cd "$dir" && run_go "build kstatus" go build -trimpath -ldflags "-s -w" -o "$BIN/kstatus-$KSTATUS_VERSION.tmp" .)
  mv "$BIN/kstatus-$KSTATUS_VERSION.tmp" "$BIN/kstatus-$KSTATUS_VERSION"
  echo "$stamp" >"$BIN/kstatus-$KSTATUS_VERSION.stamp"
}

start=$SECONDS
build_etcd
build_kubernetes
build_kwok
build_plain helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
build_plain promtool github.com/prometheus/prometheus/cmd/promtool "$PROMETHEUS_VERSION" \
  "-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION"
fetch_prometheus_operator_crds
build_kstatus

# Stable names for the chosen versions, so PATH=$BIN works.
for pair in "etcd $ETCD_VERSION" "kube-apiserver $KUBE_VERSION" "kube-controller-manager $KUBE_VERSION" \
            "kube-scheduler $KUBE_VERSION" "kubectl $KUBE_VERSION" "kwok $KWOK_BUILD" "helm $HELM_VERSION" \
            "promtool $PROMETHEUS_VERSION" "kstatus $KSTATUS_VERSION"; do
  set -- $pair; ln -sfn "$1-$2" "$BIN/$1"
done
log "done in $((SECONDS - start))s: binaries in $BIN"
