"""Learner token diagnostics (`learners.diagnostics`): hand-computed values."""

import jax.numpy as jnp
import numpy as np
import pytest

from entr_jax.logprobs import LOGP_OUTSIDE_KEPT
from entr_jax.types import Batch
from learners.diagnostics import finalize, token_sums


def _batch(logp_mu, entropy_mu, loss_mask, token_version=None):
    B, T = logp_mu.shape
    return Batch(
        tokens=jnp.zeros((B, T + 1), jnp.int32), attention_mask=jnp.ones((B, T + 1), bool),
        loss_mask=jnp.asarray(loss_mask), advantages=jnp.zeros((B, T), jnp.float32),
        logp_mu=jnp.asarray(logp_mu, jnp.float32), entropy_mu=jnp.asarray(entropy_mu, jnp.float32),
        token_version=jnp.zeros((B, T), jnp.int32) if token_version is None else jnp.asarray(token_version))


def test_one_filter_stand_in_token_moves_the_log_ratio_diagnostics_by_at_most_the_clip():
    # 1000 loss tokens with log(pi/mu) = 0, except one sampled token outside pi's kept set:
    # logp_pi = LOGP_OUTSIDE_KEPT = -1e4, logp_mu = -0.5, i.e. log(pi/mu) = -9999.5. Clipped to
    # -20 like k3 and the ESS: mean -20/1000 = -0.02 (unclipped: -9.9995), abs_max 20 (9999.5),
    # and E[delta^2] of its entropy bucket (H = 1.5 -> b3, 1000 tokens) 400/1000 (unclipped
    # 99990.0).
    logp_mu = jnp.full((1, 1000), -0.5)
    logp = logp_mu.at[0, 17].set(LOGP_OUTSIDE_KEPT)
    b = _batch(logp_mu, jnp.full((1, 1000), 1.5), jnp.ones((1, 1000), bool))
    m = finalize(*token_sums(logp, jnp.ones_like(logp), b, jnp.int32(0)))
    assert float(m["log_ratio_pi_mu/mean"]) == pytest.approx(-0.02, rel=1e-6)
    assert float(m["log_ratio_pi_mu/abs_max"]) == 20.0
    assert float(m["ratio_by_entropy/b3/delta_sq_mean"]) == pytest.approx(0.4, rel=1e-6)
    # k3 per token: exp(-20) - (-20) - 1 = 19 + 2e-9 on the one token
    assert float(m["kl_mu_pi/k3"]) == pytest.approx(19.0 / 1000, rel=1e-5)
    # sequence weight: the row's sum is clipped, exp(-20), alone in its ESS: 1
    assert float(m["ess/seq_fraction"]) == pytest.approx(1.0)
    np.testing.assert_allclose(float(m["ess/token_fraction"]), 999.0 ** 2 / (1000 * 999.0), rtol=1e-5)
