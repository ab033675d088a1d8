"""The error every configuration problem is reported with."""


class ConfigError(ValueError):
    """Bad configuration: the message names the offending field (or variable) and value."""
