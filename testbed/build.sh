#!/usr/bin/env bash
# Builds the local control plane from the Go module proxy into a cache outside the checkout.
# Binaries land in $VIGIL_CACHE/bin/<name>-<version>; a second run finds them and does nothing.
#
# Usage: testbed/build.sh [demo|real-node|all] [--print-bin-dir]
#   demo  what `make up` needs: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
#         kubectl and kwok.
#   real-node  what `make up REAL_NODE=1` needs: that, and the kubelet with containerd (below).
#   all   (the default; `make testbed`, `make test`) that, and what only the tests use: helm,
#         helm-docs (renders the chart's values table), promtool, the prometheus-operator CRDs
#         the chart's optional objects need, kstatus, and
#         the kubelet of the bed's one real node (testbed/node.py), with containerd (Debian's
#         package, installed with apt-get when missing; it is no Go build).
# Each step prints "[build step N/M]" lines: what it fetches or compiles and the time it has taken,
# every $VIGIL_BUILD_PROGRESS_SECONDS (15) seconds, or on one line updated in place on a terminal.
set -euo pipefail

KUBE_VERSION=${VIGIL_KUBE_VERSION:-v1.36.3}
ETCD_VERSION=${VIGIL_ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${VIGIL_KWOK_VERSION:-v0.8.0}
HELM_VERSION=${VIGIL_HELM_VERSION:-v3.22.0}
# helm-docs renders charts/vigil/README.md's values table from values.yaml's `# --` comments
# (tests/unit/deploy/test_chart_readme.py checks the README is what it renders).
HELM_DOCS_VERSION=${VIGIL_HELM_DOCS_VERSION:-v1.14.2}
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

die() { progress_clear; printf '[build] ERROR: %s\n' "$*" >&2; exit 1; }

TARGET=all
for arg in "$@"; do
  case $arg in
    --print-bin-dir) echo "$BIN"; exit 0 ;;
    demo|real-node|all) TARGET=$arg ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) printf 'testbed/build.sh: unknown argument %q (demo, real-node, all or --print-bin-dir)\n' "$arg" >&2; exit 2 ;;
  esac
done

# --- progress ---------------------------------------------------------------------------------
# What each step took from cold on 2 cores, measured with VIGIL_CACHE, GOMODCACHE and GOCACHE in
# an empty directory: `demo` 7m06s, then `all` 6m22s more. A later Kubernetes binary reuses most
# of what the one before it compiled. (kubelet: not measured cold; 10m30s with warm module caches
# beside a running benchmark on 2 cores, 2026-12-03; containerd: an apt-get install.) Measured
# again on 2026-12-03, `make up` in a fresh clone: `demo` took 13m05s (etcd 74 s, kube-apiserver
# 452, kube-controller-manager 121, kube-scheduler 16, kubectl 33, kwok 88): the same machine
# runs from one to two times these figures, so they are the fast end.
# (helm-docs: not measured cold; a small module, 10 s with warm module caches on 2026-12-07.)
declare -A COLD=([etcd]=56 [kube-apiserver]=209 [kube-controller-manager]=61 [kube-scheduler]=10
  [kubectl]=22 [kwok]=73 [helm]=71 [helm-docs]=60 [promtool]=294 [prometheus-operator-crds]=5 [kstatus]=17
  [kubelet]=180 [containerd]=60)
# The disk a cold build leaves in Go's module and build caches ($GOMODCACHE, $GOCACHE), and in
# $BIN, in GB, measured the same way (`demo`: 1.1 GB of modules, 3.7 GB of build cache).
declare -A COLD_GO_GB=([demo]=4.8 [real-node]=5.0 [all]=9.0) COLD_BIN_GB=([demo]=0.4 [real-node]=0.5 [all]=0.55)
PROGRESS_EVERY=${VIGIL_BUILD_PROGRESS_SECONDS:-15}
TTY=0; [[ -t 2 ]] && TTY=1
STEP=0 STEPS=0 STEP_BEGAN=$SECONDS STEP_NAME=
GO_OUT= GO_PID=  # the output of the last run_go; the go command running now

hms() { local s=$1; if (( s >= 60 )); then printf '%dm%02ds' $((s / 60)) $((s % 60)); else printf '%ds' "$s"; fi; }
progress_clear() { if (( TTY )); then printf '\r\033[K' >&2; fi; }
say() { progress_clear; printf '[build step %d/%d] %s\n' "$STEP" "$STEPS" "$*" >&2; }
note() { progress_clear; printf '[build] %s\n' "$*" >&2; }
# A line saying the step is alive, ending with the step's time so far: on a terminal it replaces
# the previous one, its middle cut to the terminal's width so that the time stays in sight.
alive() {
  local line tail=" ($(hms $((SECONDS - STEP_BEGAN))))"
  line=$(printf '[build step %d/%d] %s' "$STEP" "$STEPS" "$*")
  if (( TTY )); then
    local cols=${COLUMNS:-$(tput cols 2>/dev/null || echo 100)}
    (( ${#line} + ${#tail} < cols )) || line="${line:0:cols - ${#tail} - 4}..."
    printf '\r\033[K%s%s' "$line" "$tail" >&2
  else
    printf '%s%s\n' "$line" "$tail" >&2
  fi
}

# What a go command has done so far, from its output: the modules it fetched and, when it
# compiles (TOTAL is not -), the packages it compiled (of TOTAL, when known), and the last one.
go_progress() {
  local out=$1 total=$2 fetched compiled last parts=()
  fetched=$(grep -c '^go: downloading' "$out" || true)
  (( fetched )) && parts+=("$fetched modules fetched")
  if [[ $total == - ]]; then
    last=$(grep '^go: downloading' "$out" | tail -n 1 | sed -E 's/^go: downloading //')
    (( ${#parts[@]} )) || parts=("resolving modules")
  else
    compiled=$(grep -cvE '^(go: |#|\s)' "$out" || true)
    last=$(grep -vE '^\s' "$out" | tail -n 1 | sed -E 's/^go: downloading //')
    if (( compiled )); then
      parts+=("compiled $compiled${total:+ of its $total} packages")
    else
      parts+=("linking, or reading Go's build cache")
    fi
  fi
  [[ -n $last ]] && parts+=("last: ${last:0:70}")
  local IFS=';'; echo "${parts[*]}" | sed 's/;/, /g'
}

# run_go WHAT TOTAL CMD...: runs a go command with its output in a file ($GO_OUT), saying every
# $PROGRESS_EVERY seconds (each second on a terminal) what it fetches and compiles (TOTAL: the
# packages to compile, empty when unknown, - when it compiles nothing). On failure: Go's last
# lines, and which module step failed and what usually causes it.
run_go() {
  local what=$1 total=$2; shift 2
  [[ -n $GO_OUT ]] && rm -f "$GO_OUT"
  GO_OUT=$(mktemp)
  "$@" >"$GO_OUT" 2>&1 &
  local pid=$! shown=$SECONDS every=$PROGRESS_EVERY rc=0
  GO_PID=$pid
  (( TTY )) && every=1
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.2
    if (( SECONDS - shown >= every )); then
      shown=$SECONDS
      alive "$STEP_NAME: $what: $(go_progress "$GO_OUT" "$total")"
    fi
  done
  wait "$pid" || rc=$?
  GO_PID=
  progress_clear
  if (( rc )); then
    tail -n 30 "$GO_OUT" >&2
    if grep -qE 'dial tcp|proxyconnect|i/o timeout|no such host|connection refused' "$GO_OUT"; then
      die "$STEP_NAME: $what: the Go module proxy ($(go env GOPROXY)) could not be reached. Check GOPROXY and the network."
    elif grep -qE 'not found|unknown revision|invalid version|410 Gone|404 Not Found' "$GO_OUT"; then
      die "$STEP_NAME: $what: the module proxy refused a module version (see above). Try another version via VIGIL_*_VERSION."
    fi
    die "$STEP_NAME: $what failed (Go's output above)."
  fi
}
# Stopped (Ctrl-C, a timeout's SIGTERM): the go command in the background stops too.
trap '[[ -n $GO_PID ]] && kill "$GO_PID" 2>/dev/null; [[ -n $GO_OUT ]] && rm -f "$GO_OUT"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# go list -deps, run as a step's "fetching" phase (it downloads every module the build needs):
# sets PACKAGES to how many packages the build will compile.
count_packages() { # what cmd...
  local what=$1; shift
  run_go "$what" - "$@"
  PACKAGES=$(grep -cvE '^(go: |#|\s)' "$GO_OUT" || true)
}

have() { [[ -x $BIN/$1-$2 ]]; }

# --- the steps -------------------------------------------------------------------------------

command -v go >/dev/null || die "no 'go' on PATH: install Go >= 1.26 (https://go.dev/doc/install) and run again."
go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
(( go_minor >= 26 )) || die "Go $(go env GOVERSION) is too old: Kubernetes ${KUBE_VERSION}, kwok and helm need Go >= 1.26."
mkdir -p "$BIN" "$SRC"

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

# The wrapper module the four Kubernetes binaries are built in (once per run).
KUBE_DIR=$SRC/kubernetes-$KUBE_VERSION
kube_module() {
  [[ -n ${KUBE_MODULE_READY:-} ]] && return
  local staging=v0.${KUBE_VERSION#v1.}
  run_go "fetching k8s.io/kubernetes@$KUBE_VERSION (staging modules pinned to $staging)" - \
    go mod download k8s.io/kubernetes@"$KUBE_VERSION"
  local gomod; gomod=$(go mod download -json k8s.io/kubernetes@"$KUBE_VERSION" | sed -nE 's/.*"GoMod": "(.*)",?/\1/p')
  published_replaces "$gomod" "$staging" | wrapper_module "$KUBE_DIR" vigil.dev/testbed/kubernetes "k8s.io/kubernetes $KUBE_VERSION"
  KUBE_MODULE_READY=1
}

build_kube() { # component
  local c=$1 pkg=k8s.io/kubernetes/cmd/$1
  kube_module
  cd "$KUBE_DIR"
  count_packages "fetching the modules of $pkg" go list -deps "$pkg"
  run_go "compiling $pkg" "$PACKAGES" go build -v -trimpath -ldflags "$(stamp_flags "$KUBE_VERSION")" \
    -o "$BIN/$c-$KUBE_VERSION.tmp" "$pkg"
  cd - >/dev/null
  mv "$BIN/$c-$KUBE_VERSION.tmp" "$BIN/$c-$KUBE_VERSION"
}

# The kubelet of the real node (testbed/node.py): the same Kubernetes module, in a wrapper module
# of its own, because it needs go.sum entries the other binaries do not (k8s.io/cri-streaming,
# through pkg/kubelet/server), which `go get` adds there.
build_kubelet() {
  local pkg=k8s.io/kubernetes/cmd/kubelet dir=$SRC/kubelet-$KUBE_VERSION
  kube_module
  mkdir -p "$dir"; cp "$KUBE_DIR/go.mod" "$dir/go.mod"
  cd "$dir"
  run_go "adding the go.sum entries of k8s.io/kubernetes/pkg/kubelet/server" - \
    go get k8s.io/kubernetes/pkg/kubelet/server@"$KUBE_VERSION"
  count_packages "fetching the modules of $pkg" go list -deps "$pkg"
  run_go "compiling $pkg" "$PACKAGES" go build -v -trimpath -ldflags "$(stamp_flags "$KUBE_VERSION")" \
    -o "$BIN/kubelet-$KUBE_VERSION.tmp" "$pkg"
  cd - >/dev/null
  mv "$BIN/kubelet-$KUBE_VERSION.tmp" "$BIN/kubelet-$KUBE_VERSION"
}

# containerd for the real node: Debian's package (1.6.20 on Debian 12), not built here. Needs root
# (or sudo); CNI plugins come from containernetworking-plugins (podman's dependency), in /usr/lib/cni.
containerd_installed() { command -v containerd >/dev/null && command -v ctr >/dev/null && [[ -x /usr/lib/cni/bridge ]]; }
install_containerd() {
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -y -qq -o Dpkg::Use-Pty=0) sudo=()
  (( EUID == 0 )) || { command -v sudo >/dev/null || die "containerd is missing: install it as root (apt-get install containerd containernetworking-plugins)"; sudo=(sudo); }
  command -v apt-get >/dev/null || die "containerd is missing and there is no apt-get: install containerd and the CNI plugins (bridge, host-local, portmap in /usr/lib/cni)"
  say "containerd: apt-get install containerd containernetworking-plugins"
  if ! "${sudo[@]}" "${apt[@]}" install containerd containernetworking-plugins >/dev/null 2>&1; then
    "${sudo[@]}" "${apt[@]}" update >/dev/null || die "apt-get update failed"
    "${sudo[@]}" "${apt[@]}" install containerd containernetworking-plugins >/dev/null || die "apt-get install containerd failed"
  fi
  # The package's own service is not what the node uses (testbed/node.py starts its own).
  containerd_installed || die "containerd installed, yet containerd, ctr or /usr/lib/cni/bridge is missing"
}

build_etcd() {
  local dir=$SRC/etcd-$ETCD_VERSION pkg=go.etcd.io/etcd/server/v3
  run_go "fetching $pkg@$ETCD_VERSION" - go mod download "$pkg@$ETCD_VERSION"
  local gomod; gomod=$(go mod download -json "$pkg@$ETCD_VERSION" | sed -nE 's/.*"GoMod": "(.*)",?/\1/p')
  published_replaces "$gomod" "$ETCD_VERSION" | wrapper_module "$dir" vigil.dev/testbed/etcd "$pkg $ETCD_VERSION"
  cd "$dir"
  count_packages "fetching the modules of $pkg" go list -deps "$pkg"
  run_go "compiling $pkg" "$PACKAGES" go build -v -trimpath -ldflags "-s -w" -o "$BIN/etcd-$ETCD_VERSION.tmp" "$pkg"
  cd - >/dev/null
  mv "$BIN/etcd-$ETCD_VERSION.tmp" "$BIN/etcd-$ETCD_VERSION"
}

build_plain() { # name module/cmd/path version ldflags
  local name=$1 pkg=$2 version=$3 ldflags=$4
  local gobin; gobin=$(mktemp -d)
  GOFLAGS= GOBIN=$gobin run_go "fetching and compiling $pkg@$version" "" \
    go install -v -trimpath -ldflags "$ldflags" "$pkg@$version"
  mv "$gobin/$name" "$BIN/$name-$version"; rmdir "$gobin"
}
build_helm() {
  build_plain helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
}
build_helm_docs() {
  build_plain helm-docs github.com/norwoodj/helm-docs/cmd/helm-docs "$HELM_DOCS_VERSION" "-s -w"
}
build_promtool() {
  build_plain promtool github.com/prometheus/prometheus/cmd/promtool "$PROMETHEUS_VERSION" \
    "-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION"
}

# kwok with the patches in testbed/patches/kwok-*.patch, built from its module's source under
# $SRC. The binary's name carries a hash of the patches, so a changed patch rebuilds it.
# (Today one patch: kwok v0.8.0 drops a pod's stage when the API server answers 500, as it does
# while etcd restarts, and the pod then stood Pending until its next event, minutes later; a
# kubelet retries its status updates, so the simulated one must too.)
KWOK_PATCHES=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/patches
KWOK_BUILD=$KWOK_VERSION-p$(cat "$KWOK_PATCHES"/kwok-*.patch | sha256sum | cut -c1-8)
build_kwok() {
  local mod=sigs.k8s.io/kwok@$KWOK_VERSION src=$SRC/kwok-$KWOK_BUILD
  run_go "fetching $mod" - go mod download "$mod"
  local dir; dir=$(go mod download -json "$mod" | sed -nE 's/.*"Dir": "(.*)",?/\1/p')
  rm -rf "$src"; cp -r "$dir" "$src"; chmod -R u+w "$src"
  local p; for p in "$KWOK_PATCHES"/kwok-*.patch; do
    say "kwok $KWOK_BUILD: applying $(basename "$p")"
    (cd "$src" && git apply -p1 "$p") || die "$p does not apply to $mod"
  done
  cd "$src"
  GOFLAGS= count_packages "fetching the modules of kwok" go list -deps ./cmd/kwok
  GOFLAGS= run_go "compiling sigs.k8s.io/kwok/cmd/kwok" "$PACKAGES" go build -v -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" -o "$BIN/kwok-$KWOK_BUILD" ./cmd/kwok
  cd - >/dev/null
}

# The CRDs that prometheus-operator ships, copied from its module (no binary is built).
PROMETHEUS_OPERATOR_CRDS=$CACHE/crds/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION
fetch_prometheus_operator_crds() {
  local dest=$PROMETHEUS_OPERATOR_CRDS mod=github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION
  run_go "fetching $mod" - go mod download "$mod"
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
[[ -n $KSTATUS_VERSION ]] || die "no sigs.k8s.io/cli-utils version in $KSTATUS_DIR/go.mod"
KSTATUS_STAMP=$(cd "$KSTATUS_DIR" && cat go.mod go.sum main.go | sha256sum | cut -c1-16)
kstatus_cached() {
  have kstatus "$KSTATUS_VERSION" && [[ $(cat "$BIN/kstatus-$KSTATUS_VERSION.stamp" 2>/dev/null) == "$KSTATUS_STAMP" ]]
}
build_kstatus() {
  local dir=$SRC/kstatus-$KSTATUS_VERSION
  rm -rf "$dir"; mkdir -p "$dir"; cp "$KSTATUS_DIR"/{go.mod,go.sum,main.go} "$dir/"
  cd "$dir"
  count_packages "fetching the modules of kstatus" go list -deps .
  run_go "compiling testbed/tools/kstatus" "$PACKAGES" go build -v -trimpath -ldflags "-s -w" -o "$BIN/kstatus-$KSTATUS_VERSION.tmp" .
  cd - >/dev/null
  mv "$BIN/kstatus-$KSTATUS_VERSION.tmp" "$BIN/kstatus-$KSTATUS_VERSION"
  echo "$KSTATUS_STAMP" >"$BIN/kstatus-$KSTATUS_VERSION.stamp"
}

# Each step: name, version, whether it is cached (a command), how to build it (a command).
STEP_LIST=(
  "etcd|$ETCD_VERSION|have etcd $ETCD_VERSION|build_etcd"
  "kube-apiserver|$KUBE_VERSION|have kube-apiserver $KUBE_VERSION|build_kube kube-apiserver"
  "kube-controller-manager|$KUBE_VERSION|have kube-controller-manager $KUBE_VERSION|build_kube kube-controller-manager"
  "kube-scheduler|$KUBE_VERSION|have kube-scheduler $KUBE_VERSION|build_kube kube-scheduler"
  "kubectl|$KUBE_VERSION|have kubectl $KUBE_VERSION|build_kube kubectl"
  "kwok|$KWOK_BUILD|have kwok $KWOK_BUILD|build_kwok"
)
if [[ $TARGET == all ]]; then
  STEP_LIST+=(
    "helm|$HELM_VERSION|have helm $HELM_VERSION|build_helm"
    "helm-docs|$HELM_DOCS_VERSION|have helm-docs $HELM_DOCS_VERSION|build_helm_docs"
    "promtool|$PROMETHEUS_VERSION|have promtool $PROMETHEUS_VERSION|build_promtool"
    "prometheus-operator-crds|$PROMETHEUS_OPERATOR_VERSION|test -f $PROMETHEUS_OPERATOR_CRDS/monitoring.coreos.com_servicemonitors.yaml|fetch_prometheus_operator_crds"
    "kstatus|$KSTATUS_VERSION|kstatus_cached|build_kstatus"
  )
fi
if [[ $TARGET == all || $TARGET == real-node ]]; then
  STEP_LIST+=(
    "kubelet|$KUBE_VERSION|have kubelet $KUBE_VERSION|build_kubelet"
    "containerd|(Debian)|containerd_installed|install_containerd"
  )
fi
STEPS=${#STEP_LIST[@]}

start=$SECONDS
missing=() cold=0 cold_all=0
for entry in "${STEP_LIST[@]}"; do
  IFS='|' read -r name version cached build <<<"$entry"
  cold_all=$((cold_all + COLD[$name]))
  # shellcheck disable=SC2086  # the cached check is a command line of words
  $cached || { missing+=("$name"); cold=$((cold + COLD[$name])); }
done
if (( ${#missing[@]} )); then
  note "testbed/build.sh $TARGET: $STEPS steps, ${#missing[@]} to build from the Go module proxy (${missing[*]}) into $BIN."
  part=; (( cold < cold_all )) && part="; what is missing here, about $(hms $cold)"
  note "A cold first run of \`$TARGET\` (empty Go caches) takes about $(hms $cold_all) on 2 cores (this machine has $(nproc)$part) and leaves about ${COLD_GO_GB[$TARGET]} GB in Go's module and build caches ($(go env GOMODCACHE), $(go env GOCACHE); \`go clean -cache\` frees the build cache afterwards) and ${COLD_BIN_GB[$TARGET]} GB of binaries. Later runs find the binaries and take a second."
fi

built=0
for entry in "${STEP_LIST[@]}"; do
  IFS='|' read -r name version cached build <<<"$entry"
  STEP=$((STEP + 1)) STEP_NAME="$name $version" STEP_BEGAN=$SECONDS
  # shellcheck disable=SC2086
  if $cached; then say "$STEP_NAME: cached"; continue; fi
  say "$STEP_NAME: building (cold: about $(hms "${COLD[$name]}") on 2 cores)"
  # shellcheck disable=SC2086
  $build
  built=$((built + 1))
  say "$STEP_NAME: built in $(hms $((SECONDS - STEP_BEGAN)))"
done

# Stable names for the chosen versions, so PATH=$BIN works.
links=("etcd $ETCD_VERSION" "kube-apiserver $KUBE_VERSION" "kube-controller-manager $KUBE_VERSION"
       "kube-scheduler $KUBE_VERSION" "kubectl $KUBE_VERSION" "kwok $KWOK_BUILD")
[[ $TARGET == all ]] && links+=("helm $HELM_VERSION" "helm-docs $HELM_DOCS_VERSION" "promtool $PROMETHEUS_VERSION" "kstatus $KSTATUS_VERSION")
[[ $TARGET == all || $TARGET == real-node ]] && links+=("kubelet $KUBE_VERSION")
for pair in "${links[@]}"; do
  set -- $pair; ln -sfn "$1-$2" "$BIN/$1"
done
if (( built )); then
  note "done in $(hms $((SECONDS - start))): $built of $STEPS steps built, the rest cached; binaries in $BIN ($(du -sh "$BIN" | cut -f1))"
else
  note "done in $(hms $((SECONDS - start))): all $STEPS steps cached in $BIN"
fi
