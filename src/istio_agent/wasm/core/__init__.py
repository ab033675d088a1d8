"""The Wasm cache's sans-IO core: ECDS conversion, cache bookkeeping, the SSRF rules, image layouts."""
