"""Run directories: loading, training curves against step and wall-clock, sweep tables.

Plain numpy over the files a run writes (layout in `experiments.run.rundir`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import sys
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from experiments.run.jsonl import read_records

FIGURES_ENV = "ENTR_FIGURES"
RUNS_ENV = "ENTR_RUNS"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Run:
    """One run directory, read into memory.

    Attributes:
      path: the directory.
      config: the resolved ``RunConfig`` (``config.json``) as nested dicts.
      metrics: ``metrics.jsonl`` rows (one dict per RL step, sorted by ``step``).
      timing: ``timing.jsonl`` rows (one dict per RL step, sorted by ``step``).
      summary: ``summary.json``, or None for an unfinished run.
      evals: ``{phase: eval/<phase>.json}`` for the phases present (init, before_rl, after_rl).
    """

    path: pathlib.Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    timing: list[dict[str, Any]]
    summary: dict[str, Any] | None
    evals: dict[str, dict[str, Any]]

    @property
    def method(self) -> str:
        """The method as its sweep names it: a comparison sweep's label (the run directory
        is ``method=<label>_...`` and the config's ``name`` is that label, e.g.
        ``grpo_async``), else the objective name with ``" sync"`` appended for staleness
        mode ``sync`` (the on-policy baseline, "GRPO (Sync)" in ESTR Table 1)."""
        label = str(self.config.get("name", ""))
        if label and self.path.name.startswith(f"method={label}_"):
            return label
        name = self.config["objective"]["name"]
        return f"{name} sync" if self.is_sync else name

    @property
    def is_sync(self) -> bool:
        """Staleness mode ``sync``: the on-policy reference."""
        return self.config["staleness"]["mode"] == "sync"

    @property
    def steps(self) -> int:
        """The RL steps the run is configured for (``rl_steps``)."""
        return int(self.config["rl_steps"])

    @property
    def inter_lag(self) -> int:
        """Configured inter-trajectory lag (0 in sync mode)."""
        st = self.config["staleness"]
        return 0 if st["mode"] == "sync" else int(st["inter_lag"])

    @property
    def intra_switches(self) -> int:
        """Configured intra-trajectory version switches (0 in sync mode)."""
        st = self.config["staleness"]
        return 0 if st["mode"] == "sync" else int(st["intra_switches"])

    @property
    def seed(self) -> int:
        return int(self.config["seed"])


def _jsonl(path: pathlib.Path) -> list[dict[str, Any]]:
    # a partial last line (a run killed mid-write) is dropped with a PartialLineWarning
    return sorted(read_records(path), key=lambda r: r["step"])


def load_run(path: str | os.PathLike) -> Run:
    """Read one run directory. Raises FileNotFoundError naming the path when it has no
    ``config.json``."""
    path = pathlib.Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"load_run: {path} is not a run directory (no config.json)")
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").exists() else None
    evals = {p.stem: json.loads(p.read_text()) for p in sorted((path / "eval").glob("*.json"))}
    return Run(path, json.loads((path / "config.json").read_text()), _jsonl(path / "metrics.jsonl"),
               _jsonl(path / "timing.jsonl"), summary, evals)


def load_runs(root: str | os.PathLike) -> list[Run]:
    """Every run directory (holding ``config.json`` and ``metrics.jsonl``) at or below
    ``root``, sorted by path. Raises FileNotFoundError when there is none."""
    root = pathlib.Path(root)
    dirs = sorted({p.parent for p in root.rglob("config.json") if (p.parent / "metrics.jsonl").exists()})
    if not dirs:
        raise FileNotFoundError(f"load_runs: no run directories under {root}")
    return [load_run(d) for d in dirs]


def print_table(prog: str, root: str | os.PathLike, render: Callable[[list[Run]], str]) -> int:
    """The command-line tail of the analysis tables: prints ``render(load_runs(root))`` and
    how many runs were unfinished (no ``summary.json``); returns 0, or 2 after printing
    ``<prog>: error: ...`` when there are no runs or ``render`` raises ValueError."""
    try:
        runs = load_runs(root)
        text = render(runs)
    except (FileNotFoundError, ValueError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    print(text)
    unfinished = sum(r.summary is None for r in runs)
    if unfinished:
        print(f"({unfinished} unfinished run(s) left out)")
    return 0


def runs_root(default: str | os.PathLike) -> pathlib.Path:
    """The runs directory a notebook reads: ``$ENTR_RUNS`` if set, else ``default``; a
    relative path is taken from the repository root (where the sweep commands run), not
    from the notebook's working directory."""
    path = pathlib.Path(os.environ.get(RUNS_ENV) or default)
    return path if path.is_absolute() else REPO_ROOT / path


def save_figure(fig, name: str) -> pathlib.Path | None:
    """Save ``fig`` as ``$ENTR_FIGURES/<name>.png`` (directory created) when the variable
    is set; returns the path, or None when it is not set. A relative ``$ENTR_FIGURES`` is
    taken from the repository root, as ``$ENTR_RUNS`` is (`runs_root`), not from the
    notebook kernel's working directory (``notebooks/``)."""
    out = os.environ.get(FIGURES_ENV)
    if not out:
        return None
    folder = pathlib.Path(out)
    path = (folder if folder.is_absolute() else REPO_ROOT / folder) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def by_method(runs: Iterable[Run]) -> dict[str, list[Run]]:
    """Runs grouped by `Run.method`, methods in sorted order."""
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(r.method, []).append(r)
    return dict(sorted(out.items()))


# ----------------------------------------------------------------------------- curves
def wall_clock(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, seconds)``: RL wall-clock at the end of each step, float64 ``[S]``, the
    cumulative sum over steps of the learner's critical path from ``timing.jsonl``:
    ``time/sample_s + time/learn_s + time/wait_s`` in ``sync``/``simulated`` mode (one
    thread samples, then learns) and ``time/learn_s + time/wait_s`` in ``async`` mode
    (sampling overlaps learning; the learner only waits for it). Evaluation and the warm
    start are excluded."""
    keys = ("time/learn_s", "time/wait_s")
    if run.config["staleness"]["mode"] != "async":
        keys += ("time/sample_s",)
    steps = np.array([t["step"] for t in run.timing], np.int64)
    per_step = [sum(float(t.get(k, 0.0)) for k in keys) for t in run.timing]
    return steps, np.cumsum(np.array(per_step, np.float64))


def curve(run: Run, key: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of metric ``key`` over RL steps; ``x`` is ``"step"`` or ``"wall"``
    (seconds, `wall_clock`). Steps where the key is missing or not a finite number are
    dropped. Raises KeyError naming ``key`` when no row has it, ValueError for a bad ``x``."""
    if x not in ("step", "wall"):
        raise ValueError(f"curve: x must be 'step' or 'wall', got {x!r}")
    rows = [m for m in run.metrics if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])]
    if not rows and not any(key in m for m in run.metrics):
        raise KeyError(f"curve: metric {key!r} not in {run.path / 'metrics.jsonl'}")
    steps = np.array([m["step"] for m in rows], np.int64)
    y = np.array([m[key] for m in rows], np.float64)
    if x == "step":
        return steps.astype(np.float64), y
    t_steps, seconds = wall_clock(run)
    lookup = dict(zip(t_steps.tolist(), seconds.tolist()))
    keep = np.array([int(s) in lookup for s in steps], bool)
    return np.array([lookup[int(s)] for s in steps[keep]], np.float64), y[keep]


def moving_average(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean ``out[i] = mean(y[max(0, i-window+1) : i+1])`` (same length as y)."""
    if window < 1:
        raise ValueError(f"moving_average: window must be >= 1, got {window}")
    c = np.concatenate([[0.0], np.cumsum(np.asarray(y, np.float64))])
    i = np.arange(1, len(y) + 1)
    lo = np.maximum(0, i - window)
    return (c[i] - c[lo]) / (i - lo)


def eval_points(run: Run, metric: str = "avg@n", benchmark: str | None = None) -> dict[str, list[float]]:
    """Evaluation accuracy at the RL phases: ``{"step": [...], "wall": [...], "value": [...]}``
    for ``before_rl`` (step 0, 0 s) and ``after_rl`` (step ``rl_steps``, total RL seconds)
    when present. ``benchmark`` defaults to the run's first (primary) benchmark."""
    out: dict[str, list[float]] = {"step": [], "wall": [], "value": []}
    total = float(wall_clock(run)[1][-1]) if run.timing else 0.0
    for phase, step, wall in (("before_rl", 0, 0.0), ("after_rl", run.config["rl_steps"], total)):
        if phase not in run.evals:
            continue
        benches = run.evals[phase]["benchmarks"]
        name = benchmark or next(iter(benches))
        if name not in benches or metric not in benches[name]:
            raise KeyError(f"eval_points: {run.path}/eval/{phase}.json has no {name}/{metric}")
        out["step"].append(float(step))
        out["wall"].append(wall)
        out["value"].append(float(benches[name][metric]))
    return out


# ----------------------------------------------------------------------------- sweeps
def final_reward(run: Run, window: int = 10) -> float:
    """Mean ``reward/mean`` over the last ``min(window, S)`` RL steps (the summary's
    ``final_reward``); NaN for a run with no steps."""
    _, y = curve(run, "reward/mean") if run.metrics else (None, np.array([]))
    return float(np.mean(y[-window:])) if len(y) else float("nan")


def measured_staleness(run: Run, skip: int | None = None) -> tuple[float, float]:
    """``(inter, intra)``: means over steps ``>= skip`` of ``staleness/inter_mean`` and
    ``staleness/intra_mean``, the per-trajectory ``inter = version - v_last`` and
    ``intra = v_last - v_first`` of the job (ESTR section 2); NaN when no step qualifies.

    ``skip`` defaults to ``inter_lag + intra_switches``: before that the delay line and the
    parameter ring are not yet full. After it, in simulated mode, ``inter + intra`` equals
    the configured ``inter_lag + intra_switches`` exactly, while ``inter`` alone exceeds
    ``inter_lag`` when switches fall after a short response's end (the trajectory then
    never reaches the newest version).
    """
    skip = run.inter_lag + run.intra_switches if skip is None else skip
    rows = [m for m in run.metrics if m["step"] >= skip]
    if not rows:
        return float("nan"), float("nan")
    return (float(np.mean([m["staleness/inter_mean"] for m in rows])),
            float(np.mean([m["staleness/intra_mean"] for m in rows])))


def sweep_rows(runs: Iterable[Run], window: int = 10) -> list[dict[str, Any]]:
    """One row per run: ``method, sync, rl_steps, inter_lag, intra_switches, seed,
    final_reward, measured_inter, measured_intra, eval_after, run`` (eval_after: the
    summary's ``eval_accuracy_after`` or NaN)."""
    rows = []
    for r in runs:
        inter, intra = measured_staleness(r)
        rows.append({"method": r.method, "sync": r.is_sync, "rl_steps": r.steps,
                     "inter_lag": r.inter_lag, "intra_switches": r.intra_switches,
                     "seed": r.seed, "final_reward": final_reward(r, window),
                     "measured_inter": inter, "measured_intra": intra,
                     "eval_after": float((r.summary or {}).get("eval_accuracy_after", float("nan"))),
                     "run": r.path.name})
    return rows


def staleness_axis(rows: Sequence[dict[str, Any]], axis: str, value: str = "final_reward",
                   fixed: int = 1) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per method, ``(x, mean, std)`` of ``value`` over seeds against ``axis``
    (``"inter_lag"`` or ``"intra_switches"``), using the rows whose other axis equals
    ``fixed`` (the ESTR Fig. 9 protocol: intra 1 when sweeping inter, and vice versa).
    Sync rows (``sync``, or a method named ``"... sync"``) are left out: plot them as a
    reference level.
    Runs of different lengths (``rl_steps``) are never pooled into one point: a method
    with several lengths gives one series per length, ``"<method>, <n> steps"``."""
    other = {"inter_lag": "intra_switches", "intra_switches": "inter_lag"}.get(axis)
    if other is None:
        raise ValueError(f"staleness_axis: axis must be 'inter_lag' or 'intra_switches', got {axis!r}")
    out = {}
    stale = [r for r in rows if not (r.get("sync") or r["method"].endswith(" sync"))]
    series: dict[str, list[dict[str, Any]]] = {}
    for method in sorted({r["method"] for r in stale}):
        mine = [r for r in stale if r["method"] == method]
        lengths = sorted({r.get("rl_steps") for r in mine}, key=lambda n: (n is None, n or 0))
        for n in lengths:
            name = method if len(lengths) == 1 else f"{method}, {n} steps"
            series[name] = [r for r in mine if r.get("rl_steps") == n]
    for method, mine in series.items():
        sel = [r for r in mine if r[other] == fixed]
        xs = sorted({r[axis] for r in sel})
        if not xs:
            continue
        vals = [[r[value] for r in sel if r[axis] == x] for x in xs]
        out[method] = (np.array(xs, np.float64), np.array([np.mean(v) for v in vals]),
                       np.array([np.std(v) for v in vals]))
    return out

