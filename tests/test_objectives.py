"""Hand-computed golden numbers for every objective and gate, registry and config checks.

Arithmetic is written next to each expectation; ln/exp values to 6 decimals.
"""

import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from entr_jax import objectives as obj

TOL = 1e-5


def ns(logp_mu, advantages, loss_mask=None, **kw):
    logp_mu = jnp.asarray(logp_mu, jnp.float32)
    if loss_mask is None:
        loss_mask = jnp.ones(logp_mu.shape, bool)
    return types.SimpleNamespace(
        logp_mu=logp_mu,
        advantages=jnp.asarray(advantages, jnp.float32),
        loss_mask=jnp.asarray(loss_mask, bool),
        entropy_mu=kw.pop("entropy_mu", None),
        logp_prox=kw.pop("logp_prox", None),
        logp_ref=kw.pop("logp_ref", None),
        num_loss_tokens=kw.pop("num_loss_tokens", None),
        **kw,
    )


def value_grad(name, logp_pi, batch, **cfg):
    f = obj.make_objective(name, **cfg)
    vg = jax.jit(jax.value_and_grad(lambda x: f(x, batch), has_aux=True))
    (loss, metrics), g = vg(jnp.asarray(logp_pi, jnp.float32))
    return float(loss), {k: float(v) for k, v in metrics.items()}, np.asarray(g)


# ---------------------------------------------------------------- gates


def test_entr_mask_worked_case():
    # algorithms.md 7.5: H = 1, eps = 0.01: delta 0.9 -> S = 0.81/1.01 = 0.80 (kept),
    # delta 1.1 -> S = 1.21/1.01 = 1.198 (masked) at tau = 1.
    d = jnp.array([[0.9, 1.1, -0.9, -1.1]])
    h = jnp.ones((1, 4))
    np.testing.assert_allclose(obj.entr_score(d, h, 0.01), [[0.801980, 1.198020, 0.801980, 1.198020]], atol=TOL)
    np.testing.assert_array_equal(obj.entr_mask(d, h, 1.0, 0.01), [[True, False, True, False]])


def test_gates_switched_off_keep_every_finite_token():
    # the "off" value of each gate (a study's grid includes it): tau = inf, the IcePop band
    # [0, inf], phi = inf keep every finite token, also at H + eps = 0 (inf * 0 is NaN) and
    # at log-ratios past the +-20 clip; non-finite tokens stay masked
    d = jnp.array([[0.0, 25.0, -25.0, 3.0, jnp.nan]])
    h = jnp.array([[0.0, 0.0, 1.0, 2.0, 1.0]])
    np.testing.assert_array_equal(obj.entr_mask(d, h, math.inf, 0.0), [[True] * 4 + [False]])
    np.testing.assert_array_equal(obj.icepop_mask(d, 0.0, math.inf), [[True] * 4 + [False]])
    lp = jnp.array([[-30.0, 0.0, -1e-9, -2.0, jnp.nan]])
    lq = jnp.array([[0.0, -30.0, -5.0, -2.0, -1.0]])
    np.testing.assert_array_equal(obj.kpop_mask(lp, lq, math.inf), [[True] * 4 + [False]])
    # so ENTR with tau = inf is its PPO clip alone: the same loss and gradient as GRPO with
    # the same clip band and aggregation
    rng = np.random.default_rng(0)
    logp_mu = -rng.uniform(0.01, 3.0, (2, 6))
    batch = ns(logp_mu, rng.normal(size=(2, 6)), entropy_mu=jnp.asarray(rng.uniform(0, 2, (2, 6)), jnp.float32))
    logp_pi = logp_mu + rng.normal(0, 0.5, (2, 6))
    base = dict(aggregation="token_mean", clip_low=0.2, clip_high=0.28)
    loss_e, _, g_e = value_grad("entr", logp_pi, batch, tau=math.inf, **base)
    loss_g, _, g_g = value_grad("grpo", logp_pi, batch, kl_coef=0.0, **base)
    assert loss_e == pytest.approx(loss_g, abs=1e-6)
    np.testing.assert_allclose(g_e, g_g, atol=1e-6)


def test_entr_mask_low_entropy_and_nan():
    # H = 0: band |delta| <= sqrt(tau * eps) = 0.1. H = -1e-7 (rounding) clamps to 0.
    d = jnp.array([[0.09, 0.11, 0.0, 0.05, jnp.nan, 0.0]])
    h = jnp.array([[0.0, 0.0, 0.0, -1e-7, 1.0, jnp.nan]])
    np.testing.assert_array_equal(obj.entr_mask(d, h, 1.0, 0.01), [[True, False, True, True, False, False]])
    # eps = 0 and H = 0: delta = 0 is kept, never 0/0.
    np.testing.assert_array_equal(obj.entr_mask(jnp.zeros((1, 2)), jnp.zeros((1, 2)), 1.0, 0.0), [[True, True]])


def test_icepop_mask():
    # k = exp(d) = [0.4, 0.5, 1, 5, 6]: band [0.5, 5] keeps the middle three (boundaries in).
    d = jnp.log(jnp.array([[0.4, 0.5001, 1.0, 4.999, 6.0]]))
    np.testing.assert_array_equal(obj.icepop_mask(d, 0.5, 5.0), [[False, True, True, True, False]])


def test_binary_kl_goldens():
    # D(0.1||0.9) = 0.1 ln(1/9) + 0.9 ln 9 = 0.8 * 2.197225 = 1.757780
    # D(0.5||0.999) = 0.5 ln(0.5/0.999) + 0.5 ln(0.5/0.001) = 0.5(-0.692147 + 6.214608) = 2.761231
    # D(0.999||0.5) = 0.999 * 0.692147 + 0.001 ln(0.002) = 0.691455 - 0.006215 = 0.685240
    # D(1||0.5) = ln 2 = 0.693147 (0 log 0 = 0); D(0.5||1) = inf
    lp = jnp.log(jnp.array([[0.1, 0.5, 0.999, 1.0, 0.5]]))
    lq = jnp.log(jnp.array([[0.9, 0.999, 0.5, 0.5, 1.0]]))
    kl = np.asarray(obj.binary_kl(lp, lq))
    np.testing.assert_allclose(kl[0, :4], [1.757780, 2.761231, 0.685240, 0.693147], rtol=2e-4)
    assert kl[0, 4] == np.inf


def test_kpop_mask_bidirectional():
    # (p, q): (0.5, 0.5) D=0 keep; (0.1, 0.9) both 1.757780 <= 2 keep;
    # (0.5, 0.999) forward 2.761 > 2 reject; (0.999, 0.5) reverse 2.761 > 2 reject.
    p = jnp.log(jnp.array([[0.5, 0.1, 0.5, 0.999]]))
    q = jnp.log(jnp.array([[0.5, 0.9, 0.999, 0.5]]))
    np.testing.assert_array_equal(obj.kpop_mask(p, q, 2.0), [[True, True, False, False]])
    np.testing.assert_array_equal(obj.kpop_mask(p, q, 3.0), [[True, True, True, True]])


def test_m2po_mask_goldens():
    # squares [.25, .01, .01, 0, .09]; mean .072 > .04; drop .25 -> .11/4 = .0275 <= .04.
    lr = jnp.array([[0.5, 0.1, -0.1, 0.0, 0.3, 9.0]])
    m = jnp.array([[True] * 5 + [False]])  # the padded 9.0 is ignored
    np.testing.assert_array_equal(obj.m2po_mask(lr, m, 0.04), [[False, True, True, True, True, False]])
    # squares [1, .25, .01, .01]: drop 1 -> .27/3 = .09 > .04; drop .25 -> .02/2 = .01: keep last two.
    lr2 = jnp.array([[0.1, 1.0], [-0.5, -0.1]])
    np.testing.assert_array_equal(obj.m2po_mask(lr2, jnp.ones((2, 2), bool), 0.04), [[True, False], [False, True]])
    # every square 1 > tau: no prefix suffices, all rejected; all within tau: none rejected.
    np.testing.assert_array_equal(obj.m2po_mask(jnp.ones((2, 2)), jnp.ones((2, 2), bool), 0.04), np.zeros((2, 2), bool))
    np.testing.assert_array_equal(obj.m2po_mask(jnp.full((2, 2), 0.1), jnp.ones((2, 2), bool), 0.04), np.ones((2, 2), bool))


def test_trm_mask_goldens():
    # max k2 = (log r)^2/2: row0 max .045 <= .05 keep; row1 .32^2/2 = .0512 > .05 reject.
    lr = jnp.array([[0.1, -0.3], [0.1, 0.32], [jnp.nan, 0.0]])
    m = jnp.array([[True, True], [True, True], [False, True]])
    np.testing.assert_array_equal(obj.trm_mask(lr, m, 0.05, "max"), [[True, True], [False, False], [False, True]])
    # mean k3 = e^x - x - 1: row0 (0.005171 + 0.040818)/2 = 0.022994.
    lr0 = lr[:1]
    assert bool(obj.trm_mask(lr0, m[:1], 0.03, "mean").all())
    assert not bool(obj.trm_mask(lr0, m[:1], 0.02, "mean").any())
    # a NaN on a loss token rejects its row
    np.testing.assert_array_equal(obj.trm_mask(lr[2:], jnp.array([[True, True]]), 0.05), [[False, False]])


SAT_D = [0.0, 0.1, -0.1, 0.2, -0.2, 0.3, 0.1, 0.0, 0.5, -1.0]


def test_sat_clip_factors_goldens():
    # sorted |d| = [0,0,.1,.1,.1,.2,.2,.3,.5,1]; q_0.9 at position 8.1: .5 + .1*.5 = .55.
    # only d = -1 is contracted: shifted 1/(1 + (.45/.55)^2) = 1/1.669421 = 0.599010 on c_low;
    # standard .3025/(.3025 + 1) = 0.232246.
    d = jnp.array([SAT_D])
    m = jnp.ones((1, 10), bool)
    assert abs(float(obj.sat_quantile(d, m, 0.9)) - 0.55) < TOL
    c_low, c_high, contracted = obj.sat_clip_factors(d, m, 0.9, 2.0, "shifted")
    np.testing.assert_array_equal(contracted, [[False] * 9 + [True]])
    np.testing.assert_allclose(c_low, [[1.0] * 9 + [0.599010]], atol=TOL)
    np.testing.assert_allclose(c_high, np.ones((1, 10)), atol=0)
    c_low_s, _, _ = obj.sat_clip_factors(d, m, 0.9, 2.0, "standard")
    assert abs(float(c_low_s[0, 9]) - 0.232246) < TOL
    # flipped sign contracts the high endpoint instead
    _, c_high_f, _ = obj.sat_clip_factors(-d, m, 0.9, 2.0, "shifted")
    assert abs(float(c_high_f[0, 9]) - 0.599010) < TOL
    # q = 0 (all zero) -> no contraction
    c_low0, c_high0, con0 = obj.sat_clip_factors(jnp.zeros((2, 3)), jnp.ones((2, 3), bool))
    assert not bool(con0.any()) and float(c_low0.min()) == 1.0 and float(c_high0.min()) == 1.0


# ---------------------------------------------------------------- objectives


def test_entr_golden():
    # delta = [0.9, 1.1, 0.05], H = [1, 1, 0], A = [1, 1, -1], tau 1, eps .01, clip .2/.28
    # S = [.80198, 1.19802, .25] -> keep [T, F, T].
    # tok0: r = e^.9 = 2.459603, A = 1 -> min(r, 1.28) = 1.28 -> l = -1.28 (clipped, grad 0)
    # tok2: r = e^.05 = 1.051271, A = -1 -> l = 1.051271, dl/dlogp = -A r = 1.051271
    # token_mean over 3: (-1.28 + 1.051271)/3 = -0.076243; grad tok2 = 1.051271/3 = 0.350424
    mu = jnp.full((1, 3), -1.0)
    b = ns(mu, [[1.0, 1.0, -1.0]], entropy_mu=jnp.array([[1.0, 1.0, 0.0]]))
    lp = mu + jnp.array([[0.9, 1.1, 0.05]])
    loss, m, g = value_grad("entr", lp, b, tau=1.0, eps=0.01, clip_low=0.2, clip_high=0.28)
    assert abs(loss - (-0.076243)) < TOL
    np.testing.assert_allclose(g, [[0.0, 0.0, 0.350424]], atol=TOL)
    assert abs(m["mask/fraction"] - 1 / 3) < TOL
    assert abs(m["clip/frac_high"] - 1 / 3) < TOL and m["clip/frac_low"] == 0.0
    assert abs(m["entr/score_mean"] - 0.75) < TOL  # (2.02/1.01 + 0.25)/3
    assert abs(m["loss/pg"] - loss) < TOL
    # kept-tokens denominator: -0.228729 / 2
    loss_k, _, g_k = value_grad("entr", lp, b, denominator="kept_tokens")
    assert abs(loss_k - (-0.1143645)) < TOL
    np.testing.assert_allclose(g_k, [[0.0, 0.0, 1.051271 / 2]], atol=TOL)
    # estr is an alias
    assert abs(value_grad("estr", lp, b)[0] - loss) < TOL


def test_entr_refuses_a_kept_token_aggregation_with_the_all_tokens_denominator():
    # aggregation='token_mean_kept' with denominator='all_tokens' used to be accepted and
    # silently divided by the kept tokens (here 2 of 3: -0.1143645, not -0.076243).
    with pytest.raises(ValueError, match=r"EntrConfig\.aggregation='token_mean_kept'.*"
                                         r"EntrConfig\.denominator='all_tokens'"):
        obj.EntrConfig(aggregation="token_mean_kept", denominator="all_tokens")
    with pytest.raises(ValueError, match="denominator"):
        obj.make_objective("entr", aggregation="token_mean_kept")  # default denominator
    # the consistent pair keeps its meaning: divided by the kept tokens
    mu = jnp.full((1, 3), -1.0)
    b = ns(mu, [[1.0, 1.0, -1.0]], entropy_mu=jnp.array([[1.0, 1.0, 0.0]]))
    lp = mu + jnp.array([[0.9, 1.1, 0.05]])
    loss, _, _ = value_grad("entr", lp, b, aggregation="token_mean_kept", denominator="kept_tokens")
    assert abs(loss - (-0.1143645)) < TOL


def test_entr_current_full_entropy():
    mu = jnp.full((1, 3), -1.0)
    lp = mu + jnp.array([[0.9, 1.1, 0.05]])
    b = ns(mu, [[1.0, 1.0, -1.0]], entropy_mu=jnp.zeros((1, 3)), entropy_pi=jnp.array([[1.0, 1.0, 0.0]]))
    # with entropy_pi = the H above, the golden of test_entr_golden is reproduced
    assert abs(value_grad("entr", lp, b, entropy_source="current_full")[0] - (-0.076243)) < TOL
    # with entropy_mu = 0 only tok2 (|delta| .05 <= .1) is kept: 1.051271/3
    assert abs(value_grad("entr", lp, b)[0] - 0.350424) < TOL
    with pytest.raises(ValueError, match="entropy_pi"):
        value_grad("entr", lp, ns(mu, [[1.0, 1.0, -1.0]], entropy_mu=jnp.zeros((1, 3))), entropy_source="current_full")


def test_grpo_golden_seq_mean():
    # row0 delta [.1, -.3, .5], A = +1: r = [1.105171, .740818, 1.648721]
    #   l = -[1.105171, .740818, 1.2] -> mean -1.015330 (tok2 clipped high)
    # row1 delta [0, -.4, pad], A = -1: r = [1, .670320] -> l = [1, .8] -> mean .9 (tok1 clipped low)
    # loss = (-1.015330 + .9)/2 = -0.057665
    # grad row0: -r/(3*2) = [-.184195, -.123470, 0]; row1: +1/(2*2) = .25, 0, 0
    mu = jnp.full((2, 3), -1.0)
    lp = mu + jnp.array([[0.1, -0.3, 0.5], [0.0, -0.4, 7.0]])
    b = ns(mu, [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], [[True, True, True], [True, True, False]])
    loss, m, g = value_grad("grpo", lp, b)
    assert abs(loss - (-0.057665)) < TOL
    np.testing.assert_allclose(g, [[-0.184195, -0.123470, 0.0], [0.25, 0.0, 0.0]], atol=TOL)
    assert abs(m["clip/frac_low"] - 0.2) < TOL and abs(m["clip/frac_high"] - 0.2) < TOL
    assert m["mask/fraction"] == 0.0
    # ratio_pi_mu over the 5 loss tokens: mean (1.105171+.740818+1.648721+1+.670320)/5 = 1.033006
    assert abs(m["ratio_pi_mu/mean"] - 1.033006) < TOL and abs(m["ratio_pi_mu/max"] - 1.648721) < TOL
    # Dr.GRPO: sum over tokens / (G * l_norm) = (-3.045989 + 1.8)/(2 * 4) = -0.155749
    assert abs(value_grad("grpo", lp, b, aggregation="seq_mean_token_sum_norm", l_norm=4.0)[0] - (-0.155749)) < TOL
    # l_norm None is refused: the padded width would make the loss follow the pad bucket
    with pytest.raises(ValueError, match="l_norm"):
        value_grad("grpo", lp, b, aggregation="seq_mean_token_sum_norm")


def test_grpo_k3_kl_golden():
    # A = 0 so pg = 0; x = ref - pi = [.5, -.5]: k3 = [e^.5 - 1.5, e^-.5 - .5] = [.148721, .106531]
    # loss = .1 * mean = .0127626; dk3/dpi = -(e^x - 1) = [-.648721, .393469] -> * .1/2
    mu = jnp.full((1, 2), -1.0)
    b = ns(mu, [[0.0, 0.0]], logp_ref=mu + jnp.array([[0.5, -0.5]]))
    loss, m, g = value_grad("grpo", mu, b, kl_coef=0.1, aggregation="token_mean")
    assert abs(loss - 0.0127626) < TOL
    np.testing.assert_allclose(g, [[-0.0324361, 0.0196735]], atol=TOL)
    assert abs(m["kl/k3"] - 0.127626) < TOL and abs(m["loss/kl"] - 0.127626) < TOL
    with pytest.raises(ValueError, match="logp_ref"):
        value_grad("grpo", mu, ns(mu, [[0.0, 0.0]]), kl_coef=0.1)


def _decoupled_case():
    # mu = -1; prox - mu = [.2, -.1, 1.0]; pi - prox = [.1, .3, 0]; A = [1, -1, 1]
    mu = jnp.full((1, 3), -1.0)
    prox = mu + jnp.array([[0.2, -0.1, 1.0]])
    lp = prox + jnp.array([[0.1, 0.3, 0.0]])
    return lp, ns(mu, [[1.0, -1.0, 1.0]], logp_prox=prox)


def test_decoupled_ppo_golden():
    # w = [e^.2 = 1.221403, e^-.1 = .904837, e^1 = 2.718282]; u = [e^.1, e^.3, 1]
    # tok0: -w u = -e^.3 = -1.349859; tok1 (A<0, u=1.349859 > 1.2 -> unclipped side): +e^.2 = 1.221403
    # cap 2, mask: tok2 dropped -> (-1.349859 + 1.221403)/3 = -0.042819; grad [-.449953, .407134, 0]
    lp, b = _decoupled_case()
    loss, m, g = value_grad("decoupled_ppo", lp, b, weight_cap=2.0)
    assert abs(loss - (-0.042819)) < TOL
    np.testing.assert_allclose(g, [[-0.449953, 0.407134, 0.0]], atol=TOL)
    assert abs(m["mask/fraction"] - 1 / 3) < TOL
    # truncate: tok2 w = 2, u = 1 -> l = -2: (-0.128456 - 2)/3 = -0.709485; grad tok2 = -2/3
    loss_t, _, g_t = value_grad("decoupled_ppo", lp, b, weight_cap=2.0, weight_cap_mode="truncate")
    assert abs(loss_t - (-0.709485)) < TOL and abs(g_t[0, 2] - (-2 / 3)) < TOL
    with pytest.raises(ValueError, match="logp_prox"):
        value_grad("decoupled_ppo", lp, ns(b.logp_mu, b.advantages))


def test_tis_golden():
    lp, b = _decoupled_case()
    # token level, cap 2: identical to decoupled_ppo truncate
    assert abs(value_grad("tis", lp, b)[0] - (-0.709485)) < TOL
    # sequence: w = min(e^(.2-.1+1) = 3.004166, 2) = 2 on every token:
    # l = 2 * [-1.105171, 1.349859, -1] -> -1.510624/3 = -0.503541
    assert abs(value_grad("tis", lp, b, level="sequence")[0] - (-0.503541)) < TOL
    assert value_grad("tis", lp, b)[1]["ratio_mode/decoupled"] == 1.0
    # bypass (prox := mu) would make w = min(mu/mu, 2) = 1: GRPO's loss, the cap inert
    # (PPO on pi/mu, r = [e^.3, e^.2, e^1]: -1.178597/3, exactly grpo's value): refused
    assert abs(value_grad("grpo", lp, b, aggregation="token_mean", clip_high=0.2)[0]
               - (-0.392866)) < TOL
    with pytest.raises(ValueError, match="TisConfig.ratio_mode='bypass' sets prox := mu"):
        obj.make_objective("tis", ratio_mode="bypass")
    with pytest.raises(ValueError, match=r"ratio_mode='decoupled' needs batch.logp_prox .*, but it is None\n"):
        value_grad("tis", lp, ns(b.logp_mu, b.advantages))


def test_icepop_golden():
    # bypass: k = pi/mu = [.4, 1, 6, 1.1], band [.5, 5] keeps tok1, tok3; A = [1, 1, 1, -1]
    # tok1: r = 1 -> -1; tok3: r = 1.1, A = -1 -> +1.1; seq-mean-token-mean: .1/4 = .025
    mu = jnp.full((1, 4), -1.0)
    d = jnp.log(jnp.array([[0.4, 1.0, 6.0, 1.1]]))
    b = ns(mu, [[1.0, 1.0, 1.0, -1.0]])
    loss, m, g = value_grad("icepop", mu + d, b)
    assert abs(loss - 0.025) < TOL
    np.testing.assert_allclose(g, [[0.0, -0.25, 0.0, 0.275]], atol=TOL)
    assert abs(m["mask/fraction"] - 0.5) < TOL
    # decoupled: prox = mu + d, pi = prox + .1: w = [-, 1, -, 1.1], u = e^.1 = 1.105171
    # -1.105171 + 1.1 * 1.105171 = .110517 -> /4 = .027629
    b2 = ns(mu, [[1.0, 1.0, 1.0, -1.0]], logp_prox=mu + d)
    loss_d, m_d, _ = value_grad("icepop", mu + d + 0.1, b2, ratio_mode="decoupled")
    assert abs(loss_d - 0.027629) < TOL
    assert m_d["ratio_mode/decoupled"] == 1.0 and m["ratio_mode/decoupled"] == 0.0
    # bypass ignores a given prox: the golden above again
    assert abs(value_grad("icepop", mu + d, b2)[0] - 0.025) < TOL


def test_kpop_golden():
    # (p, q, A): (.5, .5, 1) keep, r = 1 -> -1; (.1, .9, -1) keep, r = 1/9 -> clipped low -> +.8;
    # (.5, .999, 1) and (.999, .5, 1) rejected. token_mean: (-1 + .8)/4 = -.05; grad [-.25, 0, 0, 0]
    p = jnp.log(jnp.array([[0.5, 0.1, 0.5, 0.999]]))
    q = jnp.log(jnp.array([[0.5, 0.9, 0.999, 0.5]]))
    loss, m, g = value_grad("kpop", p, ns(q, [[1.0, -1.0, 1.0, 1.0]]), phi=2.0)
    assert abs(loss - (-0.05)) < TOL
    np.testing.assert_allclose(g, [[-0.25, 0.0, 0.0, 0.0]], atol=TOL)
    assert abs(m["mask/fraction"] - 0.5) < TOL and abs(m["clip/frac_low"] - 0.25) < TOL


def test_gspo_golden():
    # row0: mean delta .2 -> s = 1.221403 > 1.0004, A = 1: l = -1.0004, clipped (grad 0)
    # row1: mean delta 0 -> s = 1, A = -1: l = 1 per token; loss = (-1.0004 + 1)/2 = -.0002
    # grad row1 tokens: -A s /(|o|=2)/(G=2) = .25
    mu = jnp.full((2, 3), -1.0)
    lp = mu + jnp.array([[0.1, 0.2, 0.3], [0.0002, -0.0002, 5.0]])
    b = ns(mu, [[1.0] * 3, [-1.0] * 3], [[True] * 3, [True, True, False]])
    loss, m, g = value_grad("gspo", lp, b)
    assert abs(loss - (-0.0002)) < TOL
    np.testing.assert_allclose(g, [[0.0, 0.0, 0.0], [0.25, 0.25, 0.0]], atol=TOL)
    assert abs(m["ratio_seq/mean"] - (1.221403 + 1.0) / 2) < TOL


def test_cispo_golden():
    # pi = [-.5, -2.5, -.4], mu = [-1, -2, -.5] -> r = [e^.5, e^-.5, e^.1]; A = [1, 1, -1]
    # w = [min(1.648721, 1.3), .606531, 1.105171]; l = -w A logpi = [.65, 1.516327, -.442068]
    # mean 1.724259/3 = .574753; grad -w A/3 = [-.433333, -.202177, .368390]
    b = ns([[-1.0, -2.0, -0.5]], [[1.0, 1.0, -1.0]])
    loss, m, g = value_grad("cispo", [[-0.5, -2.5, -0.4]], b)
    assert abs(loss - 0.574753) < TOL
    np.testing.assert_allclose(g, [[-0.433333, -0.202177, 0.368390]], atol=TOL)
    # token 0's weight is truncated at 1.3 (its gradient is kept: no clip/frac_* metric)
    assert abs(m["is_weight/frac_truncated_high"] - 1 / 3) < TOL and m["is_weight/frac_truncated_low"] == 0.0
    assert not any(k.startswith("clip/") for k in m)
    # with a lower bound .2: w1 = max(.606531, .8) = .8 -> grad tok1 = -.8/3
    _, m_low, g_low = value_grad("cispo", [[-0.5, -2.5, -0.4]], b, clip_low=0.2)
    assert abs(g_low[0, 1] - (-0.8 / 3)) < TOL
    assert abs(m_low["is_weight/frac_truncated_low"] - 1 / 3) < TOL


def test_m2po_golden():
    # log r = [.5, .1, -.1, 0, .3] (+pad); tok0 rejected (see test_m2po_mask_goldens); A = [1,1,1,1,-1]
    # kept r A = 1.105171 + .904837 + 1 - 1.349859 = 1.660149 -> loss -1.660149/5 = -.332030
    # grad -r A/5 = [0, -.221034, -.180967, -.2, .269972]
    mu = jnp.full((1, 6), -1.0)
    lp = mu + jnp.array([[0.5, 0.1, -0.1, 0.0, 0.3, 9.0]])
    b = ns(mu, [[1.0, 1.0, 1.0, 1.0, -1.0, 1.0]], [[True] * 5 + [False]])
    loss, m, g = value_grad("m2po", lp, b, tau=0.04)
    assert abs(loss - (-0.332030)) < TOL
    np.testing.assert_allclose(g, [[0.0, -0.221034, -0.180967, -0.2, 0.269972, 0.0]], atol=TOL)
    assert abs(m["m2po/m2_all"] - 0.072) < TOL and abs(m["m2po/m2_kept"] - 0.0275) < TOL
    assert abs(m["mask/fraction"] - 0.2) < TOL


def test_trm_golden():
    # row0 log r = [.1, -.3] kept, A = 1: l = -[1.105171, .740818] -> /4 = -.461497; row1 rejected
    mu = jnp.full((2, 2), -1.0)
    lp = mu + jnp.array([[0.1, -0.3], [0.1, 0.32]])
    loss, m, g = value_grad("trm", lp, ns(mu, jnp.ones((2, 2))), threshold=0.05)
    assert abs(loss - (-0.461497)) < TOL
    np.testing.assert_allclose(g, [[-1.105171 / 4, -0.740818 / 4], [0.0, 0.0]], atol=TOL)
    assert abs(m["mask/seq_fraction"] - 0.5) < TOL and abs(m["mask/fraction"] - 0.5) < TOL
    assert m["trm/seq_rejected/count"] == 1.0 and m["trm/seq_rejected/fraction"] == 0.5


def test_vespo_golden():
    # log W = .1 + .2 = .3, W = 1.349859.
    # A = +1: phi = exp(2*.3 + 3(1 - W)) = exp(-.449576) = .637894
    #   l = -phi A logpi with logpi = [-1, -.5]: [.637894, .318947] -> /2 = .478421; grad -phi/2
    # A = -1: phi = exp(3*.3 + 2(1 - W)) = exp(.200282) = 1.221747; grad +phi/2
    mu = jnp.array([[-1.1, -0.7]])
    lp = jnp.array([[-1.0, -0.5]])
    loss, m, g = value_grad("vespo", lp, ns(mu, [[1.0, 1.0]]))
    assert abs(loss - 0.478421) < TOL
    np.testing.assert_allclose(g, [[-0.318947, -0.318947]], atol=TOL)
    _, m2, g2 = value_grad("vespo", lp, ns(mu, [[-1.0, -1.0]]))
    np.testing.assert_allclose(g2, [[0.610874, 0.610874]], atol=TOL)
    assert abs(m2["vespo/phi_mean"] - 1.221747) < TOL


def test_vespo_counts_zeroed_sequences():
    # row0: 1000 tokens, delta +0.012 each: log W = 12, phi = exp(24 + 3(1 - e^12)) = 0 in f32
    # row1: 2 tokens, delta 0: phi = 1. One of two sequences zeroed out.
    mu = jnp.full((2, 1000), -1.0)
    mask = jnp.zeros((2, 1000), bool).at[0].set(True).at[1, :2].set(True)
    lp = mu + jnp.where(jnp.arange(2)[:, None] == 0, 0.012, 0.0)
    loss, m, g = value_grad("vespo", lp, ns(mu, jnp.ones((2, 1000)), mask))
    assert m["vespo/seq_zeroed/count"] == 1.0 and m["vespo/seq_zeroed/fraction"] == 0.5
    assert np.all(g[0] == 0.0)  # only row1 learns: -phi A / N with N = 1002 loss tokens
    np.testing.assert_allclose(g[1, :2], -1 / 1002, rtol=1e-6)
    assert m["vespo/phi_mean"] == pytest.approx(2 / 1002, rel=1e-5)


def test_icepop_decoupled_keeps_ratios_in_band_with_positive_advantage():
    # prox/mu = k = [1.5, 3] (in [0.5, 5]), A = +1, pi = prox (first update of a rollout
    # batch). Decoupled: l = -k * min(u A, clip(u) A), u = 1: l = -[1.5, 3], seq mean
    # -2.25, grad -k/2 = [-.75, -1.5]. Bypass (ratio pi/mu = k, clipped at 1.2 for A > 0):
    # l = -[1.2, 1.2], loss -1.2 and no gradient: the tokens are effectively dropped.
    mu = jnp.full((1, 2), -2.0)
    prox = mu + jnp.log(jnp.array([[1.5, 3.0]]))
    b = ns(mu, [[1.0, 1.0]], logp_prox=prox)
    loss, m, g = value_grad("icepop", prox, b, ratio_mode="decoupled")
    assert loss == pytest.approx(-2.25, abs=TOL) and m["mask/fraction"] == 0.0
    np.testing.assert_allclose(g, [[-0.75, -1.5]], atol=TOL)
    assert m["is_weight/max"] == pytest.approx(3.0, rel=1e-5)
    loss_b, _, g_b = value_grad("icepop", prox, b)
    assert loss_b == pytest.approx(-1.2, abs=TOL) and np.all(g_b == 0.0)
    # KPop decoupled reads prox the same way and refuses a batch without it
    _, mk, _ = value_grad("kpop", prox, b, ratio_mode="decoupled")
    assert mk["ratio_mode/decoupled"] == 1.0
    with pytest.raises(ValueError, match="KPopConfig.ratio_mode='decoupled'"):
        value_grad("kpop", prox, ns(mu, [[1.0, 1.0]]), ratio_mode="decoupled")


def test_objectives_declare_the_inputs_they_read():
    assert obj.make_objective("entr").inputs == {"entropy_mu"}
    assert obj.make_objective("entr", entropy_source="current_full").inputs == {"entropy_pi"}
    assert obj.make_objective("grpo").inputs == frozenset()
    assert obj.make_objective("grpo", kl_coef=0.04).inputs == {"logp_ref"}
    assert obj.make_objective("decoupled_ppo").inputs == {"logp_prox"}
    assert obj.make_objective("icepop").inputs == frozenset()
    assert obj.make_objective("kpop", ratio_mode="decoupled").inputs == {"logp_prox"}
    assert obj.make_objective("tis").inputs == {"logp_prox"}
    with_stats = {n for n in obj.OBJECTIVES if obj.make_objective(n).batch_stats is not None}
    assert with_stats == {"m2po", "sat"}
    assert obj.make_objective("icepop", aggregation="token_mean_kept").batch_stats is not None


def test_sat_golden():
    # d as in test_sat_clip_factors_goldens; A = -1 only on the contracted token (d = -1):
    # r = e^-1 = .367879, lower bound 1 - .2 * .599010 = .880198 -> l = max(r, clip) = .880198
    # token_mean over 10: .0880198 (plain GRPO bound .8 would give .08)
    mu = jnp.full((1, 10), -1.0)
    adv = jnp.zeros((1, 10)).at[0, 9].set(-1.0)
    loss, m, g = value_grad("sat", mu + jnp.array([SAT_D]), ns(mu, adv))
    assert abs(loss - 0.0880198) < TOL
    assert abs(m["sat/quantile"] - 0.55) < TOL and abs(m["sat/frac_contracted"] - 0.1) < TOL
    np.testing.assert_allclose(g, np.zeros((1, 10)), atol=0)  # clipped low: no gradient


# ---------------------------------------------------------------- registry and configs


def test_registry_lists_every_method():
    expected = {"entr", "estr", "grpo", "decoupled_ppo", "tis", "icepop", "kpop", "gspo", "cispo", "m2po", "trm", "vespo", "sat"}
    assert set(obj.OBJECTIVES) == expected
    for name, (fn, cls) in obj.OBJECTIVES.items():
        cfg = cls()
        assert cfg.aggregation in obj.AGGREGATIONS
        f = obj.make_objective(name)
        assert f.config == cfg and f.name == name


def test_make_objective_takes_a_built_config():
    """A run's built ``objective.<name>`` section is used as given (no dict round trip);
    the same objective as the overrides that build it, and refused with overrides or for
    another method's class."""
    cfg = obj.GrpoConfig(kl_coef=0.1, aggregation="token_mean")
    f, g = obj.make_objective("grpo", cfg), obj.make_objective("grpo", kl_coef=0.1, aggregation="token_mean")
    assert f.config is cfg and f.config == g.config and f.inputs == g.inputs == {"logp_ref"}
    mu = jnp.log(jnp.array([[0.5, 0.25, 0.125]]))
    b = ns(mu, [[1.0, -1.0, 1.0]], logp_ref=mu - 0.5)
    assert np.asarray(f(mu + 0.1, b)[0]).tobytes() == np.asarray(g(mu + 0.1, b)[0]).tobytes()
    assert obj.make_objective("estr", obj.EntrConfig(tau=0.5)).config.tau == 0.5
    with pytest.raises(ValueError, match="config or overrides, not both"):
        obj.make_objective("grpo", cfg, kl_coef=0.2)
    with pytest.raises(ValueError, match="config must be GrpoConfig, got EntrConfig"):
        obj.make_objective("grpo", obj.EntrConfig())


def test_paper_default_aggregations():
    agg = {n: c().aggregation for n, (_, c) in obj.OBJECTIVES.items()}
    assert agg["entr"] == "token_mean" and agg["grpo"] == "seq_mean_token_mean"
    assert agg["gspo"] == "seq_mean_token_mean" and agg["icepop"] == "seq_mean_token_mean"
    assert agg["cispo"] == "token_mean" and agg["m2po"] == "token_mean"


def test_unknown_name_lists_known():
    with pytest.raises(ValueError, match="known objectives.*entr"):
        obj.make_objective("ppo2")


@pytest.mark.parametrize(
    "name, overrides, field",
    [
        ("entr", {"tau": 0.0}, "tau"),
        ("entr", {"tau": -1.0}, "tau"),
        ("entr", {"eps": -0.01}, "eps"),
        ("entr", {"clip_low": 1.0}, "clip_low"),
        ("entr", {"clip_low": -0.1}, "clip_low"),
        ("entr", {"clip_high": -0.1}, "clip_high"),
        ("entr", {"entropy_source": "behavior_sampled"}, "entropy_source"),
        ("entr", {"denominator": "kept_tokens", "aggregation": "seq_mean_token_mean"}, "denominator"),
        ("entr", {"aggregation": "mean"}, "aggregation"),
        ("entr", {"l_norm": 0.0}, "l_norm"),
        ("icepop", {"alpha": 5.0, "beta": 5.0}, "alpha"),
        ("icepop", {"alpha": -0.1}, "alpha"),
        ("kpop", {"phi": 0.0}, "phi"),
        ("tis", {"cap": 0.0}, "cap"),
        ("tis", {"level": "batch"}, "level"),
        ("grpo", {"kl_coef": -1.0}, "kl_coef"),
        ("m2po", {"tau": 0.0}, "tau"),
        ("trm", {"criterion": "median"}, "criterion"),
        ("sat", {"alpha": 1.0}, "alpha"),
        ("cispo", {"clip_low": 1.5}, "clip_low"),
        ("decoupled_ppo", {"weight_cap": -2.0}, "weight_cap"),
        ("entr", {"bogus": 1}, "bogus"),
    ],
)
def test_invalid_hyperparameters_name_the_field(name, overrides, field):
    with pytest.raises(ValueError, match=field):
        obj.make_objective(name, **overrides)


def test_configs_and_objectives_are_frozen():
    import dataclasses

    cfg = obj.EntrConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.tau = 2.0  # type: ignore[misc]
    objective = obj.make_objective("estr")
    with pytest.raises(dataclasses.FrozenInstanceError):
        objective.inputs = frozenset()  # type: ignore[misc]
    assert (objective.name, objective.config, objective.inputs) == (
        "estr", obj.EntrConfig(), frozenset({"entropy_mu"}))
    assert obj.OBJECTIVES["estr"] == obj.OBJECTIVES["entr"] and obj.ALIASES == {"estr": "entr"}


def test_shape_and_dtype_errors_name_the_argument():
    f = obj.make_objective("entr")
    mu = jnp.zeros((6, 7))
    b = ns(mu, jnp.zeros((6, 7)), entropy_mu=jnp.ones((6, 7)))
    with pytest.raises(AssertionError, match="logp_pi"):
        f(jnp.zeros((6, 7, 1)), b)
    with pytest.raises(AssertionError, match="batch.advantages"):
        f(mu, ns(mu, jnp.zeros((7, 6)), entropy_mu=jnp.ones((6, 7))))
    with pytest.raises(AssertionError, match="batch.entropy_mu"):
        f(mu, ns(mu, jnp.zeros((6, 7)), entropy_mu=jnp.ones((6,))))
    with pytest.raises(TypeError, match="batch.loss_mask"):
        f(mu, types.SimpleNamespace(**{**vars(b), "loss_mask": jnp.ones((6, 7), jnp.int32)}))
    with pytest.raises(TypeError, match="logp_pi"):
        f(jnp.zeros((6, 7), jnp.int32), b)
    with pytest.raises(AssertionError, match="num_loss_tokens"):
        f(mu, types.SimpleNamespace(**{**vars(b), "num_loss_tokens": jnp.ones((2,))}))
    # the errors fire at trace time under jit too
    with pytest.raises(AssertionError, match="logp_pi"):
        jax.jit(lambda x: f(x, b))(jnp.zeros((6, 8)))


def test_metrics_are_f32_scalars_with_slash_keys():
    mu = jnp.full((6, 7), -1.0)
    b = ns(mu, jnp.ones((6, 7)), entropy_mu=jnp.ones((6, 7)), logp_prox=mu, logp_ref=mu)
    for name in obj.OBJECTIVES:
        kw = {"kl_coef": 0.1} if name == "grpo" else {}
        loss, metrics = jax.jit(lambda x, f=obj.make_objective(name, **kw): f(x, b))(mu + 0.1)
        assert loss.shape == () and loss.dtype == jnp.float32
        for k, v in metrics.items():
            assert "/" in k and v.shape == () and v.dtype == jnp.float32, (name, k)
        assert {"loss/pg", "mask/fraction", "ratio_pi_mu/mean", "ratio_pi_mu/max"} <= set(metrics), name
    assert math.isclose(float(metrics["ratio_pi_mu/mean"]), math.exp(0.1), rel_tol=1e-5)
