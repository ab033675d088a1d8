"""`pilot-agent proxy`'s composition layer: the options resolved, the components assembled and run.

`options` turns the environment, flags, mesh config and ProxyConfig into frozen
per-component options (`resolve_agent_options`, sans-IO); `loader` is its I/O
edge (the process environment, the pod's files, host facts); `assembly` builds
the components from those options and wires them; `run` runs them on the one
`Lifecycle`. Only `cli/` imports this package; no component does.

Imports nothing: `cli/proxy_run.py` loads each module when it needs it.
"""
