"""Hydra's compose of many jobs that differ mostly in values, through Hydra's public API only.

A grid's jobs share their config-group choices and differ in values (sparsity, seed, limit), and
building the defaults tree is the costly part of a compose. As lightning-hydra-template's tests do,
the tree is composed once per set of choices with `hydra.compose`, and each job gets a copy with its
values set by `OmegaConf.update`, the call Hydra itself makes for a `key=value` override. A value's
text is read by Hydra's own grammar, once per distinct line: set under a scratch root key (`READ`) in
the compose of the job's tree where that tree is new, else in a compose onto no primary config
(`compose(None, ...)`). A `+name=value` line (a group the defaults
list lacks, as a preset's `+sparsity_type`, or a new root key) goes into the tree's compose with the
choices. Anything else (`++`, `~`, `+a.b=...`, a `key@package`, a dict value, a key that is not in
the config) is composed in full, so Hydra itself answers or refuses it. `tests/test_presets.py`
holds the result equal to Hydra's full compose."""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterable

from hydra import compose
from hydra.core.config_loader import ConfigLoader
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict


# each `key=value` line's value as Hydra's grammar read it: the grammar alone decides it, so every
# composer of the process shares what any of them read
VALUES: dict[str, object] = {}
# the root key a compose reads value lines under (each its own key, `v0`, `v1`...), removed after
READ = "_composer_values"
# the latest 256 trees made in this process, by where Hydra reads configs (its sources), the primary
# config, Hydra's own overrides and the choices: a plan's composer and its sweeper's share them
TREES: OrderedDict[tuple, tuple[DictConfig, frozenset[str]]] = OrderedDict()


class Composer:
    """`composer(overrides)` is `hydra.compose(config_name, hydra_overrides + overrides)`; call it
    where Hydra is initialized (`initialize_config_dir`, or inside a running Hydra app).
    `hydra_overrides`: what the command line set of Hydra itself (`hydra.searchpath=[...]`, a
    launcher), which can change where every config comes from."""

    def __init__(self, config_name: str = "config", hydra_overrides: Iterable[str] = ()) -> None:
        self.config_name = config_name
        self.hydra_overrides = tuple(hydra_overrides)

    def __call__(self, overrides: Iterable[str]) -> DictConfig:
        overrides = list(overrides)
        if any(line.startswith(("+", "~")) and not appends(line) or "@" in line.split("=", 1)[0] for line in overrides):
            return self.full(overrides)
        choices, groups = (), self.groups(())
        while True:  # an option may bring groups of its own (a lab's pruner with a schedule group)
            chosen = tuple(o for o in overrides if o.split("=", 1)[0] in groups or o.startswith("hydra.") or appends(o))
            if chosen == choices and choices:
                break
            choices = chosen
            tree, found = self.tree(choices, [o for o in overrides if o not in choices])
            if found == groups:
                break
            groups = found
        values = self.parsed([o for o in overrides if o not in choices])
        if values is None or not all(defines(tree, key) for key, _ in values):
            return self.full(overrides)
        cfg = copy.deepcopy(tree)
        for key, value in values:
            OmegaConf.update(cfg, key, value, merge=True)
        return cfg

    def full(self, overrides: list[str]) -> DictConfig:
        return compose(self.config_name, overrides=[*self.hydra_overrides, *overrides])

    def groups(self, choices: tuple[str, ...]) -> frozenset[str]:
        return self.tree(choices)[1]

    def tree(self, choices: tuple[str, ...], lines: Iterable[str] = ()) -> tuple[DictConfig, frozenset[str]]:
        """The job config of these choices, and the config groups of its defaults tree (Hydra's
        `runtime.choices`): a `group=option` override chooses, any other key sets a value. A group
        chosen as a list of options (`task=[commonsense,openbookqa]`, merged in order) has no single
        choice there, and stays a group. A tree not made yet reads the value `lines` not read yet in
        the same compose (where one of them is not a value Hydra reads, the tree is composed alone)."""
        sources = tuple((s.provider, s.path) for s in GlobalHydra.instance().config_loader().get_sources())
        key = sources, self.config_name, self.hydra_overrides, choices
        if key in TREES:
            TREES.move_to_end(key)
            return TREES[key]
        overrides = [*self.hydra_overrides, *choices]
        unread = list(dict.fromkeys(line for line in lines if line not in VALUES))
        try:
            tree = compose(self.config_name, overrides=[*overrides, *reading(unread)], return_hydra_config=True)
        except Exception:  # the line's own compose names it (`parsed`), as Hydra's compose would
            tree, unread = compose(self.config_name, overrides=overrides, return_hydra_config=True), []
        groups = frozenset(tree.hydra.runtime.choices.keys()) | {c.split("=", 1)[0] for c in choices
                                                                 if not c.startswith("hydra.")}
        if unread:
            read(tree, unread)
        with open_dict(tree):
            del tree["hydra"]  # as compose leaves a job's config
        TREES[key] = tree, groups
        if len(TREES) > 256:
            TREES.popitem(last=False)
        return tree, groups

    def parsed(self, lines: list[str]) -> list[tuple[str, object]] | None:
        """Each `key=value` line's key and value as Hydra's grammar reads it (None: a dict value,
        which Hydra merges into a group's node: the full compose decides)."""
        unread = list(dict.fromkeys(line for line in lines if line not in VALUES))
        if unread:
            read(compose(None, overrides=reading(unread)), unread)
        found = []
        for line in lines:
            value = VALUES[line]
            if isinstance(value, dict):
                return None
            found.append((line.split("=", 1)[0], copy.deepcopy(value)))
        return found


def reading(lines: list[str]) -> list[str]:
    """Overrides that set each line's value under `READ`, a key of its own each (a key set twice, or
    a key and one beneath it, are read side by side)."""
    return [f"+{READ}.v{i}={line.split('=', 1)[1]}" for i, line in enumerate(lines)]


def read(cfg: DictConfig, lines: list[str]) -> None:
    """Records what Hydra read for each line (`reading`) in `VALUES`, unresolved (an interpolation,
    `seed=${base_seed}`, is set as text and resolved in the job's config), and removes `READ`."""
    values = OmegaConf.to_container(cfg[READ], resolve=False)
    for i, line in enumerate(lines):
        VALUES[line] = values[f"v{i}"]
    with open_dict(cfg):
        del cfg[READ]


def appends(line: str) -> bool:
    """`+name=value`: Hydra appends a group option (or a root key) to the defaults list, which the
    tree's own compose does as the full compose would."""
    key = line.split("=", 1)[0]
    return key.startswith("+") and not key.startswith("++") and "." not in key and "@" not in key


def defines(cfg: DictConfig, key: str) -> bool:
    """Whether `key` (dotted) is a node of `cfg`, a mandatory `???` value included (a preset's path
    the command line must give), which `OmegaConf.select` reports as absent."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False) if parent else cfg
    if isinstance(node, ListConfig):
        return leaf.isdigit() and int(leaf) < len(node)
    return isinstance(node, DictConfig) and leaf in node.keys()  # `in node` is False for a `???` value


class ComposingLoader(ConfigLoader):
    """Hydra's config loader, whose compose of a sweep's job (the sweeper's check that each job
    composes) is a `Composer`'s; the rest (the sweep parser's `glob()` reads the groups' options
    here) is Hydra's own. The sweeper throws its check's configs away: where `checked` is given,
    each stays there under its job's overrides, for a caller that composes the same jobs next."""

    def __init__(self, loader: ConfigLoader, composer, checked: dict[tuple[str, ...], DictConfig] | None = None) -> None:
        self.loader, self.composer, self.checked = loader, composer, checked

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        cfg = self.composer(list(sweep_overrides))
        if self.checked is not None:
            self.checked[tuple(sweep_overrides)] = cfg
        return cfg

    def load_configuration(self, *args, **kwargs):
        return self.loader.load_configuration(*args, **kwargs)

    def get_search_path(self):
        return self.loader.get_search_path()

    def get_sources(self):
        return self.loader.get_sources()

    def list_groups(self, parent_name: str):
        return self.loader.list_groups(parent_name)

    def get_group_options(self, *args, **kwargs):
        return self.loader.get_group_options(*args, **kwargs)

    def compute_defaults_list(self, *args, **kwargs):
        return self.loader.compute_defaults_list(*args, **kwargs)
