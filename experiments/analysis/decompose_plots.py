"""Figures of the decomposition (`experiments.analysis.decompose`): the two premises and
the gate curves. Needs matplotlib (the ``dev`` extra)."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from experiments.analysis import gate_curves as gc
from experiments.analysis import styles
from experiments.analysis.decomposed import ENTROPY_EDGES, Decomposed, classify, scores

MIN_WIDTH_IN = 6.0  # inches: >= 660 px at the 110 dpi figures are saved with


def _fit_range(x, ok) -> tuple[float, float] | None:
    """The span of the bins a fit used (``ok``), or None when there are none."""
    x = np.asarray(x, float)[np.asarray(ok, bool)]
    return (float(x.min()), float(x.max())) if x.size else None


def premise_figure(summary: dict[str, Any]):
    """Two panels: (a) E[delta_stale^2 | H] on fixed entropy bins with the fitted line;
    (b) E[delta_mis^2 | q] on fixed q bins against (1-q)/q, log-log. Each fitted line is
    drawn only over the bins it was fitted on (`experiments.analysis.decompose.premise_fits`:
    (a) every non-empty bin, (b) every non-empty bin but the last, q >= 0.999); the legend
    gives the estimate and its 95 % bootstrap interval to 2-3 digits; a panel without bins
    says "no data"."""
    import matplotlib.pyplot as plt

    p, boot = summary["premises"], summary.get("bootstrap", {})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    a = p["stale_vs_entropy"]
    x, y = np.array(a["bins"]["x_mean"], float), np.array(a["bins"]["y_mean"], float)
    count = np.array(a["bins"]["count"], float)
    used = np.isfinite(x) & np.isfinite(y) & (count > 0)
    span = _fit_range(x, used)
    if span is None:
        styles.mark_no_data(ax1)
    else:
        ax1.plot(x[used], y[used], "o", color="0.2", label="entropy bins (mean)")
        if np.isfinite(a["slope"]):
            xs = np.linspace(*span, 50)
            ax1.plot(xs, a["slope"] * xs + a["intercept"], "-", color="C1",
                     label=f"fit a H + b: a = {styles.fmt(a['slope'], 3)}, "
                           f"95% CI {styles.interval(boot.get('slope_ci95'))}")
        ax1.legend(fontsize=8, loc="upper left")  # the bins rise: that corner stays empty
    ax1.set(xlabel="behaviour entropy H (nats)", ylabel="E[delta_stale^2 | H]",
            title="(a) staleness drift vs entropy")
    b = p["mis_vs_q"]
    odds, y2 = np.array(b["odds"], float), np.array(b["bins"]["y_mean"], float)
    count2 = np.array(b["bins"]["count"], float)
    ok = np.isfinite(odds) & np.isfinite(y2) & (y2 > 0) & (count2 > 0)
    fitted = ok.copy()
    fitted[-1:] = False  # the fit leaves out the last bin (q >= 0.999)
    span2 = _fit_range(odds, fitted)
    if not ok.any():
        styles.mark_no_data(ax2)
    else:
        ax2.loglog(odds[ok], y2[ok], "o", color="0.2", label="q bins (mean)")
        if np.isfinite(b["exponent"]) and span2 is not None:
            xs = np.geomspace(*span2, 50)
            ax2.loglog(xs, np.exp(b["log_coef"]) * xs ** b["exponent"], "-", color="C1",
                       label=f"fit c ((1-q)/q)^k, q < 0.999: k = "
                             f"{styles.fmt(b['exponent'], 3)}, 95% CI "
                             f"{styles.interval(boot.get('exponent_ci95'))}")
        ax2.legend(fontsize=8, loc="upper left")  # "best" hid the lowest bin (q near 1)
    ax2.set(xlabel="(1 - q) / q, q = mu(sampled token)", ylabel="E[delta_mis^2 | q]",
            title="(b) mismatch vs token probability")
    fig.tight_layout()
    return fig


def gate_curve_figure(t: Decomposed, seq: dict[str, np.ndarray], eps: float = 0.01,
                      by_entropy: bool = False):
    """Every gate's curve (share of mismatch-dominated tokens cut against share of
    staleness-dominated tokens cut), defaults marked, the area under each curve (AUC) in
    the legend; one panel per fixed entropy bin with ``by_entropy``. A panel without both
    kinds of token has no curve: it says "no data". Each gate has its own colour and line
    style (`experiments.analysis.styles`); the figure is at least `MIN_WIDTH_IN` wide."""
    import matplotlib.pyplot as plt

    stale, mis = classify(t)
    sc = scores(t, seq, eps)
    if by_entropy:
        idx = np.searchsorted(np.asarray(ENTROPY_EDGES), t.entropy_mu, side="right") - 1
        panels = [(f"H in [{lo:g}, {ENTROPY_EDGES[i + 1] if i + 1 < len(ENTROPY_EDGES) else 'inf'})",
                   idx == i) for i, lo in enumerate(ENTROPY_EDGES)]
    else:
        panels = [("all tokens", np.ones(len(t), bool))]
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    width = max(MIN_WIDTH_IN, 3.6 * cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width, width / cols * 0.95 * rows),
                             squeeze=False)
    for ax, (title, sel) in zip(axes.flat, panels):
        n_stale, n_mis = int((sel & stale).sum()), int((sel & mis).sum())
        ax.set(title=f"{title}\nstaleness-dominated {n_stale}, mismatch-dominated {n_mis}",
               xlim=(0, 1), ylim=(-0.03, 1.03))
        ax.title.set_fontsize(8)
        ax.set_xscale("symlog", linthresh=1e-3)
        ax.set_xlabel("share of staleness-dominated tokens cut", fontsize=8)
        ax.set_ylabel("share of mismatch-dominated tokens cut", fontsize=8)
        if n_stale == 0 or n_mis == 0:  # a curve needs both kinds: none to draw
            styles.mark_no_data(ax, f"{styles.NO_DATA} (needs both kinds of token)")
            continue
        for g in gc.GATES:
            c = gc.curve(g, sc[g][sel], stale[sel], mis[sel])
            style = styles.method_style(g)
            ax.plot(np.concatenate([[0], c.x, [1]]), np.concatenate([[0], c.y, [1]]),
                    label=f"{g} (AUC {c.auc():.2f})", lw=1.5, **style)
            d = c.at_threshold(gc.DEFAULTS[g])
            ax.plot([d["x"]], [d["y"]], "o", color=style["color"], ms=4)
        ax.plot([], [], "o", color="0.3", ms=4, label="default threshold")
        ax.legend(fontsize=6.5)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def write_figures(t: Decomposed, seq: dict[str, np.ndarray], summary: dict[str, Any],
                  out: pathlib.Path, eps: float = 0.01) -> list[pathlib.Path]:
    """``premises.png``, ``gate_curves.png`` and ``gate_curves_by_entropy.png`` in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name, fig in (("premises", premise_figure(summary)),
                      ("gate_curves", gate_curve_figure(t, seq, eps)),
                      ("gate_curves_by_entropy", gate_curve_figure(t, seq, eps, by_entropy=True))):
        path = pathlib.Path(out) / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths
