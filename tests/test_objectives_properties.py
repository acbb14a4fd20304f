"""Properties of algorithms.md section 7 for every objective: on-policy reduction, gradient
isolation, exact zeros on masked tokens (NaN/inf inputs), finiteness, microbatch
additivity, jit parity, ENTR gate monotonicity, and gradients against naive references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from entr_jax import objectives as obj
from entr_jax.types import Batch

B, T = 6, 7
NAMES = [n for n in obj.OBJECTIVES if n != "estr"]
TOKEN_MEAN_ADDITIVE = ["entr", "grpo", "decoupled_ppo", "tis", "icepop", "kpop", "gspo", "cispo", "trm", "vespo"]
GATED = ["entr", "icepop", "kpop", "m2po", "trm"]


def make_batch(key, delta_scale=0.3, **over):
    ks = jax.random.split(key, 8)
    logp_mu = -jnp.abs(jax.random.normal(ks[0], (B, T))) - 0.1
    loss_mask = jax.random.uniform(ks[1], (B, T)) < 0.75
    loss_mask = loss_mask.at[:, 0].set(True)  # every row has a loss token
    fields = dict(
        tokens=jnp.zeros((B, T + 1), jnp.int32),
        attention_mask=jnp.ones((B, T + 1), bool),
        loss_mask=loss_mask,
        advantages=jax.random.normal(ks[2], (B, T)),
        logp_mu=logp_mu,
        entropy_mu=jnp.abs(jax.random.normal(ks[3], (B, T))) * 2.0,
        token_version=jnp.zeros((B, T), jnp.int32),
        logp_prox=logp_mu + 0.1 * jax.random.normal(ks[4], (B, T)),
        logp_ref=logp_mu + 0.1 * jax.random.normal(ks[5], (B, T)),
        num_loss_tokens=None,
    )
    fields.update(over)
    logp_pi = logp_mu + delta_scale * jax.random.normal(ks[6], (B, T))
    return logp_pi, Batch(**fields)


@pytest.fixture(scope="module")
def data():
    return make_batch(jax.random.PRNGKey(0))


@functools.lru_cache(maxsize=None)
def _vg(name, cfg_items):
    f = obj.make_objective(name, **dict(cfg_items))
    return jax.jit(jax.value_and_grad(f, has_aux=True))


def vg(name, **cfg):
    """Jitted value-and-grad of an objective, shared across tests (one compile per shape)."""
    return _vg(name, tuple(sorted(cfg.items())))


def agg_weight(mode, loss_mask, num):
    """Per-token weight of each aggregation mode (d loss / d l_{i,t})."""
    m = np.asarray(loss_mask, np.float64)
    seq = m.sum(1, keepdims=True)
    g = (seq[:, 0] > 0).sum()
    if mode == "token_mean":
        return m / num
    if mode == "token_mean_kept":
        return m / m.sum()
    if mode == "seq_mean_token_mean":
        return m / np.maximum(seq, 1) / g
    return m / (g * m.shape[1])


@pytest.mark.parametrize("name", NAMES)
def test_on_policy_reduction(name, data):
    # pi == mu == prox: every gate keeps every token, every weight is 1, every ratio 1, so
    # d loss / d logp_pi = -A * (aggregation weight): the on-policy policy gradient.
    _, b = data
    b = b.replace(logp_prox=b.logp_mu, logp_ref=None)
    _, g = vg(name)(b.logp_mu, b)
    mode = obj.OBJECTIVES[name][1]().aggregation
    expected = -np.asarray(b.advantages) * agg_weight(mode, b.loss_mask, float(np.asarray(b.loss_mask).sum()))
    np.testing.assert_allclose(np.asarray(g), expected, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_gradient_isolation(name, data):
    # No gradient flows into logp_mu, entropy_mu, logp_prox, logp_ref or advantages.
    lp, b = data
    kw = {"kl_coef": 0.1} if name == "grpo" else {}
    f = obj.make_objective(name, **kw)

    def loss_of(mu, ent, prox, ref, adv):
        return f(lp, b.replace(logp_mu=mu, entropy_mu=ent, logp_prox=prox, logp_ref=ref, advantages=adv))[0]

    grads = jax.jit(jax.grad(loss_of, argnums=(0, 1, 2, 3, 4)))(b.logp_mu, b.entropy_mu, b.logp_prox, b.logp_ref, b.advantages)
    for g in grads:
        assert np.all(np.asarray(g) == 0.0)


@pytest.mark.parametrize("name", NAMES)
def test_masked_tokens_exact_zero_grad_with_nonfinite_inputs(name, data):
    lp, b = data
    off = ~b.loss_mask
    bad = jnp.where(jnp.arange(B * T).reshape(B, T) % 2 == 0, jnp.nan, jnp.inf)
    poison = lambda x: jnp.where(off, bad, x)  # noqa: E731
    b2 = b.replace(logp_mu=poison(b.logp_mu), entropy_mu=poison(b.entropy_mu), logp_prox=poison(b.logp_prox),
                   logp_ref=poison(b.logp_ref), advantages=poison(b.advantages))
    kw = {"kl_coef": 0.1} if name == "grpo" else {}
    (loss, metrics), g = vg(name, **kw)(poison(lp), b2)
    (loss_ref, _), g_ref = vg(name, **kw)(lp, b)
    assert np.isfinite(float(loss)) and all(np.isfinite(float(v)) for v in metrics.values())
    assert np.all(np.asarray(g)[np.asarray(off)] == 0.0)
    # the poisoned padding changes nothing at all
    np.testing.assert_allclose(float(loss), float(loss_ref), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), atol=1e-7)


@pytest.mark.parametrize("name", GATED)
@pytest.mark.parametrize("bad", [jnp.nan, -jnp.inf])
def test_gate_rejects_nonfinite_loss_token_with_exact_zero_grad(name, bad, data):
    # a loss token whose behavior log-prob is NaN/-inf is rejected by the gate, contributes
    # exactly zero gradient and leaves the loss finite
    lp, b = data
    b2 = b.replace(logp_mu=b.logp_mu.at[2, 0].set(bad), logp_prox=None)
    (loss, _), g = vg(name)(lp, b2)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(g)))
    assert float(g[2, 0]) == 0.0


# Settings whose bands are wide enough to keep a log-ratio of +-20, the value a +-inf
# log-prob becomes after the clip of every log-ratio: a gate that checked finiteness
# after the clip (or not at all) kept such a token, with weight e^20 (decoupled PPO at its
# defaults). (name, config, the inputs to poison)
WIDE_GATES = [
    pytest.param("entr", {"tau": 50.0}, ("logp_mu", "logp_pi"), id="entr"),
    pytest.param("icepop", {"alpha": 1e-9, "beta": 1e9, "aggregation": "token_mean"},
                 ("logp_mu", "logp_pi"), id="icepop"),
    pytest.param("icepop", {"alpha": 1e-9, "beta": 1e9, "aggregation": "token_mean",
                            "ratio_mode": "decoupled"}, ("logp_mu", "logp_prox"), id="icepop_decoupled"),
    pytest.param("kpop", {"phi": 1e9}, ("logp_mu", "logp_pi"), id="kpop"),
    pytest.param("m2po", {"tau": 200.0}, ("logp_mu", "logp_pi"), id="m2po"),
    pytest.param("decoupled_ppo", {}, ("logp_mu", "logp_prox"), id="decoupled_ppo"),
]


@pytest.mark.parametrize("name,cfg,fields", WIDE_GATES)
@pytest.mark.parametrize("bad", [jnp.nan, -jnp.inf, jnp.inf])
def test_wide_gate_rejects_nonfinite_input_before_the_clip(name, cfg, fields, bad, data):
    # One loss token gets a non-finite input. It must be rejected at any setting: the
    # loss, the gradient and the kept count equal those of the batch without that token
    # (its row and the token-mean denominator N unchanged), and it is counted as rejected.
    lp, b = data
    mask = np.asarray(b.loss_mask)
    i = int(np.argmax(mask.sum(1) >= 2))  # a row with another loss token
    t = int(np.flatnonzero(mask[i])[-1])
    n = jnp.sum(b.loss_mask, dtype=jnp.float32)
    # entropy 10 at the token: ENTR's band there is |delta| <= 22.4 at tau 50, wider than 20
    b = b.replace(num_loss_tokens=n, logp_ref=None, entropy_mu=b.entropy_mu.at[i, t].set(10.0))
    ref = b.replace(loss_mask=b.loss_mask.at[i, t].set(False))
    (loss_ref, m_ref), g_ref = vg(name, **cfg)(lp, ref)
    for field in fields:
        if field == "logp_pi":
            lp_bad, b_bad = lp.at[i, t].set(bad), b
        else:
            lp_bad, b_bad = lp, b.replace(**{field: getattr(b, field).at[i, t].set(bad)})
        (loss, m), g = vg(name, **cfg)(lp_bad, b_bad)
        assert float(g[i, t]) == 0.0, field
        np.testing.assert_allclose(float(loss), float(loss_ref), rtol=1e-6, err_msg=field)
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), atol=1e-7, err_msg=field)
        assert float(m["tokens/kept"]) == float(m_ref["tokens/kept"]), field
        rejected = float(m["mask/fraction"]) * float(n)
        rejected_ref = float(m_ref["mask/fraction"]) * (float(n) - 1.0)
        assert abs(rejected - (rejected_ref + 1.0)) < 1e-4, field


def test_public_gates_reject_nonfinite_inputs_at_any_band():
    # raw log-ratios +inf, -inf, NaN and a finite 19 (kept by these wide bands)
    raw = jnp.array([[jnp.inf, -jnp.inf, jnp.nan, 19.0]])
    h = jnp.full(raw.shape, 10.0)
    np.testing.assert_array_equal(np.asarray(obj.entr_mask(raw, h, 50.0, 0.01)), [[False, False, False, True]])
    np.testing.assert_array_equal(np.asarray(obj.icepop_mask(raw, 1e-9, 1e9)), [[False, False, False, True]])
    everything = jnp.ones(raw.shape, bool)
    np.testing.assert_array_equal(np.asarray(obj.m2po_mask(raw, everything, 400.0)), [[False, False, False, True]])
    lt = jnp.array([[-0.5, -0.5, -0.5, -jnp.inf, -0.5]])
    li = jnp.array([[-jnp.inf, jnp.nan, -30.0, -0.5, -0.5]])
    np.testing.assert_array_equal(np.asarray(obj.kpop_mask(lt, li, 1e9)), [[False, False, True, False, True]])


def test_entr_rejects_nan_entropy_with_exact_zero_grad(data):
    lp, b = data
    (loss, _), g = vg("entr")(lp, b.replace(entropy_mu=b.entropy_mu.at[1, 0].set(jnp.nan)))
    assert np.isfinite(float(loss)) and float(g[1, 0]) == 0.0


@pytest.mark.parametrize("name", NAMES)
def test_finite_at_extreme_log_ratios_and_zero_entropy(name, data):
    _, b = data
    sign = jnp.where(jnp.arange(B * T).reshape(B, T) % 2 == 0, 50.0, -50.0)
    b2 = b.replace(entropy_mu=jnp.zeros((B, T)), logp_prox=b.logp_mu + sign / 2)
    (loss, metrics), g = vg(name)(b.logp_mu + sign, b2)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(g)))
    assert all(np.isfinite(float(v)) for v in metrics.values()), metrics


@pytest.mark.parametrize("name", TOKEN_MEAN_ADDITIVE)
def test_microbatch_halves_sum_to_full_batch(name, data):
    lp, b = data
    f = vg(name, aggregation="token_mean")
    n = jnp.sum(b.loss_mask, dtype=jnp.float32)
    b = b.replace(num_loss_tokens=n)
    (full, _), g_full = f(lp, b)
    halves = [jax.tree_util.tree_map(lambda x, s=s: x[s] if x.ndim else x, b) for s in (slice(0, 3), slice(3, 6))]
    (l1, _), g1 = f(lp[:3], halves[0])
    (l2, _), g2 = f(lp[3:], halves[1])
    np.testing.assert_allclose(float(l1 + l2), float(full), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.concatenate([g1, g2]), np.asarray(g_full), atol=1e-7)


@pytest.mark.parametrize("name", ["entr", "grpo", "kpop", "m2po", "sat"])
def test_jit_equals_no_jit(name, data):
    lp, b = data
    f = obj.make_objective(name)
    (l0, m0), g0 = jax.value_and_grad(f, has_aux=True)(lp, b)
    (l1, m1), g1 = jax.jit(jax.value_and_grad(f, has_aux=True))(lp, b)
    np.testing.assert_allclose(float(l0), float(l1), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g0), np.asarray(g1), atol=1e-7)
    for k in m0:
        np.testing.assert_allclose(float(m0[k]), float(m1[k]), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- ENTR gate properties


def test_entr_mask_properties():
    x = jnp.linspace(0.013, 3.013, 31)
    d = jnp.concatenate([-x[::-1], x])[None, :]  # [1, 62], exactly sign-symmetric
    for h in (0.0, 0.05, 0.5, 1.0, 3.0):
        m = np.asarray(obj.entr_mask(d, jnp.full(d.shape, h), 1.0, 0.01))[0]
        np.testing.assert_array_equal(m, m[::-1])  # symmetric in the sign of delta
        pos = m[31:]  # |delta| increasing
        assert pos.any() and not pos.all()
        assert np.all(np.diff(pos.astype(int)) <= 0)  # non-increasing in |delta|
    hs = jnp.linspace(0.0, 5.0, 51)[:, None]
    for dv in (0.05, 0.5, 1.0, 2.0):
        m = np.asarray(obj.entr_mask(jnp.full(hs.shape, dv), hs, 1.0, 0.01))[:, 0]
        assert np.all(np.diff(m.astype(int)) >= 0)  # non-decreasing in the entropy
        assert m[-1] and (dv < 0.1 or not m[0])


def test_entr_mask_independent_of_advantage_sign():
    lp, b = make_batch(jax.random.PRNGKey(1), delta_scale=1.5)
    f = jax.jit(obj.make_objective("entr"))
    m_pos = f(lp, b)[1]["mask/fraction"]
    m_neg = f(lp, b.replace(advantages=-b.advantages))[1]["mask/fraction"]
    assert float(m_pos) == float(m_neg) and 0.0 < float(m_pos) < 1.0


def test_entr_constant_entropy_is_fixed_gate():
    # H + eps == C -> keep iff |delta| <= sqrt(tau C); tau 2, C .5 -> band 1
    d = jnp.array([[-1.2, -0.99, -0.3, 0.0, 0.5, 0.999, 1.01, 3.0]])
    m = obj.entr_mask(d, jnp.full(d.shape, 0.5 - 0.01), 2.0, 0.01)
    np.testing.assert_array_equal(m, np.abs(np.asarray(d)) <= 1.0)


# ---------------------------------------------------------------- naive references


def naive_entr(lp, mu, h, adv, mask, tau=1.0, eps=0.01, lo=0.2, hi=0.28):
    delta = jax.lax.stop_gradient(lp - mu)
    keep = (delta**2 / (h + eps) <= tau) * mask
    r = jnp.exp(lp - mu)
    surr = jnp.minimum(r * adv, jnp.clip(r, 1 - lo, 1 + hi) * adv)
    return -jnp.sum(keep * surr) / jnp.sum(mask)


def naive_grpo_seq(lp, mu, adv, mask, eps=0.2):
    r = jnp.exp(lp - mu)
    surr = jnp.minimum(r * adv, jnp.clip(r, 1 - eps, 1 + eps) * adv) * mask
    return -jnp.mean(jnp.sum(surr, axis=1) / jnp.sum(mask, axis=1))


def naive_cispo(lp, mu, adv, mask, hi=0.3):
    w = jax.lax.stop_gradient(jnp.minimum(jnp.exp(lp - mu), 1 + hi))
    return -jnp.sum(w * adv * lp * mask) / jnp.sum(mask)


def naive_gspo_seq(lp, mu, adv, mask, lo=3e-4, hi=4e-4):
    # sequence-level GSPO with the per-sequence advantage (first token of each row)
    s = jnp.exp(jnp.sum((lp - mu) * mask, axis=1) / jnp.sum(mask, axis=1))
    a = adv[:, 0]
    return -jnp.mean(jnp.minimum(s * a, jnp.clip(s, 1 - lo, 1 + hi) * a))


def naive_tis_token(lp, mu, prox, adv, mask, cap=2.0, eps=0.2):
    w = jnp.minimum(jnp.exp(prox - mu), cap)
    u = jnp.exp(lp - prox)
    surr = jnp.minimum(u * adv, jnp.clip(u, 1 - eps, 1 + eps) * adv)
    return -jnp.sum(w * surr * mask) / jnp.sum(mask)


def test_gradients_match_naive_references():
    lp, b = make_batch(jax.random.PRNGKey(3), delta_scale=0.5)
    mask = b.loss_mask.astype(jnp.float32)
    mu, adv = b.logp_mu, b.advantages
    row_adv = jnp.broadcast_to(adv[:, :1], (B, T))
    cases = [
        ("entr", {}, b, lambda x: naive_entr(x, mu, b.entropy_mu, adv, mask)),
        ("grpo", {}, b, lambda x: naive_grpo_seq(x, mu, adv, mask)),
        ("cispo", {}, b, lambda x: naive_cispo(x, mu, adv, mask)),
        ("gspo", {"clip_low": 0.05, "clip_high": 0.05}, b.replace(advantages=row_adv),
         lambda x: naive_gspo_seq(x, mu, row_adv, mask, 0.05, 0.05)),
        ("tis", {}, b, lambda x: naive_tis_token(x, mu, b.logp_prox, adv, mask)),
    ]
    for name, kw, batch, ref in cases:
        f = obj.make_objective(name, **kw)
        (loss, _), g = jax.jit(jax.value_and_grad(f, has_aux=True))(lp, batch)
        l_ref, g_ref = jax.value_and_grad(ref)(lp)
        np.testing.assert_allclose(float(loss), float(l_ref), rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), atol=1e-6, err_msg=name)
        assert np.abs(np.asarray(g)).sum() > 0, name
