"""The one-pass metrics of the objectives (`common.base_metrics`, `common.stacked_sums`)
equal their separate forms. What they cost (reductions, flops, bytes) is reported by
benchmarks/objectives.py, not asserted here."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from entr_jax import objectives as obj
from entr_jax.objectives import common as c
from entr_jax.objectives.entr import EntrConfig, _keep
from entr_jax.types import Batch

B, T = 6, 7


@pytest.fixture(scope="module")
def case():
    """A batch with NaN/inf in every input, on and off the loss mask."""
    k = jax.random.split(jax.random.PRNGKey(3), 6)
    logp_mu = -jnp.abs(jax.random.normal(k[0], (B, T)))
    logp_pi = logp_mu + 0.8 * jax.random.normal(k[1], (B, T))
    logp_pi = logp_pi.at[0, 0].set(jnp.nan).at[1, 1].set(-jnp.inf).at[5, 6].set(jnp.inf)
    entropy = jnp.abs(jax.random.normal(k[2], (B, T)))
    entropy = entropy.at[0, 2].set(jnp.nan).at[2, 3].set(jnp.inf).at[3, 3].set(-1e-7)
    loss_mask = (jax.random.uniform(k[3], (B, T)) < 0.85).at[0, 0].set(True).at[0, 2].set(True).at[5, 6].set(False)
    batch = Batch(
        tokens=jnp.zeros((B, T + 1), jnp.int32), attention_mask=jnp.ones((B, T + 1), bool),
        loss_mask=loss_mask, advantages=jax.random.normal(k[4], (B, T)),
        logp_mu=logp_mu.at[4, 4].set(jnp.nan), entropy_mu=entropy,
        token_version=jnp.zeros((B, T), jnp.int32))
    return logp_pi, batch


def test_one_pass_metrics_equal_their_separate_forms_exactly(case):
    logp_pi, batch = case
    cfg = EntrConfig()

    def separate(lp, b):
        inp = c.read_inputs(lp, b, sanitize=False)
        keep, delta, entropy = _keep(inp, cfg)
        r = jnp.exp(c.log_ratio(c.sg(inp.logp_pi), inp.logp_mu))
        lp_g, lmu_g, adv = c.gate(keep, inp.logp_pi, inp.logp_mu, inp.advantages)
        _, lo, hi = c.ppo_clip_loss(c.ratio(lp_g, lmu_g), adv, 0.8, 1.28)
        lm = inp.loss_mask
        return {
            "mask/fraction": c.fraction(~keep, lm),
            "ratio_pi_mu/mean": c.masked_mean(r, lm),
            "ratio_pi_mu/max": c.masked_max(r, lm),
            "clip/frac_low": c.fraction(lo & keep, lm),
            "clip/frac_high": c.fraction(hi & keep, lm),
            "entr/score_mean": c.masked_mean(obj.entr_score(delta, entropy, cfg.eps), lm),
        }

    ref = jax.jit(separate)(logp_pi, batch)
    _, got = jax.jit(obj.make_objective("entr"))(logp_pi, batch)
    # the case exercises every branch: rejected tokens, both clips, non-finite ratio and score
    assert 0 < float(ref["mask/fraction"]) < 1 and float(ref["clip/frac_high"]) > 0
    for key, value in ref.items():
        if key == "entr/score_mean":  # its sum is a row of the stacked pass: same value up to
            # the order of the float additions (`common.stacked_sums`)
            assert float(got[key]) == pytest.approx(float(value), rel=4e-7), key
        else:
            assert float(got[key]) == float(value), (key, float(got[key]), float(value))
    # the score's finite tokens are counted without reading S: NaN entropy and NaN/inf-inf
    # log-ratios are excluded, +inf entropy (S = 0) and -inf log-probs (|d| = 20) are kept
    inp = c.read_inputs(logp_pi, batch, sanitize=False)
    _, delta, entropy = _keep(inp, cfg)
    s = obj.entr_score(delta, entropy, cfg.eps)
    np.testing.assert_array_equal(np.isfinite(np.asarray(s)), ~np.isnan(np.asarray(delta)) & ~np.isnan(np.asarray(entropy)))


def test_stacked_sums_equal_each_rows_sum():
    flags = {"a": jnp.array([[True, False, True]]), "b": jnp.array([[False, False, False]]),
             "c": jnp.ones((1, 3), bool)}
    got = c.stacked_sums(flags)
    assert list(got) == ["a", "b", "c"]
    np.testing.assert_array_equal([float(got[k]) for k in got], [2.0, 0.0, 3.0])
    # counts are exact; a float row is its sum up to the order of the float additions, which
    # neither form fixes (at [16, 64] the stacked and the separate f32 sums differ in the
    # last bit on XLA:CPU, at [6, 7] they agree): both within a few ulp of the f64 sum
    for i, shape in enumerate([(6, 7), (16, 64), (3, 333), (16, 2048)]):
        k = jax.random.split(jax.random.PRNGKey(i), 2)
        x = 3.0 * jax.random.normal(k[0], shape) ** 2
        m = jax.random.uniform(k[1], shape) < 0.8
        rows = [m, jnp.where(m, x, 0.0), jnp.where(~m, -x, 0.0), ~m]
        named = jax.jit(c.stacked_sums)({str(j): row for j, row in enumerate(rows)})
        got = [float(named[str(j)]) for j in range(4)]
        assert got[0] == int(np.sum(np.asarray(m))) and got[3] == int(np.sum(~np.asarray(m)))
        for row, value in zip(rows[1:3], got[1:3]):
            exact = float(np.sum(np.asarray(row, np.float64)))
            assert abs(float(value) - exact) <= 4e-7 * abs(exact), (shape, float(value), exact)
