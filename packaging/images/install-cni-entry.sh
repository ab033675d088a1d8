#!/bin/sh
# install-cni's entrypoint in the install-cni image (the DaemonSet runs `install-cni`, found on PATH here).
#
# The istio-cni launcher install-cni writes names this image's interpreter, which the node's container
# runtime must find on the node: so first the self-contained runtime (ISTIO_CNI_RUNTIME, a path under the
# node's CNI bin dir) is copied into the bin dir mounted from the node, swapped in whole by rename and only
# when its build differs, then install-cni replaces this shell (its signals and exit status are its own).
set -eu
runtime=${ISTIO_CNI_RUNTIME:?ISTIO_CNI_RUNTIME names the runtime directory}
mounted=${ISTIO_CNI_RUNTIME_MOUNT:-/host/opt/cni/bin}
name=$(basename "$runtime")
target="$mounted/$name"
if [ ! -d "$mounted" ]; then
  echo "install-cni-entry: $mounted (the node's CNI bin dir) is not mounted" >&2
  exit 1
fi
if ! cmp -s "$runtime/.build-id" "$target/.build-id" 2>/dev/null; then
  staging="$mounted/.$name.new.$$"
  rm -rf "$staging" "$mounted/.$name.old"
  cp -a "$runtime" "$staging"
  if [ -e "$target" ]; then mv "$target" "$mounted/.$name.old"; fi
  mv "$staging" "$target"
  rm -rf "$mounted/.$name.old"
  echo "install-cni-entry: copied the plugin's Python runtime to $target ($(cat "$runtime/.build-id"))" >&2
fi
exec "$runtime/venv/bin/install-cni" "$@"
