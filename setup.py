"""Only the package list lives here (everything else is in pyproject.toml). The configs ship inside
the package as `prunebench.conf` while conf/ stays at the top level, so an installed wheel composes
the same configs as a checkout; a package mapped from outside src/ is one `packages.find` cannot
discover, so the list is computed."""

from pathlib import Path

from setuptools import find_namespace_packages, find_packages, setup

CONF = ["prunebench.conf", *("prunebench.conf." + ".".join(p.relative_to("conf").parts)
                             for p in sorted(Path("conf").rglob("*")) if p.is_dir())]

# hydra_plugins is a namespace package shared with the launcher plugins (Hydra loads launchers only from it)
setup(packages=find_packages("src") + find_namespace_packages("src", include=["hydra_plugins.*"]) + CONF, package_dir={"": "src", "prunebench.conf": "conf"},
      # the configs, and BBH's subtask table read by tasks/bbh.py
      package_data={**{name: ["*.yaml", "*.md"] for name in CONF}, "prunebench.tasks": ["*.yaml"]})
