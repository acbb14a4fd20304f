"""Advantage estimators: hand-computed goldens, equal-reward groups, flat/grouped parity."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from entr_jax.advantages import AdvantageConfig, compute_advantages, normalize_batch

TOL = 1e-5
REWARDS = jnp.array([[1.0, 0.0, 0.0, 1.0], [0.1, 0.1, 0.1, 0.1], [3.0, 0.0, 0.0, 0.0]])


def test_grpo_golden():
    # row0: mean .5, deviations +-.5, unbiased std sqrt(1/3) = .577350 -> +-.866025
    # row1: equal rewards -> exactly 0
    # row2: mean .75, deviations [2.25, -.75 x3], ss = 5.0625 + 3 * .5625 = 6.75, std = sqrt(2.25) = 1.5
    #       -> [1.5, -.5, -.5, -.5]
    a = compute_advantages(REWARDS, AdvantageConfig(eps=0.0))
    np.testing.assert_allclose(a, [[0.866025, -0.866025, -0.866025, 0.866025], [0, 0, 0, 0], [1.5, -0.5, -0.5, -0.5]], atol=TOL)
    assert np.all(np.asarray(a[1]) == 0.0)
    # population std (ddof 0): row2 std = sqrt(6.75/4) = 1.299038 -> 2.25/1.299038 = 1.732051
    a0 = compute_advantages(REWARDS, AdvantageConfig(std_ddof=0, eps=0.0))
    assert abs(float(a0[2, 0]) - 1.732051) < TOL


def test_dr_grpo_and_rloo_goldens():
    # Dr.GRPO: R - mean. row2: [2.25, -.75, -.75, -.75]
    a = compute_advantages(REWARDS, AdvantageConfig(estimator="dr_grpo"))
    np.testing.assert_allclose(a[2], [2.25, -0.75, -0.75, -0.75], atol=TOL)
    # RLOO: R_i - mean of the others = 4/3 (R - mean): row2 [3 - 0, 0 - 1, 0 - 1, 0 - 1]
    r = compute_advantages(REWARDS, AdvantageConfig(estimator="rloo"))
    np.testing.assert_allclose(r[2], [3.0, -1.0, -1.0, -1.0], atol=TOL)
    np.testing.assert_allclose(r[0], [2 / 3, -2 / 3, -2 / 3, 2 / 3], atol=TOL)
    assert np.all(np.asarray(r[1]) == 0.0) and np.all(np.asarray(a[1]) == 0.0)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_equal_rewards_exactly_zero_never_nan(estimator):
    # 0.1 * 3 / 3 != 0.1 in floating point: a naive (R - mean)/(std + eps) is not 0 here
    for rewards in (jnp.full((2, 3), 0.1), jnp.full((1, 1), 5.0), jnp.full((2, 5), 1e-8)):
        a = compute_advantages(rewards, AdvantageConfig(estimator=estimator, eps=0.0, batch_normalize=True))
        assert np.all(np.asarray(a) == 0.0)


def test_flat_with_group_ids_matches_grouped():
    grouped = compute_advantages(REWARDS)
    # shuffled flat layout with arbitrary group labels
    perm = np.array([5, 0, 11, 2, 7, 9, 1, 3, 10, 4, 8, 6])
    flat = np.asarray(REWARDS).reshape(-1)[perm]
    gid = np.repeat(np.array([40, 3, 17]), 4)[perm]
    a = compute_advantages(jnp.asarray(flat), group_ids=jnp.asarray(gid))
    np.testing.assert_allclose(a, np.asarray(grouped).reshape(-1)[perm], atol=1e-6)
    # under jit with a static num_groups
    gid_dense = np.repeat(np.arange(3), 4)[perm]
    f = jax.jit(lambda r, g: compute_advantages(r, group_ids=g, num_groups=3))
    np.testing.assert_allclose(f(jnp.asarray(flat), jnp.asarray(gid_dense)), a, atol=1e-6)


def test_uneven_groups_and_singletons():
    # groups {0: [1, 3], 1: [2]}: RLOO group0 -> [1 - 3, 3 - 1] = [-2, 2]; singleton -> 0
    a = compute_advantages(jnp.array([1.0, 2.0, 3.0]), AdvantageConfig(estimator="rloo"), group_ids=jnp.array([0, 1, 0]))
    np.testing.assert_allclose(a, [-2.0, 0.0, 2.0], atol=TOL)
    g = compute_advantages(jnp.array([1.0, 2.0, 3.0]), group_ids=jnp.array([0, 1, 0]))
    assert float(g[1]) == 0.0 and np.all(np.isfinite(np.asarray(g)))


def test_batch_normalize_golden():
    # Dr.GRPO row0 [.5,-.5,-.5,.5], row2 [2.25,-.75,-.75,-.75], row1 zeros: batch mean 0
    # batch std sqrt((4*.25 + 5.0625 + 3*.5625)/12) = sqrt(7.75/12) = .803638
    a = compute_advantages(REWARDS, AdvantageConfig(estimator="dr_grpo", eps=0.0, batch_normalize=True))
    np.testing.assert_allclose(a[2, 0], 2.25 / 0.803638, rtol=1e-5)
    np.testing.assert_allclose(float(jnp.std(a)), 1.0, rtol=1e-5)
    assert np.all(np.asarray(normalize_batch(jnp.full((3,), 2.0))) == 0.0)


@pytest.mark.parametrize(
    "kwargs, field",
    [({"estimator": "ppo"}, "estimator"), ({"eps": -1.0}, "eps"), ({"std_ddof": 2}, "std_ddof")],
)
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AdvantageConfig(**kwargs)


def test_input_errors():
    with pytest.raises(ValueError, match="rewards"):
        compute_advantages(jnp.ones((4,)))
    with pytest.raises(ValueError, match="group_ids"):
        compute_advantages(jnp.ones((4,)), group_ids=jnp.zeros((3,), jnp.int32))
    with pytest.raises(ValueError, match="num_groups"):
        jax.jit(lambda r, g: compute_advantages(r, group_ids=g))(jnp.ones((4,)), jnp.zeros((4,), jnp.int32))
