"""Batch-level statistics (M2PO's sort, SAT's quantile) are global when the batch is sharded
over 8 fake devices: sharded results equal unsharded ones."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from entr_jax import objectives as obj
from entr_jax.types import Batch

B, T = 8, 7


@pytest.fixture(scope="module", params=["explicit", "auto"])
def setup(request):
    if jax.device_count() < 8:
        pytest.skip("needs 8 (fake) devices")
    axis_type = AxisType.Explicit if request.param == "explicit" else AxisType.Auto
    mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
    row = NamedSharding(mesh, P("data", None))
    ks = jax.random.split(jax.random.PRNGKey(7), 5)
    logp_mu = -jnp.abs(jax.random.normal(ks[0], (B, T))) - 0.1
    # rows differ strongly in their log-ratio scale, so a per-shard statistic would differ
    scale = jnp.linspace(0.02, 1.0, B)[:, None]
    lp = logp_mu + scale * jax.random.normal(ks[1], (B, T))
    b = Batch(
        tokens=jnp.zeros((B, T + 1), jnp.int32),
        attention_mask=jnp.ones((B, T + 1), bool),
        loss_mask=jax.random.uniform(ks[2], (B, T)) < 0.8,
        advantages=jax.random.normal(ks[3], (B, T)),
        logp_mu=logp_mu,
        entropy_mu=jnp.ones((B, T)),
        token_version=jnp.zeros((B, T), jnp.int32),
        num_loss_tokens=None,
    )
    shard = lambda x: jax.device_put(x, row) if x.ndim == 2 else x  # noqa: E731
    return lp, b, jax.device_put(lp, row), jax.tree_util.tree_map(shard, b)


@pytest.mark.parametrize("name", ["m2po", "sat", "entr"])
def test_sharded_objective_equals_unsharded(name, setup):
    lp, b, lp_s, b_s = setup
    f = jax.jit(jax.value_and_grad(obj.make_objective(name), has_aux=True))
    (l0, m0), g0 = f(lp, b)
    (l1, m1), g1 = f(lp_s, b_s)
    assert len(g1.sharding.device_set) == 8
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g1), np.asarray(g0), atol=1e-7)
    for k in m0:
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-6, atol=1e-7, err_msg=k)
    if name == "m2po":
        assert 0.0 < float(m0["mask/fraction"]) < 1.0  # the batch-level gate is active
    if name == "sat":
        assert float(m0["sat/frac_contracted"]) > 0.0


def test_sharded_gates_equal_unsharded(setup):
    lp, b, lp_s, b_s = setup
    d, d_s = lp - b.logp_mu, lp_s - b_s.logp_mu
    m2 = jax.jit(obj.m2po_mask, static_argnums=2)
    np.testing.assert_array_equal(np.asarray(m2(d_s, b_s.loss_mask, 0.04)), np.asarray(m2(d, b.loss_mask, 0.04)))
    sf = jax.jit(obj.sat_clip_factors)
    (cl_s, ch_s, con_s), (cl, ch, con) = sf(d_s, b_s.loss_mask), sf(d, b.loss_mask)
    np.testing.assert_array_equal(np.asarray(con_s), np.asarray(con))
    np.testing.assert_allclose(np.asarray(cl_s), np.asarray(cl), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ch_s), np.asarray(ch), rtol=1e-6)
    # a per-shard quantile would differ: the shard of row 0 alone has a much smaller one
    q_global = float(obj.sat_quantile(d, b.loss_mask, 0.9))
    q_row0 = float(obj.sat_quantile(d[:1], b.loss_mask[:1], 0.9))
    assert q_row0 < 0.5 * q_global
