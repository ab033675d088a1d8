"""Configuration, the bottom library: how programs declare their flags and variables (`settings`), the agent's
env registry, ProxyConfig layering, node id and metadata, Go parsers.

It imports no component and nothing above it (only `config.*`, `version`, the
standard library and third-party packages), so that every program and every
component may use it. The options resolver that turns all of it into
per-component options is `pilot-agent proxy`'s composition layer,
`istio_agent.agent.options`; with `cli/`, this package (`envvar.Environment`)
is the only one that reads the process environment.
"""

from istio_agent.config.errors import ConfigError

__all__ = ["ConfigError"]
