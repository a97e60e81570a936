"""The one error a bad config raises, wherever it is found (validate.py, tasks/build.py)."""


class ConfigError(ValueError):
    """A bad config value; the message names the value and what would be valid."""
