"""Configuration: the env registry, ProxyConfig layering, node id and metadata, and the one options resolver.

`options.resolve_agent_options` turns environment, flags, mesh config and
ProxyConfig into frozen per-component options; with `cli/`, this package is
the only one that reads the process environment.
"""

from istio_agent.config.errors import ConfigError

__all__ = ["ConfigError"]
