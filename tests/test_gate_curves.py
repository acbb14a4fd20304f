"""Gate scores and curves of `experiments.analysis.gate_curves`, and the premise fits of
`experiments.analysis.decompose`, against the real gates and known answers."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from entr_jax.objectives import gates
from experiments.analysis import decompose
from experiments.analysis import gate_curves as gc

B, T = 6, 13


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    logp_mu = np.log(rng.uniform(1e-4, 1.0, (B, T))).astype(np.float32)
    delta = (rng.normal(0, 0.6, (B, T)) * rng.choice([0.05, 1.0, 3.0], (B, T))).astype(np.float32)
    logp_pi = np.minimum(logp_mu + delta, 0.0).astype(np.float32)
    entropy = rng.uniform(0, 3, (B, T)).astype(np.float32)
    mask = rng.random((B, T)) < 0.8
    return logp_pi, logp_mu, entropy, mask


def _agree(keep_score, keep_gate, score, theta, rtol=1e-5):
    """Decisions agree except within float rounding of the threshold."""
    near = np.abs(score - theta) <= rtol * max(abs(theta), 1e-12)
    assert np.array_equal(keep_score[~near], keep_gate[~near])


@pytest.mark.parametrize("theta", [0.3, 1.0, 4.0])
def test_entr_score_reproduces_the_entr_gate(theta):
    lp, lmu, h, _ = _inputs()
    d = lp - lmu
    s = gc.score_entr(d, h, eps=0.01)
    _agree(s <= theta, np.asarray(gates.entr_mask(jnp.asarray(d), jnp.asarray(h), theta, 0.01)), s, theta)


@pytest.mark.parametrize("c", [0.25, 1.0, 2.0])
def test_icepop_score_is_the_band_family_through_the_published_band(c):
    lp, lmu, _, _ = _inputs(1)
    d = lp - lmu
    s = gc.score_icepop(d)
    keep = np.asarray(gates.icepop_mask(jnp.asarray(d), 0.5 ** c, 5.0 ** c))
    _agree(s <= c, keep, s, c)


@pytest.mark.parametrize("phi", [0.01, 0.1, 2.0])
def test_kpop_score_reproduces_the_kpop_gate(phi):
    lp, lmu, _, _ = _inputs(2)
    s = gc.score_kpop(lp, lmu)
    _agree(s <= phi, np.asarray(gates.kpop_mask(jnp.asarray(lp), jnp.asarray(lmu), phi)), s, phi,
           rtol=1e-4)


@pytest.mark.parametrize("threshold", [0.01, 0.05, 0.5])
def test_trm_score_reproduces_the_trm_row_gate(threshold):
    lp, lmu, _, mask = _inputs(3)
    d = lp - lmu
    s = gc.score_trm(d, mask)
    keep = np.asarray(gates.trm_mask(jnp.asarray(d), jnp.asarray(mask), threshold))
    _agree((s <= threshold)[mask], keep[mask], s[mask], threshold)


@pytest.mark.parametrize("tau", [0.01, 0.04, 0.3, 2.0])
def test_m2po_score_reproduces_the_m2po_batch_gate(tau):
    lp, lmu, _, mask = _inputs(4)
    d = lp - lmu
    s = gc.score_m2po(d[mask])
    keep = np.asarray(gates.m2po_mask(jnp.asarray(d), jnp.asarray(mask), tau))[mask]
    _agree(s <= tau, keep, s, tau)
    assert 0 < keep.sum() < mask.sum() or tau >= 2.0


def test_curve_points_on_a_hand_example():
    # scores 5, 4, 4, 1, nan; classes stale (S) / mis (M): M, S, M, S, M
    score = np.array([5.0, 4.0, 4.0, 1.0, np.nan])
    mis = np.array([True, False, True, False, True])
    c = gc.curve("entr", score, ~mis, mis)
    np.testing.assert_array_equal(c.thresholds, [np.inf, 5.0, 4.0, 1.0, -np.inf])
    # a threshold cuts the scores above it; the NaN always: inf: 1 M; 5: the same; 4: + the
    # 5 (2 M); 1: + both 4s (1 S, 3 M); -inf: + the 1 (2 S)
    np.testing.assert_allclose(c.y, [1 / 3, 1 / 3, 2 / 3, 1.0, 1.0])
    np.testing.assert_allclose(c.x, [0.0, 0.0, 0.0, 0.5, 1.0])
    np.testing.assert_allclose(c.all, [0.2, 0.2, 0.4, 0.8, 1.0])
    assert c.at_threshold(4.5) == {"threshold": 4.5, "x": 0.0, "y": 2 / 3, "all": 0.4}
    assert c.at_threshold(4.0)["y"] == 2 / 3 and c.at_threshold(0.5)["all"] == 1.0
    assert c.y_at_x(0.0) == pytest.approx(2 / 3) and c.threshold_at_x(0.0) == 4.0
    assert c.all_at_y(1.0) == pytest.approx(0.8)
    # area of (0,0), (0,1/3), (0,1/3), (0,2/3), (.5,1), (1,1), (1,1): .5 (2/3 + 1)/2 + .5
    assert c.auc() == pytest.approx(0.5 * (2 / 3 + 1) / 2 + 0.5)



def test_matched_recall_table_reads_the_hand_example():
    score = np.array([5.0, 4.0, 4.0, 1.0, np.nan])
    mis = np.array([True, False, True, False, True])
    kp = gc.key_points(gc.curve("entr", score, ~mis, mis), ys=(0.5, 1.0))
    table = gc.matched_recall_table({"overall": {"entr": kp}}, ys=(0.5, 1.0))
    # recall 1/2 needs threshold 4 (2 of 3 M cut: 40 % of all); recall 1 needs 1 (80 %);
    # the default tau 1 cuts 1 S of 2, 3 M of 3, 4 of 5; no material table: "-"
    assert table.splitlines()[2] == "| entr | 0.917 | 40.00 / 80.00 | - | - | 50.00 / 100.00 / 80.00 |"

def _synthetic(n=60000, runs=4, a=1.3, k_true=1.0, seed=0):
    """Tokens whose drift has variance a H and whose mismatch has variance
    1e-3 ((1-q)/q)^k_true."""
    rng = np.random.default_rng(seed)
    h = rng.uniform(0, 3, n)
    q = np.exp(rng.uniform(np.log(1e-3), 0, n))
    d_stale = rng.normal(0, np.sqrt(a * h))
    d_mis = rng.normal(0, np.sqrt(1e-3 * ((1 - q) / q) ** k_true))
    lmu = np.log(q)
    lv = lmu + d_mis
    lp = lv + d_stale
    zeros = np.zeros(n)
    return decompose.Decomposed(
        run=rng.integers(0, runs, n), step=zeros.astype(np.int64), row=zeros.astype(np.int64),
        entropy_mu=h, entropy_pi=h, logp_mu=lmu, logp_pi=lp, logp_version=lv,
        delta=lp - lmu, delta_mis=d_mis, delta_stale=d_stale, age=np.ones(n, np.int64))


def test_premise_fits_recover_a_known_slope_and_exponent():
    t = _synthetic()
    f = decompose.premise_fits(t)
    assert f["stale_vs_entropy"]["slope"] == pytest.approx(1.3, rel=0.05)
    assert abs(f["stale_vs_entropy"]["intercept"]) < 0.05
    assert f["mis_vs_q"]["exponent"] == pytest.approx(1.0, abs=0.1)
    boot = decompose.bootstrap(t, n_boot=30)
    assert boot["unit"] == "run" and boot["units"] == 4
    lo, hi = boot["slope_ci95"]
    assert lo < 1.3 < hi and hi - lo < 0.3
    # a flat mismatch (exponent 0) is told apart from the paper's
    assert decompose.premise_fits(_synthetic(k_true=0.0))["mis_vs_q"]["exponent"] == pytest.approx(0.0, abs=0.1)


def test_entr_dominates_when_mismatch_sits_at_low_entropy():
    """Mismatch-dominated tokens at low entropy with moderate |delta|, drift at high
    entropy with larger |delta|: ENTR's curve is above IcePop's fixed band."""
    rng = np.random.default_rng(0)
    n = 4000
    low = rng.random(n) < 0.5
    h = np.where(low, rng.uniform(0, 0.05, n), rng.uniform(1, 3, n))
    d = np.where(low, rng.normal(0, 0.4, n), rng.normal(0, np.sqrt(h)))
    mis = low
    e = gc.curve("entr", gc.score_entr(d, h), ~mis, mis)
    i = gc.curve("icepop", gc.score_icepop(d), ~mis, mis)
    assert e.auc() > i.auc() + 0.2
    assert e.y_at_x(0.02) > i.y_at_x(0.02)
    assert math.isfinite(e.threshold_at_x(0.02))
