"""The package's import graph, read statically (ast; nothing imported): no cycles anywhere, runtime/data and
runtime/models do not import each other (their shared types are runtime/sample.py's), and runtime/train and
runtime/parallel import no model family (docs/model_families.md, docs/architecture.md).

Every import counts: at module level, under `if TYPE_CHECKING:` and inside functions (a lazy import is still a
dependency: it is what made families.py <-> hf_config.py and launch/diagnose.py <-> jobs.py cycles)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("planner", "runtime", "cli")


def modules() -> dict[str, Path]:
    """orch.* module name -> its file, for every .py under planner/, runtime/ and cli/."""
    out = {}
    for top in FOLDERS:
        for path in (ROOT / top).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out["orch." + ".".join(parts)] = path
    return out


@cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (`from pkg import sub` counts as importing pkg.sub)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
        graph[name] = {m for m in found if m in known and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's), each as one cycle through them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
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
                out.append(cycle_through(graph, set(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def cycle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One cycle inside a strongly connected component: from its first module, breadth-first back to itself."""
    start = min(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle in {sorted(component)}")


def folder(module: str) -> str:
    return ".".join(module.split(".")[:3])


def test_the_package_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_a_cycle_is_found_and_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_models_import_nothing_of_data():
    """runtime/data asks the registry for a family's hooks (one direction); nothing under runtime/models imports
    runtime/data: what both use is runtime/sample.py's."""
    graph = import_graph()
    back = sorted(
        f"{a} -> {b}"
        for a, bs in graph.items()
        for b in bs
        if folder(a) == "orch.runtime.models" and folder(b) == "orch.runtime.data"
    )
    assert not back, back
    assert "orch.runtime.models.registry" in graph["orch.runtime.data.media"]


def test_train_and_parallel_import_no_family_folder():
    """Adding a family edits nothing under runtime/train/ or runtime/parallel/: no import names a family's folder
    (nor the registry: they talk to modules through runtime/models/contract.py)."""
    from orch.runtime.models.registry import FAMILIES

    families = {type(f).__module__.rpartition(".")[0] for f in FAMILIES.values()}
    assert families == {
        f"orch.runtime.models.{n}" for n in ("decoder", "internvl", "llava", "qwen2_audio", "qwen_omni", "qwen_vl")
    }
    named = sorted(
        f"{a} -> {b}"
        for a, bs in import_graph().items()
        if a.startswith(("orch.runtime.train", "orch.runtime.parallel"))
        for b in bs
        if b == "orch.runtime.models.registry" or any(b == f or b.startswith(f + ".") for f in families)
    )
    assert not named, named


def test_the_planner_imports_neither_runtime_nor_cli():
    """`cli -> runtime -> planner`: the planner reads a family's config through the registry its caller hands in."""
    wrong = sorted(
        f"{a} -> {b}"
        for a, bs in import_graph().items()
        if a.startswith("orch.planner")
        for b in bs
        if b.startswith(("orch.runtime", "orch.cli"))
    )
    assert not wrong, wrong
