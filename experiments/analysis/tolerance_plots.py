"""The figure of a staleness tolerance map (`experiments.analysis.tolerance.map_report`):
one panel per (metric, axis), each method's mean after RL with its 95 % t interval against
the staleness value, the reference's mean and 95 % band, and its level before RL."""

from __future__ import annotations

import math
from typing import Any

from experiments.analysis.styles import NO_DATA, SEED_MARKERS, method_style

AXIS_LABEL = {"inter": "inter-trajectory lag (versions), intra switches at {intra_at}",
              "intra": "in-flight switches per trajectory, inter lag at {inter_at}"}
METRIC_LABEL = {"eval_ref_logp_after": "held-out reference log-lik. per token (nats)",
                "eval_accuracy_after": "held-out avg@4"}


def map_figure(report: dict[str, Any]):
    """A matplotlib figure (metrics x axes panels, ~1200 px wide at 110 dpi). A panel
    without runs says "no data"; each method keeps its colour and line style
    (`experiments.analysis.styles`) and one marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = report["metrics"]
    ref = report["reference"]
    methods = list(dict.fromkeys(r["method"] for r in report["rows"]))
    fig, axes = plt.subplots(len(metrics), 2, figsize=(11, 3.6 * len(metrics)), squeeze=False)
    for i, metric in enumerate(metrics):
        before = ref[metric.replace("_after", "_before")]
        for j, axis in enumerate(("inter", "intra")):
            ax = axes[i][j]
            rows = [r for r in report["rows"] if r["axis"] == axis]
            if not rows:
                ax.text(0.5, 0.5, NO_DATA, ha="center", va="center", transform=ax.transAxes)
            for k, method in enumerate(methods):
                pts = sorted((r["value"], r[metric]) for r in rows if r["method"] == method)
                if not pts:
                    continue
                xs = [p[0] for p in pts]
                ys = [p[1][0] for p in pts]
                err = [p[1][1] if math.isfinite(p[1][1]) else 0.0 for p in pts]
                ax.errorbar(xs, ys, yerr=err, **method_style(method),
                            marker=SEED_MARKERS[k % len(SEED_MARKERS)], capsize=3,
                            label=f"{method} (n={min(p[1][2] for p in pts)})")
            mean, half, n = ref[metric]
            if math.isfinite(mean):
                ax.axhline(mean, color="black", lw=1.2, label=f"{ref['name']} (n={n})")
                if math.isfinite(half):
                    ax.axhspan(mean - half, mean + half, color="black", alpha=0.08)
            if math.isfinite(before[0]):
                ax.axhline(before[0], color="grey", ls=":", lw=1, label="before RL")
            ticks = report["values"][axis]
            ax.set_xticks(ticks)
            pad = 0.05 * (max(ticks) - min(ticks) or 1)
            ax.set_xlim(min(ticks) - pad, max(ticks) + pad)
            ax.set_xlabel(AXIS_LABEL[axis].format(**report))
            ax.set_ylabel(METRIC_LABEL.get(metric, metric))
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle("Staleness tolerance after RL: mean and 95 % t interval over seeds "
                 "(band: the reference's)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 7), fontsize=9,
               frameon=False)
    return fig
