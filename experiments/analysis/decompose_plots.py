"""Figures of the decomposition (`experiments.analysis.decompose`): the two premises and
the gate curves. Needs matplotlib (the ``dev`` extra)."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from experiments.analysis import gate_curves as gc
from experiments.analysis.decomposed import ENTROPY_EDGES, Decomposed, classify, scores

_STYLE = {"entr": ("C3", "-"), "icepop": ("C0", "--"), "kpop": ("C2", "-."),
          "trm": ("C4", ":"), "m2po": ("C5", "--"), "tis": ("C7", ":")}


def premise_figure(summary: dict[str, Any]):
    """Two panels: (a) E[delta_stale^2 | H] on fixed entropy bins with the fitted line;
    (b) E[delta_mis^2 | q] on fixed q bins against (1-q)/q, log-log."""
    import matplotlib.pyplot as plt

    p = summary["premises"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    a = p["stale_vs_entropy"]
    x, y = np.array(a["bins"]["x_mean"], float), np.array(a["bins"]["y_mean"], float)
    ax1.plot(x, y, "o", label="bins")
    xs = np.linspace(0, np.nanmax(x) if np.isfinite(x).any() else 1, 50)
    ax1.plot(xs, a["slope"] * xs + a["intercept"], "-",
             label=f"a = {a['slope']:.3g}, CI {summary['bootstrap']['slope_ci95']}")
    ax1.set(xlabel="behaviour entropy H (nats)", ylabel="E[delta_stale^2 | H]",
            title="(a) staleness drift vs entropy")
    ax1.legend(fontsize=7)
    b = p["mis_vs_q"]
    odds, y2 = np.array(b["odds"], float), np.array(b["bins"]["y_mean"], float)
    ok = np.isfinite(odds) & np.isfinite(y2) & (y2 > 0)
    ax2.loglog(odds[ok], y2[ok], "o", label="bins")
    if np.isfinite(b["exponent"]) and ok.any():
        xs = np.geomspace(odds[ok].min(), odds[ok].max(), 50)
        ax2.loglog(xs, np.exp(b["log_coef"]) * xs ** b["exponent"], "-",
                   label=f"k = {b['exponent']:.3g}, CI {summary['bootstrap']['exponent_ci95']}")
    ax2.set(xlabel="(1 - q) / q, q = mu(sampled token)", ylabel="E[delta_mis^2 | q]",
            title="(b) mismatch vs token probability")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    return fig


def gate_curve_figure(t: Decomposed, seq: dict[str, np.ndarray], eps: float = 0.01,
                      by_entropy: bool = False):
    """Every gate's curve (share of mismatch-dominated tokens cut against share of
    staleness-dominated tokens cut), defaults marked; one panel per fixed entropy bin with
    ``by_entropy``."""
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
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 3.2 * rows), squeeze=False)
    for ax, (title, sel) in zip(axes.flat, panels):
        for g in gc.GATES:
            c = gc.curve(g, sc[g][sel], stale[sel], mis[sel])
            color, ls = _STYLE[g]
            ax.plot(np.concatenate([[0], c.x, [1]]), np.concatenate([[0], c.y, [1]]),
                    ls, color=color, label=f"{g} ({c.auc():.2f})")
            d = c.at_threshold(gc.DEFAULTS[g])
            ax.plot([d["x"]], [d["y"]], "o", color=color, ms=4)
        ax.set(title=f"{title}\nstale {int((sel & stale).sum())}, mis {int((sel & mis).sum())}",
               xscale="symlog", xlim=(0, 1))
        ax.set_xscale("symlog", linthresh=1e-3)
        ax.set_xlabel("staleness-dominated cut", fontsize=8)
        ax.set_ylabel("mismatch-dominated cut", fontsize=8)
        ax.legend(fontsize=6)
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
