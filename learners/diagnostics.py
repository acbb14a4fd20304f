"""Per-token diagnostics of one optimizer step, and their reduction over a rollout batch.

`token_sums` turns the ``[..., T]`` arrays of an optimizer batch (any leading axes, e.g.
``[M, b, T]`` microbatched) into sums and maxima over its loss tokens; `finalize` turns
them into the logged metrics; `reduce_over_steps` reduces the metrics of the optimizer
steps of one rollout batch (mini-batches x epochs) to one record: the token diagnostics
are `finalize`-d once from the sums and maxima pooled over the updates
(`pool_token_sums`), every other metric follows its declared rule (`LEARNER_POOLING`,
`entr_jax.objectives.pooling.METRIC_POOLING`; the rules are in its docstring).

Metrics of one optimizer step (over its loss tokens; nats for entropies):

* ``tokens/num_loss_tokens``; ``entropy_pi/mean`` (full-vocabulary entropy of pi);
* ``entropy_mu/mean`` and ``ratio_by_entropy/b{i}/{count,delta_sq_mean,entropy_mean}``
  (`entr_jax.metrics.ratio_by_entropy_bucket_sums`) over the loss tokens whose behavior
  entropy is known (``batch.entropy_mu_valid``; a sampler's non-finite entropy is
  excluded, never averaged); ``tokens/entropy_mu_unknown`` counts the others;
* ``log_ratio_pi_mu/mean``, ``log_ratio_pi_mu/abs_max``; ``kl_mu_pi/k3``
  (`entr_jax.metrics.k3_sum`);
* every per-token log-ratio ``log(pi/mu)`` of these diagnostics (mean, ``abs_max``, the
  ``delta_sq`` of the entropy buckets, k3, the token ESS weights) is clipped to
  ``[-20, 20]`` (the objectives' `entr_jax.objectives.common.LOG_RATIO_CLIP`): with sampling filters
  a sampled token outside pi's kept set has ``logp_pi = LOGP_OUTSIDE_KEPT = -1e4``
  (`entr_jax.logprobs`), and one such token among 1000 would otherwise move the mean by
  -10 and set ``abs_max`` to ~1e4; clipped it counts as -20. The sequence weight of
  ``ess/seq_fraction`` clips the row's *sum* (below), as VCPO defines it;
* ``ess/token_fraction``: effective sample size over N of the token importance weights
  ``w = pi/mu``, ``(sum w)^2 / (N sum w^2)`` (Kong 1992; 1 on-policy, small when a few
  tokens carry the weight, an early sign of collapse under staleness);
  ``ess/seq_fraction``: the same for the sequence weights
  ``W_i = exp(clip(sum_t log(pi/mu), -20, 20))`` over rows with loss tokens (the
  ``rho_ess`` of VCPO, arXiv 2602.17616);
* ``staleness/mean``, ``staleness/max``: ``version - token_version`` with the version
  before the update;
* histograms ``hist/log_ratio_pi_mu`` and ``hist/entropy_pi`` with edges
  `HISTOGRAM_EDGES` (values outside are clamped into the end buckets).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from entr_jax import metrics as diag
from entr_jax.objectives import pooling
from entr_jax.objectives.common import LOG_RATIO_CLIP

__all__ = ["HISTOGRAM_EDGES", "LEARNER_POOLING", "finalize", "pool_token_sums", "reduce_over_steps", "token_sums"]

HISTOGRAM_EDGES: dict[str, np.ndarray] = {
    "hist/log_ratio_pi_mu": np.linspace(-2.0, 2.0, 41, dtype=np.float32),
    "hist/entropy_pi": np.linspace(0.0, 12.0, 49, dtype=np.float32),
}


def _masked_hist(x: jax.Array, mask: jax.Array, edges: np.ndarray) -> jax.Array:
    clipped = jnp.clip(x, edges[0], edges[-1]).reshape(-1)
    counts, _ = jnp.histogram(clipped, bins=jnp.asarray(edges), weights=mask.reshape(-1).astype(jnp.float32))
    return counts.astype(jnp.float32)


def token_sums(logp: jax.Array, entropy: jax.Array, batch: Any, version: jax.Array) -> tuple[dict, dict]:
    """Sums and maxima over the loss tokens of ``batch`` (``[..., T]`` fields).

    Args:
      logp, entropy: ``[..., T] f32`` log-probs and entropies of pi on the batch.
      batch: `entr_jax.types.Batch` with the same leading axes.
      version: ``[] int32`` learner version the staleness is measured against.

    Returns:
      ``(sums, maxes)`` dicts of f32 arrays for `finalize`.
    """
    mask = batch.loss_mask
    f32 = jnp.float32
    valid_h = mask if batch.entropy_mu_valid is None else mask & batch.entropy_mu_valid
    raw_log_ratio = jnp.where(mask, logp - batch.logp_mu, 0.0)
    log_ratio = jnp.clip(raw_log_ratio, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)  # see the module docstring
    ent = jnp.where(mask, entropy, 0.0)
    ent_mu = jnp.where(valid_h, batch.entropy_mu, 0.0)
    staleness = jnp.where(mask, (version - batch.token_version).astype(f32), 0.0)
    w = jnp.where(mask, jnp.exp(log_ratio), 0.0)
    rows = jnp.any(mask, axis=-1)
    seq_w = jnp.where(rows, jnp.exp(jnp.clip(jnp.sum(raw_log_ratio, axis=-1), -LOG_RATIO_CLIP, LOG_RATIO_CLIP)), 0.0)
    sums = {
        "tokens/num_loss_tokens": jnp.sum(mask, dtype=f32),
        "tokens/entropy_mu_unknown": jnp.sum(mask & ~valid_h, dtype=f32),
        "entropy_pi/sum": jnp.sum(ent),
        "entropy_mu/sum": jnp.sum(ent_mu),
        "entropy_mu/count": jnp.sum(valid_h, dtype=f32),
        "kl_mu_pi/k3_sum": diag.k3_sum(log_ratio, mask),
        **diag.ratio_by_entropy_bucket_sums(log_ratio, ent_mu, valid_h),
        "log_ratio_pi_mu/sum": jnp.sum(log_ratio),
        "staleness/sum": jnp.sum(staleness),
        "ess/w_sum": jnp.sum(w),
        "ess/w_sq_sum": jnp.sum(w * w),
        "ess/seq_count": jnp.sum(rows, dtype=f32),
        "ess/seq_w_sum": jnp.sum(seq_w),
        "ess/seq_w_sq_sum": jnp.sum(seq_w * seq_w),
        "hist/log_ratio_pi_mu": _masked_hist(log_ratio, mask, HISTOGRAM_EDGES["hist/log_ratio_pi_mu"]),
        "hist/entropy_pi": _masked_hist(ent, mask, HISTOGRAM_EDGES["hist/entropy_pi"]),
    }
    maxes = {
        "log_ratio_pi_mu/abs_max": jnp.max(jnp.abs(log_ratio)),
        "staleness/max": jnp.max(jnp.where(mask, staleness, -jnp.inf)),
    }
    return sums, maxes


def _ess_fraction(w_sum: jax.Array, w_sq_sum: jax.Array, n: jax.Array) -> jax.Array:
    """``(sum w)^2 / (n sum w^2)``; 1 when there is nothing to weigh. At most 1 exactly
    (Cauchy-Schwarz); float32 sums can round it an ulp above (e.g. three weights 1.1), so
    it is clipped at 1."""
    frac = w_sum * w_sum / jnp.maximum(n * w_sq_sum, 1e-30)
    return jnp.where(n > 0, jnp.minimum(frac, 1.0), 1.0)


def finalize(sums: dict, maxes: dict) -> dict[str, jax.Array]:
    """Metrics of one optimizer step from `token_sums` (see the module docstring)."""
    n_tok = jnp.maximum(sums["tokens/num_loss_tokens"], 1.0)
    return {
        "tokens/num_loss_tokens": sums["tokens/num_loss_tokens"],
        "tokens/entropy_mu_unknown": sums["tokens/entropy_mu_unknown"],
        "entropy_pi/mean": sums["entropy_pi/sum"] / n_tok,
        "entropy_mu/mean": sums["entropy_mu/sum"] / jnp.maximum(sums["entropy_mu/count"], 1.0),
        "kl_mu_pi/k3": sums["kl_mu_pi/k3_sum"] / n_tok,
        **diag.bucket_means(sums),
        "log_ratio_pi_mu/mean": sums["log_ratio_pi_mu/sum"] / n_tok,
        "log_ratio_pi_mu/abs_max": jnp.maximum(maxes["log_ratio_pi_mu/abs_max"], 0.0),
        "ess/token_fraction": _ess_fraction(sums["ess/w_sum"], sums["ess/w_sq_sum"], sums["tokens/num_loss_tokens"]),
        "ess/seq_fraction": _ess_fraction(sums["ess/seq_w_sum"], sums["ess/seq_w_sq_sum"], sums["ess/seq_count"]),
        "staleness/mean": sums["staleness/sum"] / n_tok,
        "staleness/max": jnp.maximum(maxes["staleness/max"], 0.0),
        "hist/log_ratio_pi_mu": sums["hist/log_ratio_pi_mu"],
        "hist/entropy_pi": sums["hist/entropy_pi"],
    }


UPDATES = "updates"
"""Rule of a number of optimizer updates (``train/applied``, ...): summed over the K updates."""
UPDATE_MEAN = "update_mean"
"""Rule of a per-update quantity with no token denominator (``train/grad_norm``): mean."""

LEARNER_POOLING: dict[str, str] = {
    "train/skipped": UPDATES,
    "train/empty": UPDATES,
    "train/applied": UPDATES,
    "train/nonfinite_loss": UPDATES,
    "train/nonfinite_grad": UPDATES,
    "train/param_norm": pooling.LAST,
    "train/learning_rate": pooling.LAST,
    "train/grad_norm": UPDATE_MEAN,
    "train/update_norm": UPDATE_MEAN,
    "loss": pooling.NORMALISER,
}
"""Rules of the metrics the learner step adds to the objective's (`learners.step`); the
token diagnostics of `finalize` are pooled from their sums instead (`reduce_over_steps`)."""


def pool_token_sums(sums: dict, maxes: dict, num_epochs: int) -> tuple[dict, dict]:
    """`token_sums` of K updates (``[K, ...]`` leaves) pooled into those of the rollout
    batch: sums added and divided by ``num_epochs`` (counts of one pass; every mean and
    ESS fraction of `finalize` is a ratio of sums, unchanged by the division), maxima
    maxed. ``finalize`` of the result is the value over every token the K updates trained
    on, each with the log-probs of its own update."""
    return ({k: jnp.sum(v, axis=0) / num_epochs for k, v in sums.items()},
            {k: jnp.max(v, axis=0) for k, v in maxes.items()})


def _rule(key: str, rules: Mapping[str, str]) -> str:
    if key not in rules:
        raise ValueError(
            f"reduce_over_steps: metric {key!r} has no pooling rule, so it cannot be reduced "
            "over the optimizer updates of a rollout batch; declare one in "
            "entr_jax.objectives.pooling.METRIC_POOLING (registry objectives) or in the "
            "Objective's metric_pooling field (a weight key, 'count', 'max', 'min' or "
            "'last'; see entr_jax.objectives.pooling)")
    return rules[key]


def reduce_over_steps(
    stacked: dict[str, jax.Array],
    num_epochs: int,
    *,
    diagnostic_sums: tuple[dict, dict] | None = None,
    rules: Mapping[str, str] | None = None,
) -> dict[str, jax.Array]:
    """One record for a rollout batch from the metrics of its K optimizer updates.

    Args:
      stacked: each metric's ``[K, ...]`` values (K = mini-batches x epochs, in the order
        the updates ran): the objective's metrics, the learner's (`LEARNER_POOLING`) and
        the token diagnostics of `finalize`.
      num_epochs: passes over the rollout batch (divides the counts).
      diagnostic_sums: the ``(sums, maxes)`` of `token_sums` of the K updates (``[K, ...]``
        leaves); required when ``stacked`` holds the token diagnostics.
      rules: pooling rules of the objective's metrics (default
        `entr_jax.objectives.METRIC_POOLING`); `LEARNER_POOLING` is added.

    Rules, by key, so that each record is the value over every token (row) the K updates
    trained on:

    * the token diagnostics (every key of `finalize`): ``finalize`` of the pooled sums and
      maxima (`pool_token_sums`): e.g. ``entropy_mu/mean`` is the sum of the entropies
      over the sum of ``entropy_mu/count``, ``ess/token_fraction`` the ratio of the pooled
      sums, ``log_ratio_pi_mu/abs_max`` and ``staleness/max`` the max; its counts
      (``tokens/*``, ``hist/*``, ``ratio_by_entropy/b{i}/count``) those of one pass;
    * a rule naming a metric (``"tokens/kept"``, ``"loss/normaliser"``, ...): the mean
      over the updates weighted by that metric's per-update values (equal weights when
      they are all 0): e.g. ``kl/k3`` by kept tokens, ``trm/seq_rejected/fraction`` by
      rows with loss tokens, ``loss`` and ``loss/pg`` by the aggregation's normaliser;
    * ``"count"``: summed over the updates and divided by ``num_epochs``;
    * ``"max"`` / ``"min"``: max / min over the updates;
    * ``"last"``: the last update's (``train/param_norm``, ``train/learning_rate``);
    * ``"updates"`` (``train/applied``, ``train/skipped``, ``train/empty``,
      ``train/nonfinite_loss``, ``train/nonfinite_grad``): summed (numbers of updates);
    * ``"update_mean"`` (``train/grad_norm``, ``train/update_norm``): mean over the K
      updates.

    The rules of the objectives' metrics are declared in `entr_jax.objectives.pooling`
    (one documented exception: ``sat/quantile``).

    Raises:
      ValueError: a metric has no rule (names it and where to declare one), a rule names
        a weight metric that ``stacked`` lacks (so the token diagnostics without
        ``diagnostic_sums`` are refused).
    """
    rules = {**(pooling.METRIC_POOLING if rules is None else rules), **LEARNER_POOLING}
    pooled = {} if diagnostic_sums is None else finalize(*pool_token_sums(*diagnostic_sums, num_epochs))
    k = next(iter(stacked.values())).shape[0] if stacked else 1
    out = {}
    for key, value in stacked.items():
        value = value.astype(jnp.float32)
        if key in pooled:
            out[key] = pooled[key]
            continue
        rule = _rule(key, rules)
        if rule == UPDATES:
            out[key] = jnp.sum(value, axis=0)
        elif rule == pooling.LAST:
            out[key] = value[-1]
        elif rule == UPDATE_MEAN:
            out[key] = jnp.mean(value, axis=0)
        elif rule == pooling.MAX:
            out[key] = jnp.max(value, axis=0)
        elif rule == pooling.MIN:
            out[key] = jnp.min(value, axis=0)
        elif rule == pooling.COUNT:
            out[key] = jnp.sum(value, axis=0) / num_epochs
        else:
            if rule not in stacked:
                raise ValueError(f"reduce_over_steps: metric {key!r} is weighted by {rule!r}, "
                                 "which the updates' metrics do not contain")
            weights = stacked[rule].astype(jnp.float32)
            total = jnp.sum(weights)
            norm_w = jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), 1.0 / k)
            out[key] = jnp.tensordot(norm_w, value, axes=1)
    return out
