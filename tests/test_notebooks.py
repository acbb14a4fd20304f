"""Every analysis notebook executes against the stored runs (tests/data/runs; the study
slice for the decomposition) and writes its figures to ``$ENTR_FIGURES``."""

import os
import pathlib
import subprocess
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = pathlib.Path(__file__).resolve().parents[1]
RUNS = REPO / "tests" / "data" / "runs"
FIGURES = {
    "method_comparison": ["method_comparison"],
    "staleness_sweep": ["staleness_sweep", "staleness_measured"],
    "ratio_vs_entropy": ["ratio_vs_entropy", "gate_cuts"],
    "mask_fraction": ["mask_fraction"],
    "decomposition": ["decomposition_premises", "decomposition_gate_curves",
                      "decomposition_gate_curves_by_entropy"],
    "study": ["study_tuning", "study_paired"],
    "tolerance_map": ["tolerance_map"],
}
# the stored runs each notebook executes on (tests/data/runs unless it needs others: the
# decomposition reads token samples with logp_version, which the study slice has; the
# study notebook reads the fp8 study's committed archive)
RUNS_OF = {"decomposition": "tests/data/study_slice", "study": "results/stress_fp8",
           "tolerance_map": "tests/data/tolerance_map"}


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """Environment in which the ``python3`` kernel resolves to this interpreter: the
    installed kernelspec if there is one, else one installed into a temporary prefix."""
    from jupyter_client.kernelspec import KernelSpecManager

    env = {}
    if "python3" not in KernelSpecManager().find_kernel_specs():
        prefix = tmp_path_factory.mktemp("kernel")
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(prefix),
                        "--name", "python3"], check=True, capture_output=True)
        env["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    return env


def test_every_notebook_is_listed_and_stored_without_outputs():
    names = sorted(p.stem for p in (REPO / "notebooks").glob("*.ipynb"))
    assert names == sorted(FIGURES)
    for name in names:
        nb = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, name


def _execute(name, runs, tmp_path, monkeypatch, kernel_env):
    """Execute notebook ``name`` on the run directories ``runs`` (relative to the repo
    root); returns (the executed notebook, its figures directory)."""
    for key, value in kernel_env.items():
        monkeypatch.setenv(key, value)
    figures = tmp_path / "figures"
    monkeypatch.setenv("ENTR_RUNS", runs)  # relative: from the repo root
    monkeypatch.setenv("ENTR_FIGURES", str(figures))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=120,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    return nb, figures


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_notebook_executes_and_saves_figures(name, tmp_path, monkeypatch, kernel_env):
    nb, figures = _execute(name, RUNS_OF.get(name, "tests/data/runs"), tmp_path, monkeypatch,
                           kernel_env)
    produced = sorted(p.name for p in figures.glob("*.png"))
    assert produced == sorted(f"{f}.png" for f in FIGURES[name])
    for f in figures.glob("*.png"):
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f.stat().st_size > 5000
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "runs under" in text


def test_method_comparison_on_the_stress_slice(tmp_path, monkeypatch, kernel_env):
    """The stress regime's CI slice (tests/data/stress_runs: a comparison sweep of two
    methods): the notebook prints the protocol report (each method's differences from the
    shared base, none undeclared) and the per-method intervals."""
    nb, figures = _execute("method_comparison", "tests/data/stress_runs", tmp_path,
                           monkeypatch, kernel_env)
    assert (figures / "method_comparison.png").stat().st_size > 5000
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "Differences from the comparison base" in text and "UNDECLARED" not in text
    assert "- entr:\n    objective.denominator = 'all_tokens' (base 'n/a')" in text
    assert "- grpo_async:\n    objective.kl_coef = 0.0 (base 'n/a')" in text
    assert "final_reward\n" in text and "(n = 1)" in text
