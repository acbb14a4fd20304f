"""No import circles among the repository's modules (design.md: dependencies point one way).

The graph: one node per module of `PACKAGES` (a package is its ``__init__``), one edge per
import statement anywhere in the file (a function-level import is still a dependency),
except those under ``if TYPE_CHECKING:``. ``from a import b`` points at the module
``a.b`` when it exists, else at ``a``. A circle is a strongly connected component of more
than one module.
"""

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("entr_jax", "learners", "samplers", "experiments")
# Circles another change removes (each a set of modules); nothing may be added here.
KNOWN = {
    frozenset({"learners.logging", "learners.wandb_logger"}),
    frozenset({"entr_jax.data.chains", "entr_jax.data.sources"}),
}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (REPO / pkg).rglob("*.py"):
            parts = f.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _runtime_imports(tree: ast.AST):
    """Import nodes outside ``if TYPE_CHECKING:`` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in _runtime_imports_of(child))
            continue
        yield from _runtime_imports_of(node)


def _runtime_imports_of(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _runtime_imports(node)


def import_graph() -> dict[str, set[str]]:
    """``{module: modules it imports}`` (see the module docstring)."""
    mods = _modules()

    def owner(name: str) -> str | None:  # the longest prefix that is a module here
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        targets = set()
        for node in _runtime_imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
                continue
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                        for a in node.names}
        graph[mod] = {t for t in map(owner, targets) if t is not None and t != mod}
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_function_level_and_relative_imports_but_not_type_checking():
    graph = import_graph()
    assert "experiments.job" in graph["experiments.run"]  # imported inside main()
    assert "learners.learner" not in graph["learners.contract"]  # under TYPE_CHECKING
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        frozenset({"a", "b", "c"})]


def test_no_import_circles():
    found = set(circles(import_graph()))
    assert found - KNOWN == set(), "import circles: " + "; ".join(
        " <-> ".join(sorted(c)) for c in found - KNOWN)


@pytest.mark.parametrize("circle", sorted(KNOWN, key=sorted), ids=lambda c: "-".join(sorted(c)))
def test_known_circles_are_still_there(circle):
    """A circle removed elsewhere must leave `KNOWN` too, so the list only shrinks."""
    assert circle in set(circles(import_graph()))
