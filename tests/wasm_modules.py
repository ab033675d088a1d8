"""Small Proxy-Wasm modules for the tests, assembled from hand-written WAT by Debian's `wabt` (wat2wasm).

Two modules on the Proxy-Wasm ABI 0.2.1, each a page of WAT:
- `header_module(version)`: adds `x-wasm-config: <the plugin's configuration>` (`none` without one) and
  `x-wasm-version: <version>` to every response, so a test sees both a config change and a module change;
- `deny_module(path)`: answers 403 `denied by wasm` to a request for exactly `path`, and lets others through.
They are built once per session into a cache directory and returned as bytes.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
import tempfile
from pathlib import Path

from needs import need_tool

_ALLOCATOR = """
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 4096))
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $size i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.and (i32.add (i32.add (global.get $heap) (local.get $size)) (i32.const 15))
                               (i32.const -16)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow (i32.add (i32.div_u (local.get $size) (i32.const 65536)) (i32.const 1))))))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_done") (param i32) (result i32) (i32.const 1))
  (func (export "proxy_on_delete") (param i32))
"""


def _wat_string(text: str) -> str:
    return "".join(f"\\{b:02x}" for b in text.encode())


def header_wat(version: str) -> str:
    return f"""(module
  (import "env" "proxy_get_buffer_bytes" (func $get_buffer (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_add_header_map_value" (func $add_header (param i32 i32 i32 i32 i32) (result i32)))
  {_ALLOCATOR}
  (data (i32.const 16) "x-wasm-config")
  (data (i32.const 48) "x-wasm-version")
  (data (i32.const 96) "none")
  (data (i32.const 512) "{_wat_string(version)}")
  (func (export "proxy_on_configure") (param $ctx i32) (param $size i32) (result i32)
    (i32.store (i32.const 256) (i32.const 96))
    (i32.store (i32.const 260) (i32.const 4))
    (if (i32.gt_s (local.get $size) (i32.const 0))
      (then (drop (call $get_buffer (i32.const 7) (i32.const 0) (local.get $size) (i32.const 256) (i32.const 260)))))
    (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
    (drop (call $add_header (i32.const 2) (i32.const 16) (i32.const 13)
                            (i32.load (i32.const 256)) (i32.load (i32.const 260))))
    (drop (call $add_header (i32.const 2) (i32.const 48) (i32.const 14) (i32.const 512) (i32.const {len(version)})))
    (i32.const 0))
)
"""


def deny_wat(path: str) -> str:
    return f"""(module
  (import "env" "proxy_get_header_map_value" (func $get_header (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_send_local_response"
    (func $local_response (param i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  {_ALLOCATOR}
  (data (i32.const 16) ":path")
  (data (i32.const 64) "denied by wasm")
  (data (i32.const 512) "{_wat_string(path)}")
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (local $ptr i32) (local $len i32) (local $i i32)
    (i32.store (i32.const 256) (i32.const 0))
    (i32.store (i32.const 260) (i32.const 0))
    (drop (call $get_header (i32.const 0) (i32.const 16) (i32.const 5) (i32.const 256) (i32.const 260)))
    (local.set $ptr (i32.load (i32.const 256)))
    (local.set $len (i32.load (i32.const 260)))
    (if (i32.ne (local.get $len) (i32.const {len(path.encode())})) (then (return (i32.const 0))))
    (block $differ
      (loop $next
        (br_if $differ (i32.ne (i32.load8_u (i32.add (local.get $ptr) (local.get $i)))
                               (i32.load8_u (i32.add (i32.const 512) (local.get $i)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $next (i32.lt_u (local.get $i) (local.get $len))))
      (drop (call $local_response (i32.const 403) (i32.const 0) (i32.const 0) (i32.const 64) (i32.const 14)
                                  (i32.const 0) (i32.const 0) (i32.const -1)))
      (return (i32.const 1)))
    (i32.const 0))
)
"""


@functools.cache
def assemble(wat: str) -> bytes:
    """The module `wat` describes, assembled by wat2wasm (the test skips when wabt is missing)."""
    tool = need_tool("wat2wasm")
    cache = Path(tempfile.gettempdir()) / "istio-agent-test-wasm"
    cache.mkdir(exist_ok=True)
    stem = cache / hashlib.sha256(wat.encode()).hexdigest()[:16]
    source, target = stem.with_suffix(".wat"), stem.with_suffix(".wasm")
    if not target.exists():
        source.write_text(wat)
        done = subprocess.run([tool, str(source), "-o", str(target)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    return target.read_bytes()


def header_module(version: str = "1") -> bytes:
    return assemble(header_wat(version))


def deny_module(path: str = "/forbidden") -> bytes:
    return assemble(deny_wat(path))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
