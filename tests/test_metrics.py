"""Token diagnostics: hand-computed values."""

import jax.numpy as jnp
import numpy as np

from entr_jax import metrics


def test_k3_kl_estimate_by_hand():
    d = jnp.array([[0.0, np.log(2.0), -np.log(2.0)], [5.0, 0.0, 0.0]], jnp.float32)
    mask = jnp.array([[True, True, True], [False, False, False]])
    # k3 = (r - 1) - log r: 0; 1 - ln2; -0.5 + ln2  -> mean = 0.5/3
    np.testing.assert_allclose(metrics.kl_mu_pi_k3(d, mask), 0.5 / 3, rtol=1e-6)
    assert float(metrics.kl_mu_pi_k3(d, jnp.zeros_like(mask))) == 0.0


def test_k3_is_finite_for_huge_and_nan_masked_inputs():
    d = jnp.array([[50.0, jnp.nan, -50.0]])
    mask = jnp.array([[True, False, True]])
    assert np.isfinite(float(metrics.kl_mu_pi_k3(d, mask)))


def test_ratio_by_entropy_bucket_by_hand():
    d = jnp.array([[0.1, 0.2, 1.0, 3.0]], jnp.float32)
    h = jnp.array([[0.05, 0.07, 1.5, 2.5]], jnp.float32)
    mask = jnp.array([[True, True, True, False]])
    out = metrics.ratio_by_entropy_bucket(d, h, mask)
    np.testing.assert_allclose(out["ratio_by_entropy/b0/delta_sq_mean"], (0.01 + 0.04) / 2, rtol=1e-6)
    assert float(out["ratio_by_entropy/b0/count"]) == 2
    assert float(out["ratio_by_entropy/b3/count"]) == 1  # [1, 2)
    np.testing.assert_allclose(out["ratio_by_entropy/b3/delta_sq_mean"], 1.0)
    assert float(out["ratio_by_entropy/b4/count"]) == 0  # the 2.5 token is masked


