"""README's promises that a test can hold: its library example runs as written, a dict
batch is refused naming the type to build, and its sentence about ``-m`` says what pytest
does with the project's settings."""

import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_library_example_runs_as_written():
    section = README.split("## Using the library", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README.md (Using the library)", "exec"), scope)
    # ratio exp(0.1) is inside the clip range and every token passes ENTR's gate (0.01 / 1.01
    # <= tau): loss = -mean(ratio * A) over 6 tokens = -exp(0.1) * (3 - 1.5) / 6
    np.testing.assert_allclose(float(scope["loss"]), -np.exp(0.1) * 0.25, rtol=1e-6)


def test_a_dict_batch_names_the_type_to_build():
    import jax.numpy as jnp

    from entr_jax.objectives import make_objective

    objective = make_objective("entr")
    logp = jnp.zeros((1, 2))
    with pytest.raises(TypeError) as e:
        objective(logp, {"logp_mu": logp, "advantages": logp, "loss_mask": logp > -1})
    assert str(e.value) == (
        "argument `batch` must be an entr_jax.types.ObjectiveInput (its fields are read as "
        "attributes), got a dict with keys ['advantages', 'logp_mu', 'loss_mask']: pass "
        "ObjectiveInput(**batch)")

    class Partial:
        logp_mu = logp

    with pytest.raises(ValueError, match=r"^batch.advantages is required by every objective but "
                       r"the Partial passed as `batch` has no advantages \(or it is None\); build "
                       r"the batch as entr_jax.types.ObjectiveInput$"):
        objective(logp, Partial())


def collected(tmp_path, *args) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", "-p", "no:xdist", *args], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    return {line.split("::")[1] for line in out.stdout.splitlines() if "::" in line}


def test_readme_says_what_dash_m_does(tmp_path):
    """pyproject's ``addopts -m`` is replaced by a later ``-m``: README must say so."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "import pytest\n\ndef test_plain(): pass\n\n@pytest.mark.slow\ndef test_long(): pass\n\n"
        "@pytest.mark.gpu\ndef test_gpu(): pass\n\n@pytest.mark.sglang\ndef test_sglang(): pass\n")
    assert collected(tmp_path) == {"test_plain"}
    assert "`-m slow` runs only the long tests" in README
    assert collected(tmp_path, "-m", "slow") == {"test_long"}
    assert '`-m "not gpu and not sglang"` runs the default ones and the long ones' in README
    assert collected(tmp_path, "-m", "not gpu and not sglang") == {"test_plain", "test_long"}


def test_the_documented_compare_command_reads_any_folder_of_runs(capsys):
    from experiments.multirun import sweep

    assert "`python -m experiments.sweep summarize runs` compares every finished run" in \
        " ".join(README.split())
    folder = REPO / "tests" / "data" / "runs"
    assert sweep.main(["summarize", str(folder)]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| name=")]
    assert len(rows) == len(list(folder.glob("*/summary.json"))) == 6


def test_the_guide_has_headings_and_says_how_to_read_results():
    guide = (REPO / "docs" / "guide.md").read_text(encoding="utf-8")
    lines = guide.splitlines()
    heads = [i for i, ln in enumerate(lines) if ln.startswith("#") and not ln.startswith("#!")
             and (i == 0 or not lines[i - 1].startswith("```"))]
    in_code, run, longest = False, 0, 0
    for ln in lines:  # the longest stretch of prose lines under one heading
        in_code ^= ln.startswith("```")
        run = 0 if (ln.startswith("#") and not in_code) else run + 1
        longest = max(longest, run)
    assert heads and longest <= 50, longest
    section = guide.split("## Reading results", 1)[1].split("\n## ", 1)[0]
    for part in ("summary.json", "python -m experiments.sweep summarize", "jupyter execute",
                 "ENTR_FIGURES", "ENTR_RUNS", "not a cost of the method"):
        assert part in section, part
    for nb in (REPO / "notebooks").glob("*.ipynb"):
        assert f"`{nb.name}`" in section, nb.name
