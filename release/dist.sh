#!/usr/bin/env bash
# Vigil's release artifacts, from the checkout as it is, into dist/ (`make dist`), each named with
# the one version, vigil.__version__ (operator/vigil/__init__.py):
#
#   vigil-<v>.tgz                 the chart (`helm install vigil dist/vigil-<v>.tgz -n vigil-system --create-namespace`)
#   install.yaml                  the chart rendered with its defaults but tls.managedByOperator=true (no key in
#                                 the file: the operator makes its certificates at start), namespace vigil-system,
#                                 CRDs and the namespace included, no hooks (`kubectl apply --server-side -f dist/install.yaml`)
#   kustomize/                    a kustomize base over that file (`resources: [kustomize/]` in yours)
#   vigil-image-<v>.oci.tar       the image (`podman save --format oci-archive`), named localhost/vigil:<v>,
#   image-tags.txt                the chart's default image; its names and the image's digest
#   kubectl-vigil                 the plugin, one file that any Python 3.11+ runs (release/plugin.py)
#   kubectl-vigil-<v>.tar.gz      that file archived for krew, and
#   krew.yaml                     its krew manifest, with the archive's sha256
#   SHA256SUMS                    the sha256 of every file above (`sha256sum -c SHA256SUMS` in dist/)
#
# Usage: release/dist.sh [--no-image]   (--no-image: all but the image and its tags, for a quick look)
# DIST=<dir> writes elsewhere. helm and kubectl come from testbed/build.sh (~/.cache/vigil/bin,
# built when missing); the image from testbed/image.sh (built when its sources changed).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

DIST=${DIST:-dist}
CACHE=${VIGIL_CACHE:-$HOME/.cache/vigil}
HELM=$CACHE/bin/helm
KUBECTL=$CACHE/bin/kubectl
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
[[ -x $PYTHON ]] || PYTHON=python3
NAMESPACE=vigil-system
RELEASE=vigil
# helm template cannot ask an API server: this is the version it renders for (the chart needs >= 1.30).
KUBE_VERSION=$(sed -n 's/^KUBE_VERSION=\${VIGIL_KUBE_VERSION:-v\(.*\)}$/\1/p' testbed/build.sh)
# Where the krew manifest says the archive is; `kubectl krew install --manifest dist/krew.yaml
# --archive dist/kubectl-vigil-<v>.tar.gz` installs from the file instead.
DOWNLOAD=${VIGIL_RELEASE_URL:-https://github.com/vigil-dev/vigil/releases/download}

say() { printf '[dist] %s\n' "$*" >&2; }
die() { printf '[dist] ERROR: %s\n' "$*" >&2; exit 1; }
step() { say "$1 ($((SECONDS - began))s)"; }

IMAGE=1
for arg in "$@"; do
  case $arg in
    --no-image) IMAGE=0 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown argument $arg (--no-image)" ;;
  esac
done
began=$SECONDS

# --- the one version, and what must agree with it -------------------------------------------------
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' operator/vigil/__init__.py)
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "no x.y.z __version__ in operator/vigil/__init__.py"
chart_version=$(sed -n 's/^version: //p' charts/vigil/Chart.yaml)
app_version=$(sed -n 's/^appVersion: "\(.*\)"$/\1/p' charts/vigil/Chart.yaml)
[[ $chart_version == "$VERSION" && $app_version == "$VERSION" ]] \
  || die "charts/vigil/Chart.yaml says version $chart_version, appVersion $app_version; vigil.__version__ is $VERSION"
grep -q "^## \[$VERSION\]" CHANGELOG.md || die "CHANGELOG.md has no entry for $VERSION"
say "Vigil $VERSION into $DIST/"

if [[ ! -x $HELM || ! -x $KUBECTL ]]; then
  say "helm or kubectl missing from $CACHE/bin: testbed/build.sh all"
  testbed/build.sh all >&2
fi

rm -rf "$DIST"
mkdir -p "$DIST"

# --- the chart -----------------------------------------------------------------------------------
step "the chart: helm package"
"$HELM" package charts/vigil --destination "$DIST" --version "$VERSION" --app-version "$VERSION" >/dev/null
CHART=$DIST/vigil-$VERSION.tgz
[[ -f $CHART ]] || die "helm package wrote no $CHART"

# --- install.yaml and the kustomize base -----------------------------------------------------------
step "install.yaml: helm template of the packaged chart"
{
  printf '# Vigil %s: the chart vigil-%s.tgz rendered with its default values and tls.managedByOperator\n' "$VERSION" "$VERSION"
  printf '# for release %q in namespace %s (created here), CRDs included, no hooks. Apply it server-side (the VigilJob\n' "$RELEASE" "$NAMESPACE"
  printf '# CRD is larger than client-side apply can annotate):\n'
  printf '#   kubectl apply --server-side -f install.yaml\n'
  printf '# Uninstall: scale the operator to 0, run `vigil release-finalizers`, then delete what this file\n'
  printf '# made but the CRDs (docs/upgrading.md, "Uninstalling"). No TLS key is in this file: the operator\n'
  printf '# makes its CA and certificates at start into the Secret vigil-certs and sets the webhook'"'"'s caBundle\n'
  printf '# (to rotate: delete that Secret and restart the operator).\n'
  printf -- '---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n  labels:\n    app.kubernetes.io/name: vigil\n    app.kubernetes.io/instance: %s\n' "$NAMESPACE" "$RELEASE"
  # --no-hooks: the pre-delete hook (release-finalizers) would run at once under kubectl apply.
  # tls.managedByOperator: Helm's genCA here would put keys made at build time in a file every user
  # applies (helm template cannot look up); the operator makes each installation's own instead.
  "$HELM" template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --kube-version "$KUBE_VERSION" --no-hooks \
    --set tls.managedByOperator=true
} >"$DIST/install.yaml"

step "the kustomize base"
mkdir -p "$DIST/kustomize"
cp "$DIST/install.yaml" "$DIST/kustomize/install.yaml"
cat >"$DIST/kustomize/kustomization.yaml" <<EOF
# Vigil $VERSION as a kustomize base: install.yaml (make dist) as it is. Overlay it in your own
# kustomization (resources: [<this folder>]) and apply server-side: kubectl apply --server-side -k .
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - install.yaml
EOF
# The base must build, and to the same objects as install.yaml.
"$KUBECTL" kustomize "$DIST/kustomize" >"$DIST/.kustomized.yaml" || die "kubectl kustomize $DIST/kustomize failed"
count() { grep -c '^kind: ' "$1"; }
[[ $(count "$DIST/.kustomized.yaml") == $(count "$DIST/install.yaml") ]] \
  || die "kubectl kustomize made $(count "$DIST/.kustomized.yaml") objects of install.yaml's $(count "$DIST/install.yaml")"
rm "$DIST/.kustomized.yaml"

# --- the plugin ----------------------------------------------------------------------------------
step "kubectl-vigil: a zipapp (pip resolves its pure-Python dependencies)"
"$PYTHON" release/plugin.py "$DIST/kubectl-vigil" >/dev/null
python3 -I "$DIST/kubectl-vigil" --help >/dev/null || die "$DIST/kubectl-vigil --help failed under python3 -I"
tar -C "$DIST" --owner=0 --group=0 --mtime="@0" -czf "$DIST/kubectl-vigil-$VERSION.tar.gz" kubectl-vigil
archive_sha=$(sha256sum "$DIST/kubectl-vigil-$VERSION.tar.gz" | cut -d' ' -f1)
cat >"$DIST/krew.yaml" <<EOF
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: vigil
spec:
  version: v$VERSION
  homepage: https://github.com/vigil-dev/vigil
  shortDescription: Day two with Vigil's jobs and queues
  description: |
    kubectl vigil: why a Vigil job waits, the dead-letter queue and its redrives, the queues at a
    glance, pausing and resuming a queue, and an attempt's log. Vigil is a Kubernetes-native job
    scheduler (VigilJob, VigilQueue). The plugin is one Python zipapp: it needs python3 (3.11 or
    later) on the PATH, and nothing else.
  caveats: |
    kubectl vigil runs with python3 from the PATH, which must be 3.11 or later.
  platforms:
    - selector:
        matchExpressions:
          - key: os
            operator: In
            values: [linux, darwin]
      uri: $DOWNLOAD/v$VERSION/kubectl-vigil-$VERSION.tar.gz
      sha256: $archive_sha
      bin: kubectl-vigil
      files:
        - from: kubectl-vigil
          to: .
EOF

# --- the image -----------------------------------------------------------------------------------
if (( IMAGE )); then
  step "the image: testbed/image.sh, then podman save"
  built=$(testbed/image.sh)
  name=$(testbed/image.sh --print-tags | sed -n 2p)  # localhost/vigil:<version>, the chart's default
  [[ $name == "localhost/vigil:$VERSION" ]] || die "testbed/image.sh names $name, not localhost/vigil:$VERSION"
  podman --runtime runc save --quiet --format oci-archive --output "$DIST/vigil-image-$VERSION.oci.tar" "$name"
  # The archive's one name (a loader such as `ctr images import` or `kind load image-archive` gives
  # it to the image), then, commented, the image ID and the build's source tag.
  {
    echo "$name"
    echo "# id $(podman --runtime runc image inspect --format '{{.Id}}' "$name"), built as $built"
  } >"$DIST/image-tags.txt"
fi

# --- the checksums -------------------------------------------------------------------------------
step "SHA256SUMS"
(cd "$DIST" && find . -type f ! -name SHA256SUMS | sed 's#^\./##' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
step "done"
(cd "$DIST" && du -sh -- * | sed 's/^/[dist]   /' >&2)
