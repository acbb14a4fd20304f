"""Multiplicity in a study's report: Holm's step-down adjustment and the paired t p-value
against hand values and scipy, and the Bonferroni interval at level 1 - alpha / m."""

import math

import numpy as np
import pytest
from scipy import stats

from experiments.analysis.study_report import adjust_family, holm, p_value


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.03, 0.20 (m = 4): 0.04, 0.06, 0.06 (monotone), 0.20
    adj = holm({"a": 0.03, "b": 0.01, "c": 0.20, "d": 0.02, "e": float("nan")})
    assert adj["b"] == pytest.approx(0.04) and adj["d"] == pytest.approx(0.06)
    assert adj["a"] == pytest.approx(0.06) and adj["c"] == pytest.approx(0.20)
    assert math.isnan(adj["e"])
    assert holm({"a": 0.6, "b": 0.5}) == {"a": 1.0, "b": 1.0}   # capped at 1


def test_p_value_is_the_paired_t_test_and_bonferroni_widens_the_interval():
    d = np.array([0.3, -0.1, 0.4, 0.2, 0.25, 0.05])
    sd, n = float(d.std(ddof=1)), len(d)
    assert p_value(float(d.mean()), sd, n) == pytest.approx(stats.ttest_1samp(d, 0).pvalue)
    fam = {"x": {"mean": float(d.mean()), "sd": sd, "n": n},
           "y": {"mean": 0.0, "sd": 1.0, "n": 1}}   # one pair: no test, no interval
    adjust_family(fam)
    half = stats.t.ppf(1 - 0.05 / 2, n - 1) * sd / n ** 0.5   # m = 1 finite p: alpha / 1
    assert fam["x"]["ci_bonferroni"] == pytest.approx([d.mean() - half, d.mean() + half])
    assert fam["x"]["p_holm"] == pytest.approx(fam["x"]["p"])
    assert fam["y"]["ci_bonferroni"] is None and math.isnan(fam["y"]["p_holm"])
    fam2 = {k: {"mean": float(d.mean()), "sd": sd, "n": n} for k in "abc"}
    adjust_family(fam2)
    half3 = stats.t.ppf(1 - 0.05 / 6, n - 1) * sd / n ** 0.5   # m = 3
    assert fam2["a"]["ci_bonferroni"][1] - d.mean() == pytest.approx(half3)
