;; add-header: a Proxy-Wasm module (ABI 0.2.1) that adds `x-wasm-plugin: add-header` to every HTTP response
;; passing the filter. Written by hand in the WebAssembly text format; `istiod-local up` assembles it with
;; wat2wasm (Debian's wabt) and serves it to the pods (docs/MESH.md "Wasm plugins"). The WasmPlugin that
;; selects it is add-header.yaml beside this file.
(module
  ;; The one host call it makes: add a header to a header map (map 2: the response headers).
  (import "env" "proxy_add_header_map_value"
    (func $add_header (param $map i32) (param $key i32) (param $key_len i32) (param $value i32)
                      (param $value_len i32) (result i32)))

  (memory (export "memory") 1)
  (data (i32.const 64) "x-wasm-plugin")   ;; 13 bytes
  (data (i32.const 96) "add-header")      ;; 10 bytes

  ;; Memory the host asks for (a bump allocator from 1 KiB up; the host asks for little and rarely, if at all).
  (global $next (mut i32) (i32.const 1024))
  (func (export "proxy_on_memory_allocate") (param $size i32) (result i32)
    (local $at i32)
    (local.set $at (global.get $next))
    (global.set $next (i32.add (local.get $at) (i32.and (i32.add (local.get $size) (i32.const 7))
                                                       (i32.const -8))))
    (block $fits
      (br_if $fits (i32.le_u (global.get $next) (i32.mul (memory.size) (i32.const 65536))))
      (drop (memory.grow (i32.add (i32.shr_u (local.get $size) (i32.const 16)) (i32.const 1)))))
    (local.get $at))

  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_context_create") (param $context i32) (param $parent i32))
  (func (export "proxy_on_vm_start") (param $root i32) (param $config_size i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param $root i32) (param $config_size i32) (result i32) (i32.const 1))

  ;; Each response: the header, then Continue (0).
  (func (export "proxy_on_response_headers") (param $context i32) (param $headers i32) (param $end i32)
                                             (result i32)
    (drop (call $add_header (i32.const 2) (i32.const 64) (i32.const 13) (i32.const 96) (i32.const 10)))
    (i32.const 0))

  (func (export "proxy_on_done") (param $context i32) (result i32) (i32.const 1))
  (func (export "proxy_on_delete") (param $context i32))
)
