"""Exact gradient accumulation over the M microbatches of one optimizer batch.

Every objective's loss is ``sum_{i,t} w_{i,t} l_{i,t} / D`` with ``w`` local to a row and
``D`` a normaliser of the whole optimizer batch (`entr_jax.objectives.aggregation`), so
the loss and gradient of the batch are the sums over its microbatches *provided each
microbatch is given the batch's normalisers and statistics*. `accumulate` does that:

1. the policy-independent normalisers ``num_loss_tokens`` and ``num_sequences``
   (`entr_jax.objectives.common.normalisers`) are counted on device from the whole batch
   before the microbatch loop (under ``jit`` the arrays are global, so on several
   processes they cover every process's rows);
2. if the objective needs statistics of the current policy over the whole batch
   (``objective.batch_stats``: M2PO's mask, SAT's quantile, the kept-token count of
   ``token_mean_kept``) and ``M > 1``, a forward-only pre-pass computes ``logp_pi`` of
   every microbatch and evaluates them on the whole batch; each microbatch then gets the
   scalars and its own rows of the per-row arrays (``batch.batch_stats``). With ``M = 1``
   the objective computes them itself, on the same batch;
3. ``lax.scan`` over the microbatches sums losses and gradients;
4. the objective's metrics describe the whole batch: with ``M > 1`` the objective is
   evaluated once more (no gradient, no model pass) on the whole batch with the
   ``logp_pi`` of step 3, so every metric is exactly what ``M = 1`` would report.

The extra forward of step 2 is the price of M2PO/SAT/``token_mean_kept`` under
accumulation; no other objective pays it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from entr_jax.objectives.common import normalisers
from entr_jax.types import Batch, ObjectiveInput

__all__ = ["Accumulated", "accumulate", "merge_microbatches", "view"]

LogpFn = Callable[[Any, Batch], tuple[jax.Array, jax.Array]]
LossFn = Callable[[jax.Array, ObjectiveInput], tuple[jax.Array, dict[str, jax.Array]]]


@dataclasses.dataclass
class Accumulated:
    """Result of `accumulate`.

    Attributes:
      loss: ``[] f32`` sum of the microbatch losses (the loss of the whole batch).
      grads: sum of the microbatch gradients (f32, structure of ``params``).
      metrics: the objective's metrics over the whole batch.
      logp, entropy: ``[M, b, T] f32`` log-probs and entropies of pi (detached).
    """

    loss: jax.Array
    grads: Any
    metrics: dict[str, jax.Array]
    logp: jax.Array
    entropy: jax.Array


def merge_microbatches(tree: Any) -> Any:
    """``[M, b, ...] -> [M * b, ...]`` on every array leaf (row ``m * b + i``: the host order
    of `learners.batching.make_batch`)."""
    return jax.tree.map(lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]), tree)


def view(batch: Batch, norms: dict, entropy_pi: jax.Array, stats: dict | None) -> ObjectiveInput:
    """What an objective reads (`entr_jax.types.ObjectiveInput`): the per-token fields of
    ``batch`` plus the optimizer-batch normalisers ``norms`` (`normalisers`), ``entropy_pi``
    and ``batch_stats``."""
    return ObjectiveInput(
        loss_mask=batch.loss_mask, advantages=batch.advantages, logp_mu=batch.logp_mu,
        entropy_mu=batch.entropy_mu, logp_prox=batch.logp_prox, logp_ref=batch.logp_ref,
        entropy_pi=entropy_pi, num_loss_tokens=norms["num_loss_tokens"],
        num_sequences=norms["num_sequences"], batch_stats=stats)


def _split_stats(stats: dict, num_micro: int, rows: int) -> tuple[dict, dict]:
    """Scalars (shared by every microbatch) and per-row arrays reshaped to ``[M, b, ...]``."""
    shared, per_row = {}, {}
    for key, value in stats.items():
        if value.ndim >= 1 and value.shape[0] == rows:
            per_row[key] = value.reshape((num_micro, rows // num_micro) + value.shape[1:])
        elif value.ndim == 0:
            shared[key] = value
        else:
            raise ValueError(
                f"batch statistic {key!r} must be a scalar or have the batch's {rows} rows "
                f"on axis 0, got shape {value.shape}"
            )
    return shared, per_row


def accumulate(
    loss_fn: LossFn,
    logp_fn: LogpFn,
    params: Any,
    batch: Batch,
    *,
    batch_stats: Callable[[jax.Array, ObjectiveInput], dict] | None = None,
    constrain: Callable[[Batch], Batch] = lambda mb: mb,
    constrain_grads: Callable[[Any], Any] = lambda g: g,
) -> Accumulated:
    """Loss, gradient and metrics of one optimizer batch split into M microbatches.

    Args:
      loss_fn: ``loss_fn(logp_pi, inputs) -> (loss, metrics)``, an objective (or the SFT
        loss) reading the normalisers and ``batch_stats`` from its `ObjectiveInput` (`view`).
      logp_fn: ``logp_fn(params, microbatch) -> (logp [b, T], entropy [b, T])``.
      params: the differentiated parameters.
      batch: the optimizer batch, every row field ``[M, b, ...]``.
      batch_stats: ``batch_stats(logp_pi, inputs) -> dict`` of optimizer-batch statistics
        (``objective.batch_stats``) or None.
      constrain, constrain_grads: sharding constraints applied to each microbatch and to
        the running gradient sum.

    Returns:
      `Accumulated` (see the module docstring for what is exact and why).
    """
    num_micro, rows = batch.tokens.shape[0], batch.tokens.shape[0] * batch.tokens.shape[1]
    norms = normalisers(batch.loss_mask)
    micro = batch.replace(num_loss_tokens=None)

    shared, per_row = None, {}
    if batch_stats is not None and num_micro > 1:
        logp, entropy = jax.lax.map(lambda mb: logp_fn(params, constrain(mb)), micro)
        whole = view(merge_microbatches(micro), norms, merge_microbatches(entropy), None)
        stats = jax.lax.stop_gradient(batch_stats(merge_microbatches(logp), whole))
        shared, per_row = _split_stats(stats, num_micro, rows)

    def micro_loss(p, mb, mb_stats):
        logp, entropy = logp_fn(p, mb)
        stats = None if shared is None else {**shared, **mb_stats}
        loss, metrics = loss_fn(logp, view(mb, norms, entropy, stats))
        return loss, (metrics, logp, entropy)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)
    zeros = constrain_grads(jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params))

    def body(carry, xs):
        grad_sum, loss_sum = carry
        mb, mb_stats = xs
        (loss, (metrics, logp, entropy)), grads = grad_fn(params, constrain(mb), mb_stats)
        grad_sum = constrain_grads(jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_sum, grads))
        return (grad_sum, loss_sum + loss), (metrics, jax.lax.stop_gradient(logp), entropy)

    (grads, loss), (stacked, logp, entropy) = jax.lax.scan(
        body, (zeros, jnp.zeros((), jnp.float32)), (micro, per_row))
    if num_micro == 1:
        metrics = jax.tree.map(lambda x: x[0], stacked)
    else:
        stats = None if shared is None else {**shared, **merge_microbatches(per_row)}
        whole = view(merge_microbatches(micro), norms, merge_microbatches(entropy), stats)
        metrics = loss_fn(merge_microbatches(logp), whole)[1]
    return Accumulated(loss=loss, grads=grads, metrics=metrics, logp=logp, entropy=entropy)
