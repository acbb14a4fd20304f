"""How each objective metric is pooled over the optimizer updates of one rollout batch.

With ``learner.minibatches x learner.epochs = K > 1`` the learner logs one record per
rollout batch from the K updates' metrics (`learners.diagnostics.reduce_over_steps`). A
mean or fraction pools exactly, to its value over every token (or row) the K updates
trained on, only when it is weighted by its *own* denominator: ``mask/fraction`` by loss
tokens, ``kl/k3`` by kept tokens, ``trm/seq_rejected/fraction`` by rows with loss tokens,
``loss/pg`` by the aggregation's normaliser ``D``. `METRIC_POOLING` declares, for every
metric an objective of the registry emits (every aggregation mode and option), one rule:

* a metric key (``"tokens/kept"``, ...): the mean over the K updates weighted by that
  count, which the objective emits too (or, for `LOSS_TOKENS`, the learner's token
  diagnostics);
* `COUNT`: a count of one update's batch; summed over the K updates and divided by the
  number of epochs (the count of one pass over the rollout batch);
* `MAX` / `MIN`: the max / min over the updates;
* `LAST`: the last update's (a value that does not change between updates).

The counts the weights need are metrics of their own:

* ``loss/normaliser``: ``D`` of the aggregation (`aggregation.denominator`, before the
  floor at 1): loss tokens (``token_mean``), kept tokens (``token_mean_kept``), rows with
  loss tokens (``seq_mean_token_mean``), those rows times ``l_norm``
  (``seq_mean_token_sum_norm``). The pooled ``loss/pg`` is then the aggregation over
  every update's tokens;
* ``tokens/kept``: loss tokens the gate keeps (`common.base_metrics`);
* ``ratio_pi_mu/count``: loss tokens with a finite ratio pi/mu;
* ``entr/score_count``: loss tokens with a finite ENTR score;
* ``sequences/with_loss_tokens``: rows with at least one loss token (GSPO, VESPO, TRM).

One metric does not pool exactly: ``sat/quantile`` is a quantile of each update's batch,
and a quantile of the union cannot be formed from them; its record is the loss-token
weighted mean of the per-update quantiles.

A metric without a rule is refused by the learner's reduction (ValueError naming it), so
a new metric cannot fall silently into a wrong weight: add it here (registry objectives)
or in ``objective.metric_pooling`` (a custom objective's extra keys).
"""

from __future__ import annotations

__all__ = ["COUNT", "KEPT_TOKENS", "LAST", "LOSS_TOKENS", "MAX", "METRIC_POOLING", "MIN", "NORMALISER",
           "SEQUENCES"]

COUNT, MAX, MIN, LAST = "count", "max", "min", "last"

LOSS_TOKENS = "tokens/num_loss_tokens"
"""Loss tokens of an update's optimizer batch, counted by the learner's token diagnostics
(`learners.diagnostics`), present in every learner record."""
KEPT_TOKENS = "tokens/kept"
SEQUENCES = "sequences/with_loss_tokens"
NORMALISER = "loss/normaliser"

METRIC_POOLING: dict[str, str] = {
    # losses: weighted by the aggregation's normaliser D
    "loss/pg": NORMALISER,
    "loss/kl": NORMALISER,
    # the counts the weights are
    NORMALISER: COUNT,
    KEPT_TOKENS: COUNT,
    SEQUENCES: COUNT,
    "ratio_pi_mu/count": COUNT,
    "entr/score_count": COUNT,
    "trm/seq_rejected/count": COUNT,
    "vespo/seq_zeroed/count": COUNT,
    # fractions and means over loss tokens
    "mask/fraction": LOSS_TOKENS,
    "clip/frac_low": LOSS_TOKENS,
    "clip/frac_high": LOSS_TOKENS,
    "is_weight/frac_truncated_low": LOSS_TOKENS,
    "is_weight/frac_truncated_high": LOSS_TOKENS,
    "m2po/m2_all": LOSS_TOKENS,
    "sat/quantile": LOSS_TOKENS,  # not exact: see the module docstring
    # means over other tokens
    "ratio_pi_mu/mean": "ratio_pi_mu/count",
    "entr/score_mean": "entr/score_count",
    "kl/k3": KEPT_TOKENS,
    "is_weight/mean": KEPT_TOKENS,
    "vespo/phi_mean": KEPT_TOKENS,
    "m2po/m2_kept": KEPT_TOKENS,
    "sat/frac_contracted": KEPT_TOKENS,
    # per-sequence fractions and means
    "mask/seq_fraction": SEQUENCES,
    "trm/seq_rejected/fraction": SEQUENCES,
    "vespo/seq_zeroed/fraction": SEQUENCES,
    "ratio_seq/mean": SEQUENCES,
    # extremes and settings
    "ratio_pi_mu/max": MAX,
    "is_weight/max": MAX,
    "ratio_mode/decoupled": LAST,
}
