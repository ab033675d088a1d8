"""Configuration: the environment registry, ProxyConfig layering, node id and metadata."""

from istio_agent.config.errors import ConfigError

__all__ = ["ConfigError"]
