"""Dependencies point one way: experiments -> learners, samplers -> entr_jax (design.md)."""

import ast
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "entr_jax": {"learners", "samplers", "experiments"},
    "learners": {"samplers", "experiments"},
    "samplers": {"learners", "experiments"},
}
# The math reviewers check against the papers imports only these (design.md).
MATH_MODULES = ["entr_jax/objectives", "entr_jax/advantages.py", "entr_jax/staleness.py",
                "entr_jax/metrics.py", "entr_jax/sampling_filter.py", "entr_jax/logprobs.py"]
MATH_ALLOWED = {"jax", "numpy", "chex", "entr_jax"} | set(sys.stdlib_module_names)


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _files(rel: str):
    p = REPO / rel
    return sorted(p.rglob("*.py")) if p.is_dir() else [p]


# Inside experiments/ (design.md, "Layout"): the main job does not know about sweeps or
# analysis; analysis reads run directories, never drives runs.
EXPERIMENTS_FORBIDDEN = {
    "experiments/run": {"experiments.multirun", "experiments.analysis"},
    "experiments/analysis": {"experiments.multirun"},
}


def _dotted_imports(path: pathlib.Path) -> set[str]:
    """Every module named by an import of ``path`` (``from a import b``: ``a`` and ``a.b``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


@pytest.mark.parametrize("folder", sorted(EXPERIMENTS_FORBIDDEN))
def test_experiments_subpackage_direction(folder):
    bad = {str(f.relative_to(REPO)): sorted(
               n for n in _dotted_imports(f)
               if any(n == p or n.startswith(p + ".") for p in EXPERIMENTS_FORBIDDEN[folder]))
           for f in _files(folder)}
    assert {f: b for f, b in bad.items() if b} == {}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependency_direction(package):
    bad = {str(f.relative_to(REPO)): sorted(_imports(f) & FORBIDDEN[package])
           for f in _files(package)}
    assert {f: b for f, b in bad.items() if b} == {}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_imports(path: pathlib.Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports anywhere in the file (a lazy
    import inside a function closes a circle too): ``from a.b import c`` is ``a.b.c``
    when that is a module, else ``a.b``."""
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    out.add(f"{base}.{alias.name}")
                elif base in modules:
                    out.add(base)
    return out


def _circles(package: str) -> list[list[str]]:
    """The import circles among ``package``'s modules: its strongly connected components
    of more than one module (Tarjan's algorithm), each sorted."""
    files = {_module_name(f): f for f in _files(package)}
    graph = {m: sorted(_module_imports(f, set(files)) - {m}) for m, f in files.items()}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in graph[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return sorted(found)


@pytest.mark.parametrize("package", ["entr_jax", "learners", "samplers", "experiments"])
def test_no_import_circles(package):
    assert _circles(package) == []


def test_the_circle_finder_finds_a_lazy_import_circle(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n")
    (pkg / "c.py").write_text("from . import a\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert _circles("pkg") == [["pkg.a", "pkg.b"]]


def _test_module_imports(path: pathlib.Path) -> list[str]:
    """The test modules (``test_*``) that ``path`` imports, as written."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names = [base] + [f"{base}.{a.name}".replace("..", ".") for a in node.names]
        else:
            continue
        found += [n for n in names if n.rsplit(".", 1)[-1].startswith("test_")]
    return sorted(set(found))


def test_no_test_module_imports_another():
    """Shared fixtures live in tests/conftest.py (helpers in non-test modules such as
    tests/small_job.py): importing a test module runs its module-level setup and collects
    its tests a second time."""
    bad = {f.name: _test_module_imports(f) for f in sorted((REPO / "tests").glob("*.py"))}
    assert {f: b for f, b in bad.items() if b} == {}


def test_the_test_import_finder_sees_every_spelling(tmp_path):
    f = tmp_path / "test_x.py"
    f.write_text("import tests.test_a\nfrom tests.test_b import c\nfrom tests import test_c\n"
                 "from .test_d import e\nfrom . import test_e\nimport test_f\n"
                 "from tests.small_job import run\n")
    assert _test_module_imports(f) == [".test_d", ".test_e", "test_f", "tests.test_a",
                                       "tests.test_b", "tests.test_c"]


def test_math_modules_import_only_numpy_jax_chex():
    bad = {str(f.relative_to(REPO)): sorted(_imports(f) - MATH_ALLOWED)
           for rel in MATH_MODULES for f in _files(rel)}
    assert {f: b for f, b in bad.items() if b} == {}
