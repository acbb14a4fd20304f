"""Figures of a pre-registered study (`experiments.multirun.study`): the tuning stage's candidates
per gate (`tuning_figure`), and the report's paired differences to the baseline with their
95 % intervals, each warm start's mean difference and the design's detectable difference
(`paired_figure`). Needs matplotlib (the ``dev`` extra)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from experiments.analysis import styles


def paired_figure(report: dict[str, Any]):
    """A forest plot, one row per arm other than the baseline (top to bottom in the
    report's order): the mean paired difference ``arm - baseline`` of the primary metric
    (dot) with its 95 % t interval (bar; none for fewer than 2 pairs), each warm start's
    mean difference (open markers), a line at 0, and the shaded band of +- the largest
    detectable difference (80 % power at 5 %) among the arms. Returns the figure."""
    import matplotlib.pyplot as plt

    key, base = report["primary_metric"], report["baseline"]
    rows = [(arm, e["vs_baseline"][key]) for arm, e in report["arms"].items()
            if key in e.get("vs_baseline", {})]
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.6))
    ys = np.arange(len(rows))[::-1].astype(float)
    detect = [p["detectable_80"] for _, p in rows if math.isfinite(p["detectable_80"])]
    if detect:
        ax.axvspan(-max(detect), max(detect), color="0.9", zorder=0,
                   label=f"detectable difference (80% power): {max(detect):.2g}")
    ax.axvline(0.0, color="0.4", lw=0.8)
    for y, (arm, p) in zip(ys, rows):
        lo, hi = p["ci95"] if p["ci95"] else (p["mean"], p["mean"])
        ax.errorbar([p["mean"]], [y], xerr=[[p["mean"] - lo], [hi - p["mean"]]], fmt="o",
                    color=styles.method_style(arm)["color"], capsize=3)
        for i, (ws, d) in enumerate(sorted(p["by_ws"].items())):
            ax.plot([d], [y - 0.2], "^v<>sd"[i % 6], mfc="none", color="0.3", ms=5,
                    label=f"warm start {ws}" if y == ys[0] else None)
    ax.set_yticks(ys, [f"{arm} (n={p['n']})" for arm, p in rows])
    ax.set(xlabel=f"paired difference in {key} to {base} (95% CI)",
           title=f"{report['runs_done']} of {report['runs_expected']} test runs"
           + (" (interim)" if report["runs_done"] < report["runs_expected"] else ""))
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def tuning_figure(study: dict[str, Any], rows: list[dict[str, Any]],
                  choice: dict[str, Any] | None = None):
    """One panel per tuned gate (``[tuning.X]``): each candidate's tuning runs (markers by
    warm start) and their mean (bar), the means of the untuned ``tuning_arms`` as
    horizontal lines in their method's style, and the chosen candidate (``choice``, when
    given) in red, the others dark grey. ``rows``:
    `experiments.multirun.study.stage_results` of the tune stage. Returns the figure."""
    import matplotlib.pyplot as plt

    key = study["preregistration"]["primary_metric"]
    gates = list(study["tuning"])
    fig, axes = plt.subplots(1, len(gates), figsize=(4.2 * len(gates), 3.6), squeeze=False,
                             sharey=True)
    wss = sorted({r["ws"] for r in rows})
    arms = study["preregistration"].get("tuning_arms", [])
    for ax, gate in zip(axes[0], gates):
        own = study["tuning"][gate]["own"]
        chosen = (choice or {}).get("chosen", {}).get(gate, {}).get("index")
        for i in range(len(own)):
            mine = [r for r in rows if r["arm"] == f"{gate}@{i}"]
            for r in mine:
                ax.plot([i + 0.08 * (wss.index(r["ws"]) - 0.5)], [r[key]], "os"[wss.index(r["ws"]) % 2],
                        mfc="none", color="0.35", ms=4,
                        label=f"warm start {r['ws']}" if i == 0 and r["seed"] == mine[0]["seed"] else None)
            if mine:  # the candidate's mean: dark grey, the chosen one red (not a method colour)
                ax.hlines(np.mean([r[key] for r in mine]), i - 0.3, i + 0.3, lw=2.5,
                          color="red" if i == chosen else "0.2",
                          label=("chosen (mean)" if i == chosen else
                                 "candidate (mean)" if i == (1 if chosen == 0 else 0) else None))
        for arm in arms:
            vals = [r[key] for r in rows if r["arm"] == arm]
            if vals:
                ax.axhline(np.mean(vals), lw=1.2, label=f"{arm} (mean)", **styles.method_style(arm))
        ax.set_xticks(range(len(own)), [", ".join(f"{k} {v:.3g}" for k, v in o.items())
                                        for o in own], rotation=30, ha="right", fontsize=7)
        ax.set(title=gate, xlabel="candidate")
        ax.legend(fontsize=6)
    axes[0][0].set(ylabel=f"{key} (tuning runs)")
    fig.tight_layout()
    return fig
