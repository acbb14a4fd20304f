"""The docs travel with the repository: nothing points outside it, every link and docs/
path resolves, and the algorithm reference covers every registry objective."""

import pathlib
import re
import subprocess

import pytest

from entr_jax.objectives import OBJECTIVES

REPO = pathlib.Path(__file__).resolve().parents[1]


def tracked_files() -> list[pathlib.Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [REPO / line for line in out.splitlines() if (REPO / line).is_file()]


def text_of(path: pathlib.Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None  # binary (figures, the packaged gzip)


def test_nothing_refers_outside_the_repository():
    """Only CI (.ci/run) and tests may name the reference data copy beside a checkout."""
    offenders = []
    for path in tracked_files():
        rel = path.relative_to(REPO).as_posix()
        if rel == ".ci/run" or rel.startswith("tests/"):
            continue
        text = text_of(path)
        if text is not None and "../shared" in text:
            offenders.append(rel)
    assert offenders == []


def test_docs_paths_and_links_resolve():
    missing = []
    for path in tracked_files():
        text = text_of(path)
        if text is None or path.suffix not in (".py", ".md", ".toml", ".ipynb"):
            continue
        for ref in re.findall(r"\bdocs/[\w./-]+\.(?:md|png)", text):
            if not (REPO / ref).is_file():
                missing.append((path.relative_to(REPO).as_posix(), ref))
        if path.suffix == ".md":
            for link in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", text):
                if not (path.parent / link).exists():
                    missing.append((path.relative_to(REPO).as_posix(), link))
    assert missing == []


def test_algorithm_reference_covers_every_registry_objective():
    text = (REPO / "docs" / "algorithms.md").read_text(encoding="utf-8")
    headings = re.findall(r"^###? [\d.]+ .*$", text, flags=re.M)
    table_rows = re.findall(r"^\| `(\w+)`", text.split("## 5. Comparison", 1)[1], flags=re.M)
    for name in OBJECTIVES:
        if name == "estr":  # alias of entr, documented with it
            assert "`entr` (`estr`)" in text
            continue
        assert any(f"`{name}`" in h or (name == "entr" and "ENTR" in h) for h in headings), name
        assert name in table_rows, name
    assert sorted(table_rows) == sorted(n for n in OBJECTIVES if n != "estr")
