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


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependency_direction(package):
    bad = {str(f.relative_to(REPO)): sorted(_imports(f) & FORBIDDEN[package])
           for f in _files(package)}
    assert {f: b for f, b in bad.items() if b} == {}


def test_math_modules_import_only_numpy_jax_chex():
    bad = {str(f.relative_to(REPO)): sorted(_imports(f) - MATH_ALLOWED)
           for rel in MATH_MODULES for f in _files(rel)}
    assert {f: b for f, b in bad.items() if b} == {}
