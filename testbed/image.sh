#!/usr/bin/env bash
# Builds Vigil's image from the repository's Dockerfile with podman, on a machine with no Docker
# engine and, possibly, no container registry it can reach; prints the image's name on stdout.
#
# Usage: testbed/image.sh [--print-tags]
#   (no argument; `make image`, `make test`) build the image unless one built from the same
#                inputs exists, and print its name, localhost/vigil:src-<hash>
#   --print-tags print the two names it gives the image (src-<hash>, then <version>) and stop
#
# Tags: localhost/vigil:src-<hash>, a hash of what goes into the image (the Dockerfile,
# .dockerignore, pyproject.toml, operator/ and this script; README.md is copied in only as the
# package's description, and does not count), so an unchanged source builds nothing; and
# localhost/vigil:<version> (vigil.__version__, the chart's appVersion: the chart's default
# image, and the name release/dist.sh saves in the released archive), moved to each new build.
# The five newest src- tags are kept.
#
# The base: $VIGIL_IMAGE_BASE when set; else the official python image the Dockerfile names, when
# podman has it or can pull it; else localhost/vigil-base:bookworm-python3, made once from Debian's
# packages with mmdebstrap (Debian 12's python3 is 3.11, as the official image's) and kept in
# podman's storage. The build itself has no network: the wheels of Vigil's dependencies are
# fetched here first, for CPython 3.11 on manylinux, and mounted into the build at /wheels.
# podman, runc and (for the Debian base) mmdebstrap are installed with apt-get when missing.
# podman runs with runc (crun refuses a cgroup v1 hybrid machine) and with explicit ulimits
# (podman's defaults exceed what this machine allows).
set -euo pipefail
cd "$(dirname "$0")/.."

REPOSITORY=localhost/vigil
OFFICIAL_BASE=docker.io/library/$(sed -n 's/^ARG PYTHON_IMAGE=//p' Dockerfile)
DEBIAN_BASE=localhost/vigil-base:bookworm-python3
DEBIAN_PACKAGES=python3,python3-venv,ca-certificates
KEEP=5  # src- tags kept: other checkouts of the machine may be testing theirs
PYTHON=${PYTHON:-python3}

say() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] ERROR: %s\n' "$*" >&2; exit 1; }

PRINT_TAGS=0
for arg in "$@"; do
  case $arg in
    --print-tags) PRINT_TAGS=1 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) printf 'testbed/image.sh: unknown argument %q (--print-tags)\n' "$arg" >&2; exit 2 ;;
  esac
done

# The release's one version, vigil.__version__ (pyproject and the chart read the same; tests/unit/deploy/test_version.py).
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' operator/vigil/__init__.py | head -n 1)
[[ -n $VERSION ]] || die "no __version__ = \"...\" line in operator/vigil/__init__.py"

# What the image is made of, as .dockerignore sends it (no caches, no egg-info), by path and content.
source_hash() {
  {
    sha256sum Dockerfile .dockerignore pyproject.toml testbed/image.sh
    find operator -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print0 \
      | LC_ALL=C sort -z | xargs -0 sha256sum
    printf 'base override: %s\n' "${VIGIL_IMAGE_BASE:-}"
  } | sha256sum | cut -c1-12
}
HASH=$(source_hash)
IMAGE=$REPOSITORY:src-$HASH
if (( PRINT_TAGS )); then printf '%s\n%s\n' "$IMAGE" "$REPOSITORY:$VERSION"; exit 0; fi

# --- what it needs -----------------------------------------------------------------------------
as_root() { if (( EUID == 0 )); then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }
install_packages() {  # install_packages PACKAGE...: with apt-get, once; the lists refreshed only if needed
  say "installing $* with apt-get (once; about a minute)"
  command -v apt-get >/dev/null || die "$* missing and no apt-get to install them: install them, then run this again"
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -y -qq -o Dpkg::Use-Pty=0)
  if ! as_root "${apt[@]}" install "$@" >/dev/null 2>&1; then
    as_root "${apt[@]}" update >/dev/null || die "apt-get update failed (as root, or with sudo?)"
    as_root "${apt[@]}" install "$@" >/dev/null || die "apt-get install $* failed"
  fi
}
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
(( ${#missing[@]} == 0 )) || install_packages "${missing[@]}"

PODMAN=(podman --runtime runc)
# The open files this shell may have; processes 4096 (this machine refuses the shell's own 96362,
# and anything over 32768, with "error setting rlimit type 6: operation not permitted").
LIMITS=(--ulimit "nofile=$(ulimit -Sn):$(ulimit -Hn)" --ulimit nproc=4096:4096)
has_image() { "${PODMAN[@]}" image exists "$1"; }

if has_image "$IMAGE"; then
  "${PODMAN[@]}" tag "$IMAGE" "$REPOSITORY:$VERSION"
  say "$IMAGE is up to date (also $REPOSITORY:$VERSION, the chart's default image)"
  echo "$IMAGE"
  exit 0
fi
began=$SECONDS

# --- the base ----------------------------------------------------------------------------------
make_debian_base() {
  command -v mmdebstrap >/dev/null || install_packages mmdebstrap
  say "making $DEBIAN_BASE from Debian 12's packages ($DEBIAN_PACKAGES) with mmdebstrap (once; about 30 s)"
  local dir; dir=$(mktemp -d)
  # The mirror named, so that mmdebstrap does not read a list of mirrors from a stdin that is a pipe.
  if ! mmdebstrap --quiet --variant=minbase --include="$DEBIAN_PACKAGES" bookworm "$dir/base.tar" \
         http://deb.debian.org/debian </dev/null >"$dir/log" 2>&1; then
    tail -n 20 "$dir/log" >&2; rm -rf "$dir"; die "mmdebstrap failed"
  fi
  # An imported root filesystem has no configuration: give it the PATH an official image has.
  "${PODMAN[@]}" import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/sh"]' "$dir/base.tar" "$DEBIAN_BASE" >/dev/null
  rm -rf "$dir"
}

if [[ -n ${VIGIL_IMAGE_BASE:-} ]]; then
  BASE=$VIGIL_IMAGE_BASE
elif has_image "$OFFICIAL_BASE"; then
  BASE=$OFFICIAL_BASE
elif say "pulling $OFFICIAL_BASE" && timeout 120 "${PODMAN[@]}" pull --quiet "$OFFICIAL_BASE" >/dev/null 2>&1; then
  BASE=$OFFICIAL_BASE
else
  say "no registry answered for $OFFICIAL_BASE: the base is made from Debian's packages"
  has_image "$DEBIAN_BASE" || make_debian_base
  BASE=$DEBIAN_BASE
fi

# --- the wheels, fetched here (the build has no network) -----------------------------------------
CTX=$(mktemp -d)
trap 'rm -rf "$CTX"' EXIT
requirements=$("$PYTHON" -c 'import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))
print("\n".join(p["build-system"]["requires"] + p["project"]["dependencies"]))')
mapfile -t requirements <<<"$requirements"
say "fetching the wheels of ${#requirements[@]} requirements (and theirs) for CPython 3.11"
# Both bases are Debian 12 (glibc 2.36) with CPython 3.11: every manylinux up to 2.36 fits (named
# one by one: pip before 23.3 does not count the older ones in).
platforms=()
for minor in $(seq 36 -1 17) 12 5; do platforms+=(--platform "manylinux_2_${minor}_$(uname -m)"); done
platforms+=(--platform "manylinux2014_$(uname -m)" --platform "manylinux2010_$(uname -m)" --platform "manylinux1_$(uname -m)")
if ! "$PYTHON" -m pip download --quiet --disable-pip-version-check --dest "$CTX/wheels" --only-binary=:all: \
       --python-version 3.11 --implementation cp "${platforms[@]}" \
       "${requirements[@]}" >"$CTX/pip.log" 2>&1; then
  tail -n 20 "$CTX/pip.log" >&2; die "pip download failed (is the package index reachable?)"
fi

# --- the build ---------------------------------------------------------------------------------
say "building $IMAGE from Dockerfile on $BASE"
if ! "${PODMAN[@]}" build --quiet --pull=never --network none "${LIMITS[@]}" \
       --volume "$CTX/wheels:/wheels:ro" --build-arg "PYTHON_IMAGE=$BASE" --build-arg WHEELS=/wheels \
       --label "vigil.dev/source-hash=$HASH" --label "vigil.dev/base=$BASE" \
       --tag "$IMAGE" --tag "$REPOSITORY:$VERSION" --file Dockerfile . >"$CTX/build.log" 2>&1; then
  tail -n 30 "$CTX/build.log" >&2; die "podman build failed"
fi

# Older builds: their src- tags removed, the newest kept (an image a container still uses stays).
mapfile -t old < <("${PODMAN[@]}" images --format '{{.CreatedAt}} {{.Repository}}:{{.Tag}}' "$REPOSITORY" \
  | grep ':src-' | LC_ALL=C sort -r | awk '{print $NF}' | tail -n +$((KEEP + 1)))
for name in "${old[@]}"; do "${PODMAN[@]}" rmi "$name" >/dev/null 2>&1 || true; done
# And the untagged images our builds leave (the first stage, the layers of earlier builds): a
# rebuild then starts from the base again, a few seconds more, rather than the disk filling up.
"${PODMAN[@]}" image prune --force --filter label=vigil.dev/source-hash >/dev/null 2>&1 || true

say "built $IMAGE (also $REPOSITORY:$VERSION, the chart's default image) in $((SECONDS - began))s"
echo "$IMAGE"
