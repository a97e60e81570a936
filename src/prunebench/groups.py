"""The config groups a user chooses from and their options, wherever they are found: prunebench's
conf/ and every folder or package on `hydra.searchpath` (a lab's own pruners, tasks, experiments).
`prunebench --help` and `prunebench-plan --help` print this listing."""

from __future__ import annotations

import functools
import re

from hydra.core.object_type import ObjectType

from hydra.core.global_hydra import GlobalHydra

# groups that are building blocks of other options (the bases task options extend), not choices
INTERNAL_GROUPS = ("hydra", "task_base")
# an override of the retired task_library group: [+]task_library[/sub]@package=value
RETIRED = re.compile(r"^(?P<plus>\+*)task_library(?P<sub>/[\w/]+)?(?:@(?P<package>[\w.]+))?=(?P<value>.*)$")


def retired_spelling(override: str) -> str | None:
    """The one line saying how an override of the retired `task_library` group is written now that each
    benchmark is one conf/task/<name>.yaml (its definition under `tasks.<name>`, its OpenCompass
    version under `protocols`); None for any other override. Hydra's own words ("config group
    'task_library' does not exist") do not say what replaced it."""
    found = RETIRED.match(override)
    if found is None:
        return None
    plus, package, value = found["plus"], found["package"] or "", found["value"]
    gone = f"{override}: conf/task_library is gone, each benchmark is one conf/task/<name>.yaml; "
    if found["sub"] or package.startswith("task."):
        return gone + f"add a benchmark to a suite with task=[SUITE,{value}] task.name=SUITE (it brings its protocols' versions)"
    if package:
        return gone + f"write {plus}task@{package}={value} (its definition is then {package}.tasks.{value})"
    return gone + f"choose it with task={value}"


def quoted(value: str) -> str:
    """`value` as a quoted Hydra override value: backslashes are escapes only before a quote (Hydra's
    grammar), so those runs are doubled and quotes escaped."""
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value) + "'"


@functools.cache
def listing(searchpath: tuple[str, ...] = ()) -> str:
    """One line per group, `  group: option, option, ...`. Hydra's loader takes an extra search path
    only as an override (its repository is built from the primary config's), hence the quoting.
    Hydra resolves the help text in every run, not only for --help: once per process and search path."""
    loader = GlobalHydra.instance().config_loader()
    overrides = [f"hydra.searchpath=[{','.join(quoted(p) for p in searchpath)}]"] if searchpath else []
    groups = [*sorted(g for g in loader.get_group_options("", ObjectType.GROUP, overrides=overrides)
                      if g not in INTERNAL_GROUPS), "hydra/launcher"]
    return "\n".join(f"  {g}: {', '.join(sorted(loader.get_group_options(g, overrides=overrides)))}" for g in groups)
