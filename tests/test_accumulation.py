"""Gradient accumulation is exact for every objective and aggregation at any microbatch
count, microbatches that hold only padding included (issue 11, item 1; Dr.GRPO's
normaliser, item 6).

Three levels:
* the objectives: with the optimizer batch's normalisers and statistics, the losses and
  gradients of the microbatches of any split sum to the whole batch's (all registry
  objectives x all aggregations x M in {1, 2, 4, 16}; a microbatch is emulated by masking
  the other rows, all microbatches of a split in one vmap);
* `learners.accumulate.accumulate` with a shared-parameter bigram policy: loss, gradient
  and every objective metric at M = 4 (one microbatch all padding) equal M = 1, per
  aggregation mode and for every batch-level statistic (M2PO's mask, SAT's quantile,
  kept-token counts), whose scope is pinned to the optimizer batch;
* the full table (every objective x aggregation x M through `accumulate`) is
  ``benchmarks/accumulation.py``, asserted by the slow test at the end.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import accumulation as A
from entr_jax import objectives as obj
from entr_jax.objectives.common import normalisers
from learners.accumulate import accumulate, merge_microbatches, view

RTOL = 2e-5


@pytest.fixture(scope="module")
def case():
    return A.make_case()


def _flat_batch(batch):
    return jax.tree.map(lambda x: x[0], batch)


def _split_masks(rows: int) -> np.ndarray:
    """``[22, rows]`` row masks: the microbatches of M = 2, 4 and 16, in that order."""
    masks = []
    for m in (2, 4, 16):
        b = rows // m
        for j in range(m):
            masks.append((np.arange(rows) // b) == j)
    return np.asarray(masks)


@pytest.mark.parametrize("name", A.NAMES)
def test_objective_microbatch_sums_equal_the_batch(name, case):
    params, batch = case
    flat = _flat_batch(batch)
    logp, entropy = A.bigram_logp(params, flat)
    masks = jnp.asarray(_split_masks(A.ROWS))
    objectives = {agg: obj.make_objective(name, **A.overrides(name, agg)) for agg in obj.AGGREGATIONS}

    @jax.jit
    def run(logp):
        norms = normalisers(flat.loss_mask)
        out = {}
        for agg, f in objectives.items():
            full = view(flat, norms, entropy, None)
            stats = None if f.batch_stats is None else f.batch_stats(logp, full)
            loss, g = jax.value_and_grad(lambda x: f(x, view(flat, norms, entropy, stats))[0])(logp)

            def micro(row_mask):
                mb = flat.replace(loss_mask=flat.loss_mask & row_mask[:, None])
                return jax.value_and_grad(lambda x: f(x, view(mb, norms, entropy, stats))[0])(logp)

            losses, grads = jax.vmap(micro)(masks)
            out[agg] = (loss, g, losses, grads)
        return out

    for agg, (loss, g, losses, grads) in jax.device_get(run(logp)).items():
        assert abs(loss) > 1e-3 and np.abs(g).max() > 1e-3, (name, agg)  # not trivially zero
        for m, (lo, hi) in {2: (0, 2), 4: (2, 6), 16: (6, 22)}.items():
            np.testing.assert_allclose(losses[lo:hi].sum(), loss, rtol=RTOL, atol=1e-7, err_msg=f"{name} {agg} M={m}")
            np.testing.assert_allclose(grads[lo:hi].sum(0), g, rtol=RTOL, atol=1e-7, err_msg=f"{name} {agg} M={m}")


# One aggregation mode each, plus every objective with a statistic of the whole batch.
ACCUMULATE_CASES = [
    ("grpo", "seq_mean_token_mean"),       # the GRPO x4 (KL term included)
    ("grpo", "seq_mean_token_sum_norm"),   # Dr.GRPO
    ("cispo", "token_mean"),
    ("entr", "token_mean_kept"),           # denominator="kept_tokens"
    ("trm", "token_mean_kept"),            # sequence gate, kept-token count
    ("m2po", "token_mean"),                # batch-level mask
    ("sat", "token_mean"),                 # batch-level quantile
]


@pytest.mark.parametrize("name, aggregation", ACCUMULATE_CASES)
def test_accumulate_equals_one_microbatch(name, aggregation, case):
    """M = 4 (microbatch 3 = rows 12-15 holds padding only) equals M = 1: loss, gradient,
    log-probs and every objective metric (computed over the whole batch). For M2PO and SAT
    the scope of the statistic is pinned: taken per microbatch it would differ."""
    params, batch = case
    f = obj.make_objective(name, **A.overrides(name, aggregation))

    @jax.jit
    def run(params, batch):
        out = {}
        for m in (1, 4):
            acc = accumulate(f, A.bigram_logp, params, A.split(batch, m), batch_stats=f.batch_stats)
            out[f"M{m}"] = (acc.loss, acc.grads, acc.metrics, merge_microbatches(acc.logp))
        if name in ("m2po", "sat"):  # the same statistic per microbatch of M = 4 (what it must NOT be)
            lr = (out["M1"][3] - batch.logp_mu[0]).reshape(4, 4, -1)
            mask = batch.loss_mask[0].reshape(4, 4, -1)
            out["per_micro"] = [(obj.m2po_mask(lr[j], mask[j], 0.04), obj.sat_quantile(lr[j], mask[j], 0.9))
                                for j in range(4)]
        return out

    out = jax.device_get(run(params, batch))
    loss1, g1, m1, logp1 = out["M1"]
    assert np.linalg.norm(g1) > 1e-3
    loss, g, metrics, logp = out["M4"]
    np.testing.assert_allclose(loss, loss1, rtol=RTOL)
    np.testing.assert_allclose(g, g1, rtol=RTOL, atol=1e-7)
    np.testing.assert_allclose(logp, logp1, rtol=1e-6)
    assert metrics.keys() == m1.keys()
    for k in m1:
        np.testing.assert_allclose(metrics[k], m1[k], rtol=RTOL, atol=1e-6, err_msg=k)
    if name in ("m2po", "entr", "trm"):  # the gate is active: some tokens rejected
        assert 0.0 < m1["mask/fraction"] < 1.0
    loss_mask = np.asarray(batch.loss_mask[0]).reshape(4, 4, -1)
    if name == "m2po":  # a per-microbatch mask would reject a different number of tokens
        per_micro_rejected = sum(int(np.sum(mk & ~np.asarray(k))) for (k, _), mk in zip(out["per_micro"], loss_mask))
        assert per_micro_rejected != round(m1["mask/fraction"] * loss_mask.sum())
    if name == "sat":  # the whole batch's quantile, not any microbatch's
        assert m1["sat/frac_contracted"] > 0.0
        assert max(abs(float(q) - m1["sat/quantile"]) for _, q in out["per_micro"][:3]) > 0.05


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "m2po", "sat", "entr"])
def test_accumulate_sixteen_microbatches(name, case):
    """M = 16: microbatches 11-15 hold padding only."""
    aggs = ("seq_mean_token_mean", "token_mean_kept")
    cells = A.run_objective(name, case, aggregations=aggs, microbatches=(1, 16))
    for agg in aggs:
        (l1, g1, m1), (l16, g16, m16) = cells[(agg, 1)], cells[(agg, 16)]
        assert l16 == pytest.approx(l1, rel=RTOL)
        np.testing.assert_allclose(g16, g1, rtol=RTOL, atol=1e-7)
        for k in m1:
            assert m16[k] == pytest.approx(m1[k], rel=RTOL, abs=1e-6), k


def test_dr_grpo_normaliser_is_a_constant_not_the_pad_width():
    """Same tokens padded to 16 and to 64 positions: the same loss (Dr.GRPO's L_norm is a
    constant); l_norm=None is refused rather than defaulting to the padded width."""
    rng = np.random.default_rng(1)
    lp16 = rng.normal(size=(3, 16)).astype(np.float32) - 1.0
    mask16 = np.zeros((3, 16), bool)
    mask16[0, :5] = mask16[1, :9] = mask16[2, :2] = True

    def pad(x, fill):
        return np.concatenate([x, np.full((3, 48), fill, x.dtype)], axis=1)

    def loss(lp, mask, **kw):
        b = A.Batch(tokens=None, attention_mask=None, loss_mask=jnp.asarray(mask),
                    advantages=jnp.asarray(np.where(mask, [[1.0], [-0.5], [2.0]], 0.0), jnp.float32),
                    logp_mu=jnp.asarray(np.where(mask, lp - 0.1, 0.0)), entropy_mu=None, token_version=None)
        return float(obj.make_objective("grpo", aggregation="seq_mean_token_sum_norm", **kw)(jnp.asarray(lp), b)[0])

    l16 = loss(lp16, mask16, l_norm=16.0)
    l64 = loss(pad(lp16, -1.0), pad(mask16, False), l_norm=16.0)
    # r = e^0.1 = 1.105171 on every token (no clip at 1.2); l = -r A; sum over tokens
    # (5 * 1 - 9 * .5 + 2 * 2) * -1.105171 = -4.973270; / (G = 3 rows * L_norm = 16)
    assert abs(l16 - (-4.973270 / 48)) < 1e-6 and l64 == pytest.approx(l16, rel=1e-7)
    with pytest.raises(ValueError, match="l_norm"):
        loss(lp16, mask16)


@pytest.mark.slow
def test_full_table_all_ratios_are_one():
    rows = A.table()
    for r in rows:
        for m in A.MICROBATCHES:
            assert r.loss_ratio[m] == pytest.approx(1.0, rel=1e-4), (r.name, r.aggregation, m)
            assert r.grad_norm_ratio[m] == pytest.approx(1.0, rel=1e-4), (r.name, r.aggregation, m)
        assert r.max_metric_diff < 1e-4, (r.name, r.aggregation)


def test_the_objective_reads_a_frozen_typed_input_with_the_batch_values(case):
    """`view` builds an `ObjectiveInput` (not a getattr convention): frozen, carrying the
    batch's per-token fields and the optimizer batch's normalisers; an objective gives the
    same loss and metrics, bit for bit, as on the `Batch` itself (which counts them)."""
    import dataclasses

    from entr_jax.types import ObjectiveInput

    _, batch = case
    flat = _flat_batch(batch)
    entropy = jnp.full(flat.loss_mask.shape, 0.5, jnp.float32)
    inputs = view(flat, normalisers(flat.loss_mask), entropy, None)
    assert isinstance(inputs, ObjectiveInput)
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.logp_mu = flat.logp_mu
    assert float(inputs.num_loss_tokens) == float(np.sum(flat.loss_mask))
    assert inputs.entropy_pi is entropy and inputs.batch_stats is None
    logp = flat.logp_mu + 0.1 * jnp.cos(jnp.arange(flat.logp_mu.size, dtype=jnp.float32)
                                         ).reshape(flat.logp_mu.shape)
    f = obj.make_objective("entr")
    loss, metrics = f(logp, inputs)
    loss_b, metrics_b = f(logp, flat)
    assert np.asarray(loss).tobytes() == np.asarray(loss_b).tobytes() and abs(float(loss)) > 0
    assert {k: np.asarray(v).tobytes() for k, v in metrics.items()} == \
        {k: np.asarray(v).tobytes() for k, v in metrics_b.items()}
