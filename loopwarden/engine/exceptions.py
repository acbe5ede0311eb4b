"""Errors of the engine, its stages and their commands: each names the value that is wrong."""


class ConfigError(ValueError):
    """A configuration value is wrong; the message names it and the bad value."""


class TopicLayoutError(RuntimeError):
    """Existing topics do not fit (e.g. input topics not co-partitioned)."""


class UntrustedChannelError(RuntimeError):
    """The trusted receipts topic is set but the cluster cannot keep others from writing it (no authorizer)."""
