#!/bin/sh
# portable-python.sh RUNTIME WHEELS: a self-contained Python runtime for install-cni and the istio-cni plugin.
#
# Run in the install-cni image's build stage (Debian's python3, python3-venv and patchelf installed). RUNTIME
# gets Debian's python3.11 binary, its standard library (less tests, IDLE, Tk, ensurepip and other
# tooling), every shared library they load (the ELF loader and glibc included) in RUNTIME/lib, and a venv
# with this project (install-cni's dependencies only: Envoy, gRPC and the agent's are left out). The
# binary's PT_INTERP and DT_RPATH are rewritten to RUNTIME/lib, so on a node it loads nothing of the
# node's but the kernel: the plugin runs where no Python, or another glibc, is installed.
set -eu
R=${1:?usage: portable-python.sh RUNTIME WHEELS}
W=${2:?usage: portable-python.sh RUNTIME WHEELS}
PY=python3.11
STDLIB=/usr/lib/$PY

mkdir -p "$R/bin" "$R/lib"
install -m 0755 "/usr/bin/$PY" "$R/bin/$PY"
ln -s "$PY" "$R/bin/python3"
cp -a "$STDLIB" "$R/lib/$PY"
# Not needed to run install-cni or the plugin.
for d in test idlelib tkinter turtledemo ensurepip lib2to3 pydoc_data distutils unittest/test \
         sqlite3/test ctypes/test "config-3.11-x86_64-linux-gnu" site-packages dist-packages; do
  rm -rf "$R/lib/$PY/$d"
done
rm -f "$R/lib/$PY"/lib-dynload/_tkinter*.so "$R/lib/$PY"/lib-dynload/_test*.so "$R/lib/$PY"/lib-dynload/xxlimited*.so
find "$R/lib/$PY" -depth -type d -name __pycache__ -exec rm -rf {} +

# The venv: this project without its dependencies, then what install-cni and the plugin import.
"$R/bin/$PY" -m venv --without-pip "$R/venv"
"$R/venv/bin/python" "$W/pip.whl/pip" install -q --no-index --find-links "$W" --no-cache-dir \
    --disable-pip-version-check --no-deps istio-agent
"$R/venv/bin/python" "$W/pip.whl/pip" install -q --no-index --find-links "$W" --no-cache-dir \
    --disable-pip-version-check click h11 lightkube PyYAML
site="$R/venv/lib/$PY/site-packages"
find "$site" -depth -type d \( -name tests -o -name test \) -path "$site/*/*" -exec rm -rf {} +
rm -rf "$site"/*.dist-info/RECORD

# Every shared library the interpreter and the extension modules load, resolved in this image.
libs=$(mktemp)
find "$R" -name '*.so*' -type f > "$libs.objs"
echo "$R/bin/$PY" >> "$libs.objs"
while read -r obj; do
  ldd "$obj" 2>/dev/null | awk '/=> \//{print $3} /^\t\/lib/{print $1}'
done < "$libs.objs" | sort -u > "$libs"
while read -r lib; do
  case "$lib" in "$R"/*) continue ;; esac
  cp -L "$lib" "$R/lib/$(basename "$lib")"
done < "$libs"
rm -f "$libs" "$libs.objs"
loader=$(basename "$(patchelf --print-interpreter "$R/bin/$PY")")
[ -f "$R/lib/$loader" ] || cp -L "/lib64/$loader" "$R/lib/$loader"
patchelf --set-interpreter "$R/lib/$loader" --force-rpath --set-rpath "$R/lib" "$R/bin/$PY"

# What install-cni-entry.sh compares before copying the runtime to the node.
cat "$W/build-id" > "$R/.build-id"

# Byte-compile once here: the node's copy and the container's root are read-only to it at run time.
"$R/bin/$PY" -I -m compileall -q -j 0 "$R/lib/$PY" "$site" >/dev/null
echo "$R: $(du -sh "$R" | cut -f1); loader $loader, $(ls "$R/lib" | grep -c '\.so') libraries"

# Proof inside the build: the interpreter with an empty environment and no system library path.
env -i "$R/venv/bin/python" -I -c 'import ssl, json, yaml, lightkube, istio_agent.cni.install.main, istio_agent.cni.install.assembly, istio_agent.cni.repair.controller, istio_agent.cni.plugin.main'
env -i CNI_COMMAND=VERSION "$R/venv/bin/istio-cni" < /dev/null
echo
