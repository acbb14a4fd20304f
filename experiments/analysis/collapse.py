"""The collapse criterion of the staleness pilot (`experiments/sweeps/collapse_pilot.toml`,
registered there before its runs): per stale setting, is async GRPO *broken* by staleness
while sync GRPO still learns?

For each stale method and setting (`experiments.analysis.regime`: every resolved config
field but the staleness section, the objective, the seed and bookkeeping, plus the stale
run's ``(inter_lag, intra_switches)``), the stale runs are paired by seed with the sync
runs (``staleness.mode = sync``) of the same setting, and over those ``n`` paired seeds:

* (a) ``drop``: the share of seeds where the stale run ends RL below its own level before
  RL, in avg@4 (``eval_accuracy_after < eval_accuracy_before``) OR in the primary metric
  (``eval_ref_logp_after < eval_ref_logp_before``); met when ``drop >= 0.7``;
* (b) ``sync gain``: the mean over seeds of the sync runs' ``eval_accuracy_after -
  eval_accuracy_before`` and of their ``eval_ref_logp_after - eval_ref_logp_before``; met
  when both are > 0;
* (c) ``gap``: the mean paired ``sync - stale`` difference of ``eval_accuracy_after``, with
  its 95 % t interval (`experiments.analysis.stats.mean_ci`); met when the mean is >= 0.10.

``collapses`` is ``yes`` when (a), (b) and (c) all hold, ``no`` otherwise; the criterion is
judged on stage 2's five seeds (the spec's comment), so a row over fewer seeds is a screen.
Unfinished runs are left out.

Usage::

    python -m experiments.analysis.collapse runs/collapse_pilot [--seeds 0 1 2 3 4] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Iterable

import numpy as np

from experiments.analysis.regime import paired_settings
from experiments.analysis.runs import Run, load_runs
from experiments.analysis.stats import mean_ci

DROP_SHARE = 0.7   # (a): share of seeds where the stale run ends below its start
MIN_GAP = 0.10     # (c): mean paired sync - stale gap in eval_accuracy_after


def _get(run: Run, key: str) -> float:
    return float((run.summary or {}).get(key, math.nan))


def dropped(run: Run) -> bool:
    """Whether ``run`` ended RL below its level before RL in avg@4 or in the primary metric
    (``eval_ref_logp``); a missing value counts as no drop."""
    return bool(_get(run, "eval_accuracy_after") < _get(run, "eval_accuracy_before")
                or _get(run, "eval_ref_logp_after") < _get(run, "eval_ref_logp_before"))


def _gain(run: Run, key: str) -> float:
    return _get(run, f"{key}_after") - _get(run, f"{key}_before")


def collapse_rows(runs: Iterable[Run], seeds: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """One row per (stale method, setting, inter, intra) with a sync run of the same setting
    on a common seed: ``method, lr, inter, intra, seeds, drop, sync_gain_acc,
    sync_gain_ref, stale_gain_acc, gap`` (``gap``: ``(mean, half_width, n)``), the three
    conditions ``a, b, c`` and ``collapses`` (module docstring). ``seeds``: only these
    seeds (e.g. the stage the criterion is judged on); None = every seed."""
    keep = None if seeds is None else set(seeds)
    runs = [r for r in runs if r.summary is not None and (keep is None or r.seed in keep)]
    rows = []
    for method, where, inter, intra, base, mine, seeds in paired_settings(runs):
        drop = float(np.mean([dropped(mine[s]) for s in seeds]))
        sync_acc = float(np.mean([_gain(base[s], "eval_accuracy") for s in seeds]))
        sync_ref = float(np.mean([_gain(base[s], "eval_ref_logp") for s in seeds]))
        gap = mean_ci([_get(base[s], "eval_accuracy_after") - _get(mine[s], "eval_accuracy_after")
                       for s in seeds])
        a, b, c = drop >= DROP_SHARE, sync_acc > 0 and sync_ref > 0, gap[0] >= MIN_GAP
        rows.append({
            "method": method, "lr": float(dict(where)["optim.learning_rate"]),
            "inter": inter, "intra": intra, "seeds": seeds, "drop": drop,
            "sync_gain_acc": sync_acc, "sync_gain_ref": sync_ref,
            "stale_gain_acc": float(np.mean([_gain(mine[s], "eval_accuracy") for s in seeds])),
            "stale_gain_ref": float(np.mean([_gain(mine[s], "eval_ref_logp") for s in seeds])),
            "gap": gap, "a": a, "b": b, "c": c, "collapses": "yes" if a and b and c else "no"})
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of `collapse_rows`; gaps as ``mean ± 95 % t half-width``."""
    if not rows:
        return "(no stale setting with a finished sync run on a common seed)"
    yn = lambda x: "yes" if x else "no"  # noqa: E731
    lines = ["| method | lr | inter | intra | seeds | (a) drop share | sync gain avg@4 | "
             "sync gain ref logp | stale gain avg@4 | stale gain ref logp | "
             "(c) gap sync-stale avg@4 (95 % t) | a | b | c | collapses |", "|" + "---|" * 15]
    for r in rows:
        g = r["gap"]
        half = f" ± {g[1]:.3f}" if math.isfinite(g[1]) else ""
        lines.append(
            f"| {r['method']} | {r['lr']:g} | {r['inter']} | {r['intra']} | {len(r['seeds'])} | "
            f"{r['drop']:.2f} | {r['sync_gain_acc']:+.3f} | {r['sync_gain_ref']:+.4f} | "
            f"{r['stale_gain_acc']:+.3f} | {r['stale_gain_ref']:+.4f} | {g[0]:+.3f}{half} | "
            f"{yn(r['a'])} | {yn(r['b'])} | {yn(r['c'])} | {r['collapses']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.analysis.collapse",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", help="a sweep output directory (every run below it is read)")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="judge over these seeds only (default: every seed)")
    p.add_argument("--json", help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    try:
        rows = collapse_rows(load_runs(args.runs), args.seeds)
    except FileNotFoundError as err:
        print(f"collapse: error: {err}", file=sys.stderr)
        return 2
    print(format_rows(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
