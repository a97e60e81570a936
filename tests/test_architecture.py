"""The import graph of src/prunebench, read from the source: no cycles, and each package imports
only the packages below it (README, Architecture)."""

from __future__ import annotations

import ast
from pathlib import Path

import prunebench

ROOT = Path(prunebench.__file__).parent
# package -> the top-level prunebench modules and packages it may import besides itself
ALLOWED = {
    "api": set(),
    "tasks": {"api", "cache", "corpora", "hub"},
    "evaluation": {"api", "models"},
    "models": {"api", "cache", "hub"},
    "pruners": {"api", "models", "cache"},
    "tracking": {"api", "cache"},
    "judges": {"cache", "models"},
    "report": {"api", "tracking", "paths"},
    # recovery fine-tuning: its data (corpora, calibration's window sampler, evaluation's windows, the
    # hub's alpaca) and its training on the model adapter, with the job's memory peaks (bench), in a
    # cache folder
    "recovery": {"api", "models", "corpora", "calibration", "evaluation", "bench", "cache", "hub"},
    # the exported folder (models' structure), where it goes (the run's MLflow store) and the command
    # rebuilding it (the job's own pruning path, its checks, a recovery's adapter folder)
    "export": {"api", "cache", "models", "tracking", "recovery", "pruning"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the prunebench modules it imports anywhere in its source (inside functions too:
    a deferred import is still a dependency)."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                # `from package import module` depends on the module, `from module import name` on the module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each as one cycle through them."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(path_through(graph, set(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def path_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One closed walk inside the component, from its first module back to it (to name in a message)."""
    start = min(component)
    previous, frontier = {start: None}, [start]
    while frontier:
        v = frontier.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                walk = [v]
                while previous[walk[-1]] is not None:
                    walk.append(previous[walk[-1]])
                return [start, *reversed(walk[:-1]), start] if len(walk) > 1 else [start, v, start]
            if w not in previous:
                previous[w] = v
                frontier.append(w)
    return sorted(component)


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_cycle_finder_names_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]


def test_packages_import_only_what_lies_below_them():
    wrong = []
    for module, targets in import_graph().items():
        package = module.split(".")[1] if "." in module else ""
        if package not in ALLOWED:
            continue
        for target in targets:
            top = target.split(".")[1]
            if top != package and top not in ALLOWED[package]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports against the layering: " + ", ".join(sorted(wrong))


def test_every_module_is_named_in_docs_architecture():
    """A reader finds any module in one step: docs/architecture.md names each one."""
    import re

    text = (ROOT.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    modules = [p for p in [*ROOT.rglob("*.py"), *(ROOT.parent / "hydra_plugins").rglob("*.py")]
               if p.name not in ("__init__.py", "__main__.py")]
    assert [str(p) for p in modules if not re.search(rf"\b{re.escape(p.stem)}\b", text)] == []
