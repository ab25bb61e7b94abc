"""Dependencies point one way (issue 15): the import graph of ``src/bpfree`` has no cycle.

The graph is built from the source with :mod:`ast`, so an import inside a function counts as
much as one at the top of a module. Two levels are checked:

* modules: no module imports itself through a chain of others;
* packages: no two of bpfree's top-level packages (``memory``, ``pmt``, ``quant``, ...)
  import each other, directly or through a chain.

``from pkg import name`` is an edge to ``pkg.name`` when that is a module and to ``pkg``
otherwise; the implicit import of a parent package's ``__init__`` is not counted.

An import inside a function is allowed only to load a heavy optional dependency lazily
(matplotlib, scipy, scikit-learn, ...) and carries a ``# lazy: <why>`` comment on its line or
the line above. Imports of bpfree's own modules inside functions are refused: they are how a
cycle gets hidden. The one exception is a command front end
(:data:`FRONT_ENDS`), whose handlers load the library lazily and say so.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC / "bpfree"

#: Command front ends: they may import bpfree's own modules inside a handler, so that the
#: command starts without torch (``bpfree --help`` and Ctrl-C answer at once); each such
#: import still carries a ``# lazy:`` comment.
#: ``bpfree fleet``'s front end loads the Flower adapter only for ``--flower``: it needs flwr,
#: the optional "flower" extra, which a plain install lacks.
FRONT_ENDS = {"bpfree/cli.py", "bpfree/distributed/cli.py"}


def _modules() -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (path, is a package __init__)}`` of every module under src/bpfree."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_package)
    return out


MODULES = _modules()


def _nearest_module(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The bpfree modules one import statement loads."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = package.split(".")[:len(package.split(".")) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        names = [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source
                 for a in node.names]
    return [m for m in (_nearest_module(n) for n in names if n.startswith("bpfree"))
            if m is not None]


def _function_imports(tree: ast.Module) -> set[int]:
    """ids of the import nodes that sit inside a function body."""
    inner = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return inner


def _commented_lazy(lines: list[str], i: int) -> bool:
    """Line ``i`` (0-based) or the comment above its block of imports says ``# lazy:``."""
    if "# lazy:" in lines[i]:
        return True
    i -= 1
    while i >= 0 and lines[i].lstrip().startswith(("import ", "from ")):
        i -= 1
    return i >= 0 and lines[i].lstrip().startswith("# lazy:")


def _scan():
    """(edges {module: {module}}, problems with imports inside functions)."""
    edges: dict[str, set[str]] = {}
    problems = []
    for name, (path, is_package) in MODULES.items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text, filename=str(path))
        package = name if is_package else name.rpartition(".")[0]
        inner = _function_imports(tree)
        rel = path.relative_to(SRC).as_posix()
        edges[name] = set()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets = [t for t in _targets(node, package) if t != name]
            edges[name].update(targets)
            if id(node) not in inner:
                continue
            where = f"{rel}:{node.lineno}: {lines[node.lineno - 1].strip()}"
            if targets and rel not in FRONT_ENDS:
                problems.append(f"{where}  (bpfree's own module imported inside a function)")
            elif not _commented_lazy(lines, node.lineno - 1):
                problems.append(f"{where}  (no '# lazy: <why>' comment)")
    return edges, problems


EDGES, FUNCTION_IMPORT_PROBLEMS = _scan()


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def _top(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _package_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    graph: dict[str, set[str]] = {}
    why: dict[tuple[str, str], list[str]] = {}
    for src, targets in EDGES.items():
        for dst in targets:
            a, b = _top(src), _top(dst)
            if a != b:
                graph.setdefault(a, set()).add(b)
                why.setdefault((a, b), []).append(f"{src} -> {dst}")
    return graph, why


def test_the_graph_sees_imports_inside_functions_and_relative_imports():
    assert len(MODULES) > 50
    # relative, module level
    assert "bpfree.quant.stages" in EDGES["bpfree.quant.twin"]
    # inside a function (a pending command front end)
    assert "bpfree.quant.ptq" in EDGES["bpfree.demo"]
    # a synthetic cycle is found
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_import_cycle():
    cycle = _find_cycle(EDGES)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_package_import_cycle():
    graph, why = _package_graph()
    cycle = _find_cycle(graph)
    if cycle is not None:
        links = [f"  {a} -> {b}: {', '.join(why[(a, b)][:3])}" for a, b in zip(cycle, cycle[1:])]
        raise AssertionError("package cycle: " + " -> ".join(cycle) + "\n" + "\n".join(links))


def test_imports_inside_functions_are_lazy_third_party_loads_only():
    assert not FUNCTION_IMPORT_PROBLEMS, "\n".join(FUNCTION_IMPORT_PROBLEMS)


def test_front_ends_exist():
    missing = [f for f in FRONT_ENDS if not (SRC / f).is_file()]
    assert not missing, f"FRONT_ENDS lists files that are gone (drop them): {missing}"
