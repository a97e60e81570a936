"""Model loaders. Each config in conf/model names one of these with `_target_`."""

from prunebench.models.loaded import LoadedModel

__all__ = ["LoadedModel"]
