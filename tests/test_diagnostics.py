"""Learner token diagnostics and their pooling over the optimizer updates of a rollout
batch (`learners.diagnostics`): hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from entr_jax import objectives as obj
from entr_jax.logprobs import LOGP_OUTSIDE_KEPT
from entr_jax.objectives.common import normalisers
from entr_jax.objectives.pooling import COUNT, LOSS_TOKENS, METRIC_POOLING
from entr_jax.types import Batch
from learners.accumulate import view
from learners.diagnostics import LEARNER_POOLING, finalize, reduce_over_steps, token_sums


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


# ------------------------------------------------- pooling over the K updates of a rollout batch

B, T = 4, 6
SAT_QUANTILE = 0.3  # one quantile for every update, so the union has it too
VARIANTS = [  # every option that changes which metrics an objective emits or how
    ("entr", {}), ("entr", {"entropy_source": "current_full"}),
    ("grpo", {"kl_coef": 0.1}), ("grpo", {}),
    ("decoupled_ppo", {}), ("decoupled_ppo", {"weight_cap": 3.0}),
    ("decoupled_ppo", {"weight_cap": 3.0, "weight_cap_mode": "truncate"}),
    ("tis", {}), ("tis", {"level": "sequence"}),
    ("icepop", {}), ("icepop", {"ratio_mode": "decoupled"}),
    ("kpop", {}), ("kpop", {"ratio_mode": "decoupled"}),
    ("gspo", {}), ("cispo", {}), ("cispo", {"clip_low": 0.2}), ("m2po", {}),
    ("trm", {"threshold": 0.3}), ("trm", {"criterion": "mean", "threshold": 0.1}),
    ("vespo", {}), ("sat", {}),
]
assert {n for n, _ in VARIANTS} | {"estr"} == set(obj.OBJECTIVES)


def _objective(name, aggregation, overrides):
    kw = {"aggregation": aggregation, "l_norm": 8.0, **overrides}
    if name == "entr" and aggregation == "token_mean_kept":
        kw.update(aggregation="token_mean", denominator="kept_tokens")
    return obj.make_objective(name, **kw)


def _minibatch(seed):
    """One mini-batch: a row without loss tokens, a loss token with unknown entropy."""
    k = jax.random.split(jax.random.PRNGKey(seed), 6)
    mask = (jax.random.uniform(k[0], (B, T)) < 0.75).at[0].set(True).at[3].set(False)
    logp_mu = -jnp.abs(jax.random.normal(k[1], (B, T))) - 0.1
    return Batch(
        tokens=jnp.zeros((B, T + 1), jnp.int32), attention_mask=jnp.ones((B, T + 1), bool),
        loss_mask=mask, advantages=jnp.where(mask, jax.random.normal(k[2], (B, 1)), 0.0),
        logp_mu=logp_mu, entropy_mu=2.0 * jnp.abs(jax.random.normal(k[3], (B, T))),
        token_version=jax.random.randint(k[4], (B, T), 0, 3),
        logp_prox=logp_mu + 0.3 * jax.random.normal(k[5], (B, T)),
        logp_ref=logp_mu - 0.2, entropy_mu_valid=jnp.ones((B, T), bool).at[0, 1].set(False))


def _update(objective, logp, entropy, batch, stats):
    """What `learners.step` records for one update: its metrics and token sums."""
    loss, m = objective(logp, view(batch, normalisers(batch.loss_mask), entropy, stats))
    sums = token_sums(logp, entropy, batch, jnp.int32(3))
    return {**m, "loss": loss, "train/applied": jnp.float32(1.0), "train/grad_norm": loss,
            **finalize(*sums)}, sums


def _stats(objective, logp, entropy, batch):
    if objective.batch_stats is None:
        return None
    if objective.name == "sat":
        return {"quantile": jnp.float32(SAT_QUANTILE)}
    return objective.batch_stats(logp, view(batch, normalisers(batch.loss_mask), entropy, None))


def _union_stats(stats):
    if stats[0] is None:
        return None
    out = {}
    for key in stats[0]:
        values = [s[key] for s in stats]
        if values[0].ndim:
            out[key] = jnp.concatenate(values)      # M2PO's per-token mask, each update's own
        elif key == "num_kept_tokens":
            out[key] = sum(values)
        else:
            out[key] = values[0]                    # SAT's shared quantile
    return out


def _is_count(key):
    return (METRIC_POOLING.get(key) == COUNT or key in ("tokens/num_loss_tokens", "tokens/entropy_mu_unknown")
            or key.startswith("hist/") or (key.startswith("ratio_by_entropy/") and key.endswith("/count")))


def _round(objective, minibatches, epochs):
    """The record of ``epochs`` passes over ``minibatches`` (each update with its own
    log-probs), and the metrics computed directly on the concatenation of every update's
    tokens."""
    updates = []  # (metrics, token sums, batch statistics, batch, logp, entropy) of each update
    for e in range(epochs):
        for j, b in enumerate(minibatches):
            kk = jax.random.split(jax.random.PRNGKey(100 + 10 * e + j), 2)
            logp = b.logp_mu + 0.6 * jax.random.normal(kk[0], (B, T))
            if e == j == 0:  # far off-policy row: VESPO zeroes it, the gates reject it
                logp = logp.at[1].add(1.5)
            ent = 1.5 * jnp.abs(jax.random.normal(kk[1], (B, T)))
            st = _stats(objective, logp, ent, b)
            updates.append((*_update(objective, logp, ent, b, st), st, b, logp, ent))
    metrics, sums, stats, rows, logps, ents = zip(*updates)
    stack = lambda xs: jax.tree.map(lambda *v: jnp.stack(v), *xs)  # noqa: E731
    record = reduce_over_steps(stack(metrics), epochs, diagnostic_sums=stack(sums))
    union = jax.tree.map(lambda *v: jnp.concatenate(v), *rows)
    whole, _ = _update(objective, jnp.concatenate(logps), jnp.concatenate(ents), union, _union_stats(stats))
    return record, whole


@pytest.mark.parametrize("epochs", [1, 2], ids=["K2", "K4_epochs2"])
@pytest.mark.parametrize("name, overrides", VARIANTS, ids=[f"{n}{o}" for n, o in VARIANTS])
def test_the_rollout_batch_record_is_the_value_over_every_update_s_tokens(name, overrides, epochs):
    for aggregation in obj.AGGREGATIONS:
        objective = _objective(name, aggregation, overrides)
        record, whole = _round(objective, [_minibatch(1), _minibatch(2)], epochs)
        assert record.keys() == whole.keys()
        for key, value in record.items():
            if key.startswith("train/"):
                continue
            expected = whole[key] / epochs if _is_count(key) else whole[key]
            np.testing.assert_allclose(value, expected, rtol=2e-5, atol=1e-6,
                                       err_msg=f"{name} {aggregation} {key}")


def test_pooled_diagnostics_by_hand():
    # Two updates of 4 loss tokens each. Update 1: log(pi/mu) = [5, 0, 0, 0], update 2:
    # [0.1, 0.1, 0.1, 0.1]; behavior entropy known on 1 of update 1's tokens (H = 2) and on
    # all of update 2's (H = 0.5).
    mask = jnp.ones((1, 4), bool)
    b1 = _batch(jnp.zeros((1, 4)), jnp.full((1, 4), 2.0), mask).replace(
        entropy_mu_valid=jnp.array([[True, False, False, False]]))
    b2 = _batch(jnp.zeros((1, 4)), jnp.full((1, 4), 0.5), mask)
    lp1, lp2 = jnp.array([[5.0, 0.0, 0.0, 0.0]]), jnp.full((1, 4), 0.1)
    s1, s2 = (token_sums(lp, jnp.ones((1, 4)), b, jnp.int32(0)) for lp, b in ((lp1, b1), (lp2, b2)))
    per = [finalize(*s) for s in (s1, s2)]
    stacked = jax.tree.map(lambda *v: jnp.stack(v), *per)
    got = reduce_over_steps(stacked, 1, diagnostic_sums=jax.tree.map(lambda *v: jnp.stack(v), s1, s2))
    assert float(per[0]["log_ratio_pi_mu/abs_max"]) == 5.0 and float(per[1]["log_ratio_pi_mu/abs_max"]) == pytest.approx(0.1)
    assert float(got["log_ratio_pi_mu/abs_max"]) == 5.0  # a token-weighted mean gave 2.55
    # entropy_mu/mean over the 5 tokens with known entropy: (2 + 4 * 0.5) / 5 = 0.8 (weighting
    # the per-update means by loss tokens gave (4 * 2 + 4 * 0.5) / 8 = 1.25)
    assert float(got["entropy_mu/mean"]) == pytest.approx(0.8)
    # E[delta^2] of bucket [2, inf): update 1's H = 2 token only, 25; of [0.5, 1): 0.01
    assert float(got["ratio_by_entropy/b4/delta_sq_mean"]) == pytest.approx(25.0)
    assert float(got["ratio_by_entropy/b2/delta_sq_mean"]) == pytest.approx(0.01, rel=1e-5)
    # ESS of the 8 token weights w = [e^5, 1, 1, 1, e^.1 x 4]: (sum w)^2 / (8 sum w^2)
    w = np.array([np.e ** 5, 1, 1, 1] + [np.e ** 0.1] * 4)
    assert float(got["ess/token_fraction"]) == pytest.approx(w.sum() ** 2 / (8 * (w ** 2).sum()), rel=1e-5)
    assert float(got["tokens/num_loss_tokens"]) == 8.0


def test_every_metric_has_a_declared_rule():
    """Every key an objective of the registry emits (every aggregation and option) has a
    rule, and every weight a rule names is emitted alongside it (or is the learner's loss
    token count), so a new metric cannot fall silently into a wrong weight."""
    b = _minibatch(1)
    logp = b.logp_mu + 0.3
    for name, overrides in VARIANTS:
        for aggregation in obj.AGGREGATIONS:
            objective = _objective(name, aggregation, overrides)
            _, m = objective(logp, view(b, normalisers(b.loss_mask), b.entropy_mu, None))
            missing = sorted(set(m) - set(METRIC_POOLING))
            assert not missing, (name, aggregation, missing)
            for key in m:
                rule = METRIC_POOLING[key]
                if "/" in rule:
                    assert rule in m or rule == LOSS_TOKENS, (name, key, rule)
            assert "loss/normaliser" in m  # the weight of `loss`
    # the learner's own keys and the token diagnostics
    diag = finalize(*token_sums(logp, b.entropy_mu, b, jnp.int32(0)))
    assert LOSS_TOKENS in diag
    assert not set(diag) & set(LEARNER_POOLING) and not set(diag) & set(METRIC_POOLING)


def test_a_metric_without_a_rule_is_refused():
    stacked = {"foo/bar": jnp.ones(2), "loss/normaliser": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"'foo/bar' has no pooling rule.*METRIC_POOLING"):
        reduce_over_steps(stacked, 1)
    with pytest.raises(ValueError, match=r"'kl/k3' is weighted by 'tokens/kept'"):
        reduce_over_steps({"kl/k3": jnp.ones(2)}, 1)
    # the token diagnostics are only pooled from their sums
    with pytest.raises(ValueError, match="'entropy_pi/mean' has no pooling rule"):
        reduce_over_steps({"entropy_pi/mean": jnp.ones(2)}, 1)
    # a custom objective declares its own
    got = reduce_over_steps({"foo/bar": jnp.array([1.0, 3.0]), "w": jnp.array([3.0, 1.0])}, 1,
                            rules={"foo/bar": "w", "w": COUNT})
    assert float(got["foo/bar"]) == 1.5 and float(got["w"]) == 4.0


def test_ess_fractions_never_exceed_one_when_float32_rounds_above():
    """ESS/N = (sum w)^2 / (N sum w^2) <= 1 exactly; in float32 three weights of 1.1 give
    1.0000001 unclipped (seen as ess/token_fraction on an AMD machine's reduction order)."""
    from learners.diagnostics import _ess_fraction

    w = jnp.full((3,), 1.1, jnp.float32)
    raw = jnp.sum(w) ** 2 / (3.0 * jnp.sum(w * w))
    assert float(raw) > 1.0  # the rounding this guards against is real here
    assert float(_ess_fraction(jnp.sum(w), jnp.sum(w * w), jnp.float32(3))) == 1.0
    v = jnp.asarray([0.5, 1.0, 2.0], jnp.float32)  # a real spread: (3.5)^2 / (3 * 5.25)
    got = _ess_fraction(jnp.sum(v), jnp.sum(v * v), jnp.float32(3))
    np.testing.assert_allclose(float(got), 12.25 / 15.75, rtol=1e-6)
    assert float(_ess_fraction(jnp.float32(0), jnp.float32(0), jnp.float32(0))) == 1.0
