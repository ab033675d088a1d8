#!/bin/bash
# build-deb.sh PYTHON OUT_DIR: the istio-agent-sidecar Debian package from this repository's files.
#
# The package installs istio-start.sh, istio.service and sidecar.env at upstream's paths and a wheel of
# this project under /usr/local/lib/istio-agent/wheels, which postinst installs into a venv there.
set -euo pipefail
PY=${1:?usage: build-deb.sh PYTHON OUT_DIR}
OUT=${2:?usage: build-deb.sh PYTHON OUT_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VERSION=$("$PY" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' \
  "$REPO/pyproject.toml")
ARCH=all
NAME=istio-agent-sidecar
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STAGE=$(mktemp -d "$OUT/.stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
chmod 0755 "$STAGE"

install -D -m 0755 "$HERE/istio-start.sh" "$STAGE/usr/local/bin/istio-start.sh"
install -D -m 0644 "$HERE/istio.service" "$STAGE/lib/systemd/system/istio.service"
install -D -m 0644 "$HERE/sidecar.env" "$STAGE/var/lib/istio/envoy/sidecar.env"
mkdir -p "$STAGE/usr/local/lib/istio-agent/wheels"
had_build=$([[ -e $REPO/build ]] && echo yes || echo no)
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$STAGE/usr/local/lib/istio-agent/wheels" "$REPO" >&2
[[ $had_build == yes ]] || rm -rf "$REPO/build"  # setuptools' scratch directory, when it made it

mkdir -p "$STAGE/DEBIAN"
install -m 0755 "$HERE/postinst" "$STAGE/DEBIAN/postinst"
install -m 0755 "$HERE/prerm" "$STAGE/DEBIAN/prerm"
echo /var/lib/istio/envoy/sidecar.env > "$STAGE/DEBIAN/conffiles"
cat > "$STAGE/DEBIAN/control" <<CONTROL
Package: $NAME
Version: $VERSION
Architecture: $ARCH
Maintainer: istio-agent developers <noreply@localhost>
Depends: python3 (>= 3.11), python3-venv, iptables, iproute2, hostname, util-linux, passwd
Section: net
Priority: optional
Description: Istio agent (Python) for machines outside Kubernetes
 The istio-start.sh start script, the istio.service systemd unit and sidecar.env as upstream's
 istio-sidecar package lays them out, with pilot-agent installed from a wheel into
 /usr/local/lib/istio-agent. Envoy is not included: binaryPath or /usr/local/bin/envoy.
CONTROL
DEB="$OUT/${NAME}_${VERSION}_${ARCH}.deb"
dpkg-deb --root-owner-group --build "$STAGE" "$DEB" >&2
echo "$DEB"
