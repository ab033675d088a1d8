"""The Wasm modules a mesh file names (`wasmModules:`): built, and served to the pods from the node (I/O).

A WasmPlugin's module must come from somewhere the pods reach without
leaving the machine. So `up` serves the modules the mesh file names over
HTTP from the node's namespace, on its gateway address (the address the
pods already reach istiod-local on): `http://10.244.0.1:15080/<stem>.wasm`
with the default pod CIDR (`base_url`). A WasmPlugin names that URL, as it
would name a registry or web server in a cluster, and both control planes
hand it to the agent as the module's remote source; the agent fetches it,
checks it, caches it and gives Envoy the local file.

Each entry is a file relative to the mesh file (an absolute path as is): a
`.wat` file is assembled with wat2wasm (Debian's wabt) into `<dir>/<stem>.wasm`,
a `.wasm` file is copied there; both written atomically, and only when the
bytes changed. `files_signature` joins the mesh file's poll: an edited module
is rebuilt and served at once (an agent fetches it again when the plugin's
`sha256` or resource version changes, or with `imagePullPolicy: Always`).

The server is Python's own `http.server` over that directory only, run by
root in the node's namespace as istiod-local is, bound to the gateway
address: nothing outside the node's network reaches it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from istiod_local.controlplane.state import write_file_atomic
from istiod_local.node.plan import in_netns
from istiod_local.node.processes import NetnsProcess, NodeError, spawn, tail
from istiod_local.node.readiness import NodeProber, Target, wait_all

MODULES_PORT = 15080
MAX_MODULE_BYTES = 16 * 1024 * 1024
BUILD_TIMEOUT = 60.0
WAT2WASM = "wat2wasm"


class WasmModuleError(ValueError):
    """A module file is missing, unreadable, too large, or does not assemble (the message names the file)."""


def base_url(gateway: str) -> str:
    """Where the node serves the modules: `http://<gateway>:15080/`."""
    return f"http://{gateway}:{MODULES_PORT}/"


def served_name(entry: str) -> str:
    return f"{Path(entry).stem}.wasm"


def module_files(mesh_file: Path, entries: Sequence[str]) -> list[Path]:
    """The files the entries name (relative to the mesh file's directory); WasmModuleError for one missing."""
    out = []
    for entry in entries:
        path = Path(entry) if Path(entry).is_absolute() else mesh_file.parent / entry
        if not path.is_file():
            raise WasmModuleError(f"{mesh_file}: wasmModules: {entry!r}: no such file ({path})")
        out.append(path)
    return out


def files_signature(mesh_file: Path, entries: Sequence[str]) -> tuple[tuple[str, int, int, int], ...]:
    """What changes when a module file is edited or replaced (a missing one: left out)."""
    out = []
    for entry in entries:
        path = Path(entry) if Path(entry).is_absolute() else mesh_file.parent / entry
        try:
            st = os.stat(path)
        except OSError:
            continue
        out.append((str(path), st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


def _assemble(source: Path, wat2wasm: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="ia-wasm-") as scratch:
        target = Path(scratch) / "module.wasm"
        try:
            done = subprocess.run([wat2wasm, str(source), "-o", str(target)], capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WasmModuleError(f"{source}: wat2wasm: {exc}") from None
        if done.returncode != 0:
            raise WasmModuleError(f"{source}: wat2wasm refused it: {done.stderr.strip()[:800]}")
        return target.read_bytes()


def build(mesh_file: Path, entries: Sequence[str], out_dir: Path) -> dict[str, str]:
    """Every module into `out_dir` as `<stem>.wasm`: served name -> its sha256. A module whose bytes did not
    change is not rewritten; a file no entry names any more is removed. WasmModuleError names the file."""
    files = module_files(mesh_file, entries)
    wat2wasm = shutil.which(WAT2WASM)
    if any(f.suffix == ".wat" for f in files) and wat2wasm is None:
        raise WasmModuleError(f"{mesh_file}: wasmModules: building a .wat file needs wat2wasm (the Debian "
                              "package wabt; `make setup` installs it)")
    built: dict[str, bytes] = {}
    for path in files:
        try:
            if path.stat().st_size > MAX_MODULE_BYTES:
                raise WasmModuleError(f"{path}: larger than {MAX_MODULE_BYTES} bytes")
            data = _assemble(path, str(wat2wasm)) if path.suffix == ".wat" else path.read_bytes()
        except OSError as exc:
            raise WasmModuleError(f"{path}: {exc}") from None
        if not data.startswith(b"\0asm"):
            raise WasmModuleError(f"{path}: not a Wasm module (no \\0asm header)")
        built[served_name(path.name)] = data
    out_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    for name, data in built.items():
        target = out_dir / name
        if not target.is_file() or target.read_bytes() != data:
            write_file_atomic(target, data, 0o644)
    for stale in out_dir.glob("*.wasm"):
        if stale.name not in built:
            stale.unlink(missing_ok=True)
    return {name: hashlib.sha256(data).hexdigest() for name, data in built.items()}


class ModuleServer:
    """`python -m http.server` over the modules' directory, in the node's namespace on its gateway address."""

    def __init__(self, directory: Path, log: Path, python: str = sys.executable) -> None:
        self.directory = directory
        self.log = log
        self.python = python
        self.process: NetnsProcess | None = None

    def running(self) -> bool:
        return self.process is not None and self.process.running()

    def start(self, netns: str, netns_path: str, gateway: str, timeout: float) -> None:
        """Start it and wait until it listens; NodeError with its log if it does not."""
        argv = [self.python, "-m", "http.server", str(MODULES_PORT), "--bind", gateway,
                "--directory", str(self.directory)]
        self.process = process = spawn("wasm-modules", in_netns(netns, argv), self.log)
        listening = Target("wasm-modules", "the Wasm module server to listen", gateway, MODULES_PORT)
        with NodeProber(netns_path, threads=1) as prober:
            error = wait_all(prober, [listening], timeout,
                             lambda _: None if process.running() else process.describe_exit())
        if error is not None:
            raise NodeError(f"{error}\n{tail(self.log)}")

    def stop(self, grace: float = 5.0) -> None:
        if self.process is not None:
            self.process.stop(grace)
            self.process = None
