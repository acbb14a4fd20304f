"""The figure of a pre-registered study's report (`experiments.analysis.study_report`):
each arm's paired difference to the baseline in the primary metric, with its 95 % interval,
each warm start's mean difference, and the design's detectable difference. Needs
matplotlib (the ``dev`` extra)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


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
                    color="C3" if arm.startswith("entr") else "C0", capsize=3)
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
