"""Documents shipped inside this package: a task's YAML names the file, not where pip put it."""

from __future__ import annotations

from importlib import resources

from prunebench.tasks.sources import JsonSource


class PackagedJson(JsonSource):
    """`mylab/data/<name>`, a .jsonl or .json file installed with the package."""

    def __init__(self, name: str, field: str | None = None):
        super().__init__(str(resources.files("mylab") / "data" / name), field)
