"""The method-comparison table of a comparison sweep (docs/stress.md section 4): per
method, over its seeds, the held-out accuracy after RL, its gain over the run's own before-RL accuracy,
the final training reward, the fraction of loss tokens the method's gate rejected, and the
collapse indicators; each stochastic value as ``mean ± 95% t half-width (n seeds)``
(`experiments.analysis.stats.mean_ci`), and the paired gap of each method to a reference
method (default ``grpo_async``) over the seeds both ran.

Columns: ``seeds`` (the finished seeds), ``eval after`` (held-out avg@k after RL, the
summary's ``eval_accuracy_after``), ``eval gain`` (after minus the run's before-RL
accuracy), ``final reward`` (mean training reward of the last 10 RL steps' rollouts),
``mask`` and ``clip`` (fractions of loss tokens, not percent), the gap to the reference;
``(n)`` is the number of seeds a value is over.

* ``mask`` is ESTR's rho_mask: the per-step ``mask/fraction`` (loss tokens rejected by the
  acceptance rule; ``docs/algorithms.md``) averaged over a run's steps, then over seeds.
  0 for a method without a gate (GRPO, CISPO); a clip is not a mask.
* ``clip`` is ``clip/frac_low + clip/frac_high`` averaged the same way (loss tokens whose
  gradient the clip removes); blank for a method without a clip band (M2PO) and for CISPO
  (its bounds truncate a detached weight and remove no gradient).
* all runs must share one setting (every resolved config field but the objective, the
  staleness section, the seed and bookkeeping): runs given another learning rate, lag
  or mismatch are refused, naming the fields, rather than paired.
* ``gnorm max``, ``ESS min``, ``k3 max`` are each run's largest gradient norm, smallest
  token ESS fraction and largest k3 KL(mu||pi) (`experiments.analysis.regime.indicators`),
  averaged over seeds (the mean of the per-run extremes, not the extreme of all runs).

Methods are comparison labels (``method=<label>_...`` run names, e.g. ``grpo_sync``).
Only finished runs (a ``summary.json``) count.

Usage::

    python -m experiments.analysis.methods runs/stress_methods [--reference grpo_async]
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Iterable

import numpy as np
from scipy import stats as _st

from experiments.analysis.regime import indicators, label, setting, value, varying_fields
from experiments.analysis.runs import Run, print_table
from experiments.analysis.stats import mean_ci

VALUES = ("eval_after", "eval_gain", "final_reward")


def _mean_metric(run: Run, keys: tuple[str, ...]) -> float:
    """Mean over a run's steps of the sum of ``keys`` (NaN when a key is missing)."""
    xs = [sum(m[k] for k in keys) for m in run.metrics if all(k in m for k in keys)]
    xs = [x for x in xs if math.isfinite(x)]
    return float(np.mean(xs)) if xs else math.nan


def method_rows(runs: Iterable[Run], reference: str = "grpo_async") -> list[dict[str, Any]]:
    """One row per method label (sorted): ``method``, ``seeds``, each of `VALUES` and
    ``mask``/``clip`` as ``(mean, half_width, n)``, ``gap`` (``eval_after`` minus the
    reference's on the common seeds, ``(mean, half_width, n)``; n = 0 for the reference
    itself and for a method with no common seed) and the seed-mean collapse indicators
    (NaN when no seed has one). ``seeds`` lists the finished seeds; a value's n can be
    smaller where a run lacks that value.

    Raises:
      ValueError: a method has a seed twice, or the runs are not of one setting (their
        resolved configs differ in a field other than the comparison's: objective,
        staleness, seed, bookkeeping; `experiments.analysis.regime.setting`), which would
        pair methods trained under different conditions."""
    runs = [r for r in runs if r.summary is not None]
    differ = varying_fields([setting(r) for r in runs], shown=())
    if differ:
        raise ValueError("method_rows: the runs are not of one setting: they differ in "
                         f"{', '.join(differ)}; make one table per setting")
    groups: dict[str, dict[int, Run]] = {}
    for r in runs:
        seeds = groups.setdefault(label(r), {})
        if r.seed in seeds:
            raise ValueError(f"method_rows: method {label(r)!r} has seed {r.seed} twice "
                             f"({seeds[r.seed].path.name}, {r.path.name}): one setting per call")
        seeds[r.seed] = r
    ref = groups.get(reference, {})
    rows = []
    for method, by_seed in sorted(groups.items()):
        mine = [by_seed[s] for s in sorted(by_seed)]
        common = [] if method == reference else sorted(set(by_seed) & set(ref))
        ind = [indicators(r) for r in mine]
        row = {"method": method, "seeds": sorted(by_seed)}
        for v in VALUES:
            row[v] = mean_ci([value(r, v) for r in mine])
        row["mask"] = mean_ci([_mean_metric(r, ("mask/fraction",)) for r in mine])
        row["clip"] = mean_ci([_mean_metric(r, ("clip/frac_low", "clip/frac_high")) for r in mine])
        row["gap"] = mean_ci([value(by_seed[s], "eval_after") - value(ref[s], "eval_after")
                              for s in common])
        for k in ind[0]:
            xs = [i[k] for i in ind if math.isfinite(i[k])]
            row[k] = float(np.mean(xs)) if xs else math.nan
        rows.append(row)
    return rows


def _ci(t: tuple[float, float, int], digits: int = 3) -> str:
    mean, half, n = t
    if n == 0 or not math.isfinite(mean):
        return ""
    return f"{mean:.{digits}f} ± {half:.{digits}f} ({n})" if math.isfinite(half) else f"{mean:.{digits}f} (1)"


def _num(x: float, spec: str) -> str:
    return format(x, spec) if math.isfinite(x) else ""


def interval_note(rows: list[dict[str, Any]]) -> str:
    """The table's footnote: what "±" is and how wide it is at the fewest seeds of a method
    with at least two (``t_{0.975, n-1}`` standard errors), and where a claim is made."""
    counts = [len(r["seeds"]) for r in rows if len(r["seeds"]) >= 2]
    note = ("± is the 95% Student-t half-width over the seeds (their count in parentheses): "
            "t_{0.975, n-1} * s / sqrt(n).")
    if counts:
        n = min(counts)
        note += (f" At {n} seeds it is {_st.t.ppf(0.975, n - 1):.2f} standard errors wide"
                 + (": 2 seeds decide nothing." if n == 2 else "."))
    return note + (" A claim needs a pre-registered study with its own seeds and tuning: "
                   "python -m experiments.study (experiments/studies/stress_fp8.toml).")


def format_rows(rows: list[dict[str, Any]], reference: str = "grpo_async") -> str:
    """A Markdown table of `method_rows`, with `interval_note` below it."""
    if not rows:
        return "(no finished runs)"
    head = ("| method | seeds | eval after | eval gain | final reward | mask | clip | "
            f"eval after - {reference} | gnorm max | ESS min | k3 max |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r['method']} | {','.join(map(str, r['seeds']))} | {_ci(r['eval_after'])} | "
            f"{_ci(r['eval_gain'])} | {_ci(r['final_reward'])} | {_ci(r['mask'], 4)} | "
            f"{_ci(r['clip'], 4)} | {_ci(r['gap'])} | {_num(r['gnorm_max'], '.3g')} | "
            f"{_num(r['ess_min'], '.3f')} | {_num(r['k3_max'], '.3g')} |")
    return "\n".join(lines + ["", interval_note(rows)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.analysis.methods", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", help="a comparison sweep's output directory (every run below it is read)")
    p.add_argument("--reference", default="grpo_async",
                   help="the method each gap is taken against (default grpo_async)")
    args = p.parse_args(argv)

    def render(runs: list[Run]) -> str:
        rows = method_rows(runs, args.reference)
        text = format_rows(rows, args.reference)
        if rows and args.reference not in {r["method"] for r in rows}:
            text += (f"\n(no finished run of the reference method {args.reference!r}: no gaps; "
                     f"methods: {', '.join(r['method'] for r in rows)})")
        return text

    return print_table("methods", args.runs, render)

if __name__ == "__main__":
    sys.exit(main())
