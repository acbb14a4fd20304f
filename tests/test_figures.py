"""Figures a reader can read: each method its own colour and line style, legends rounded
and labelled (AUC, 95 % CI), fitted lines only over the bins they were fitted on, empty
panels saying "no data", and at least ~600 px wide."""

import re

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from entr_jax.objectives import OBJECTIVES  # noqa: E402
from experiments.analysis import decompose, decompose_plots, styles  # noqa: E402
from experiments.analysis import gate_curves as gc  # noqa: E402

DPI = 110  # what save_figure and write_figures save at


def tokens(n=4000, max_h=1.9, seed=0):
    """Synthetic decomposed tokens: drift grows with H, mismatch with (1-q)/q; no token
    has H >= ``max_h`` (the entropy bins above it are empty)."""
    rng = np.random.default_rng(seed)
    h = np.clip(rng.exponential(0.3, n), 0, max_h)
    stale = rng.normal(size=n) * np.sqrt(0.5 * h) * 0.3
    logp_mu = -rng.exponential(0.5, n)
    q = np.exp(logp_mu)
    mis = rng.normal(size=n) * 1e-3 * np.sqrt((1 - q) / np.maximum(q, 1e-6))
    z = np.zeros(n, np.int64)
    t = decompose.Decomposed(
        run=np.repeat(np.arange(4), n // 4), step=np.tile(np.repeat(np.arange(10), n // 40), 4),
        row=z, entropy_mu=h, entropy_pi=h, logp_mu=logp_mu, logp_pi=logp_mu + mis + stale,
        logp_version=logp_mu + mis, delta=mis + stale, delta_mis=mis, delta_stale=stale,
        age=np.ones(n, np.int64))
    d2 = t.delta.reshape(n // 100, 100)
    seq = {"trm": gc.score_trm(d2, np.ones_like(d2, bool)).ravel(), "m2po": gc.score_m2po(t.delta)}
    return t, seq


def texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_every_method_has_its_own_colour_and_line_style():
    methods = sorted(set(OBJECTIVES) - {"estr", "grpo"}) + ["grpo_async", "grpo_sync", "entr_rule"]
    drawn = {m: styles.method_style(m) for m in methods}
    colours = [d["color"] for d in drawn.values()]
    lines = [repr(d["linestyle"]) for d in drawn.values()]
    assert len(set(colours)) == len(methods) and len(set(lines)) == len(methods)
    assert styles.method_style("entr@2") == styles.method_style("entr")  # a tuned candidate
    assert styles.method_style("grpo sync") == styles.method_style("grpo_sync")
    assert styles.method_style("a_new_method")["color"] in styles._SPARE_COLOURS


def test_premise_figure_rounds_its_legend_and_fits_only_over_the_fitted_bins():
    t, _ = tokens()
    summary = {"premises": decompose.premise_fits(t),
               "bootstrap": {"slope_ci95": [0.651664998829944, 4.093045075233215],
                             "exponent_ci95": [1.6149858992421031, 1.7238859334903902]}}
    fig = decompose_plots.premise_figure(summary)
    ax1, ax2 = fig.axes
    labels = [ln.get_label() for ax in (ax1, ax2) for ln in ax.get_lines()]
    a, b = summary["premises"]["stale_vs_entropy"], summary["premises"]["mis_vs_q"]
    assert labels[1] == (f"fit a H + b: a = {a['slope']:.3g}, 95% CI [0.7, 4.1]")
    assert labels[3] == (f"fit c ((1-q)/q)^k, q < 0.999: k = "
                         f"{b['exponent']:.3g}, 95% CI [1.61, 1.72]")
    assert not any(re.search(r"\d\.\d{5,}", label) for label in labels)  # no long floats
    fit_a = ax1.get_lines()[1].get_xdata()
    bins_a = np.array(a["bins"]["x_mean"], float)
    assert (fit_a.min(), fit_a.max()) == pytest.approx((np.nanmin(bins_a), np.nanmax(bins_a)))
    fit_b = ax2.get_lines()[1].get_xdata()
    odds = np.array(b["odds"], float)
    fitted = odds[:-1][np.isfinite(odds[:-1]) & (np.array(b["bins"]["count"][:-1]) > 0)]
    assert (fit_b.min(), fit_b.max()) == pytest.approx((fitted.min(), fitted.max()))
    assert fit_b.min() > np.nanmin(odds)  # the last bin (q >= 0.999) was not fitted: not drawn over
    assert fig.get_size_inches()[0] * DPI >= 600
    plt.close(fig)


def test_gate_curves_label_the_auc_and_say_no_data_for_an_empty_bin():
    t, seq = tokens(max_h=1.9)
    fig = decompose_plots.gate_curve_figure(t, seq)
    assert fig.get_size_inches()[0] * DPI >= 600  # was 363 px wide
    curves = [ln for ln in fig.axes[0].get_lines() if re.fullmatch(r"\w+ \(AUC \d\.\d\d\)",
                                                                    ln.get_label())]
    assert [ln.get_label().split()[0] for ln in curves] == list(gc.GATES)
    # each gate drawn in its own style (all distinct: the test above)
    assert [ln.get_color() for ln in curves] == [styles.method_style(g)["color"] for g in gc.GATES]
    plt.close(fig)
    fig = decompose_plots.gate_curve_figure(t, seq, by_entropy=True)
    empty = [ax for ax in fig.axes if ax.get_title().startswith(("H in [2, ", "H in [3, "))]
    assert len(empty) == 2
    for ax in empty:  # no diagonal with every gate at "(0.50)": no curve, a note instead
        assert [tx.get_text() for tx in ax.texts] == ["no data (needs both kinds of token)"]
        assert not any("AUC" in ln.get_label() for ln in ax.get_lines())
    plt.close(fig)


def test_a_premise_panel_without_bins_says_no_data():
    empty = {"edges": [0.0], "count": [0], "x_mean": [float("nan")], "y_mean": [float("nan")]}
    summary = {"premises": {"stale_vs_entropy": {"bins": empty, "slope": float("nan"),
                                                 "intercept": float("nan")},
                            "mis_vs_q": {"bins": empty, "odds": [float("nan")],
                                         "exponent": float("nan"), "log_coef": float("nan")}},
               "bootstrap": {}}
    fig = decompose_plots.premise_figure(summary)
    assert texts(fig) == ["no data", "no data"]
    plt.close(fig)


def test_interval_digits_tell_the_ends_apart():
    assert styles.interval([0.0035420370503957545, 0.0041]) == "[0.00354, 0.00410]"
    assert styles.interval([-0.0057, -0.0003]) == "[-0.0057, -0.0003]"
    assert styles.interval(None) == "[n/a]" and styles.interval([float("nan"), 1.0]) == "[n/a]"
