"""Wasm modules of WasmPlugins: fetched over HTTP(S) or from OCI registries, verified, cached on disk, and put
into the extension configs (ECDS) the XDS proxy hands Envoy as local files. `core/` decides, the rest does I/O."""
