"""Shared pieces of every objective: input reading and checks, ratios, the PPO clip, metrics.

Conventions (``docs/algorithms.md``, section 1):

* every ratio is ``exp(clip(log_a - log_b, -LOG_RATIO_CLIP, LOG_RATIO_CLIP))``;
* every mask and weight is computed from stop-gradient values; only ``logp_pi`` carries
  gradient;
* a token that is masked (``loss_mask`` false, or rejected by a gate) contributes exactly
  zero gradient even when its inputs are NaN or inf: inputs are replaced with ``jnp.where``
  *before* any arithmetic, never multiplied by a 0/1 mask.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import chex
import jax
import jax.numpy as jnp

from entr_jax.objectives.aggregation import aggregate, denominator

LOG_RATIO_CLIP = 20.0
"""Bound on every log-ratio before ``exp`` (as in the VESPO code, algorithms.md section 4)."""

Array = jax.Array
Metrics = dict[str, Array]


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The batch fields an objective reads, checked and sanitised.

    Every ``[B, T]`` array is float32 and 0 wherever ``loss_mask`` is false (so NaN/inf
    padding never reaches arithmetic). All fields but ``logp_pi`` are stop-gradient.

    Attributes:
      logp_pi: ``[B, T] f32`` current-policy log-probs (carries gradient).
      logp_mu: ``[B, T] f32`` behavior log-probs.
      advantages: ``[B, T] f32``.
      loss_mask: ``[B, T] bool``.
      num_loss_tokens: ``[] f32`` loss tokens of the optimizer batch
        (``batch.num_loss_tokens``, or the count of ``loss_mask`` when absent).
      num_sequences: ``[] f32`` rows with at least one loss token in the optimizer batch
        (``batch.num_sequences``, or counted on ``loss_mask`` when absent).
      entropy_mu, logp_prox, logp_ref, entropy_pi: ``[B, T] f32`` or None when absent.
      stats: ``batch.batch_stats``, the objective's statistics of the current policy over
        the whole optimizer batch (`entr_jax.objectives.BATCH_STATS`), or None: the
        objective then computes them on the batch it is given.
    """

    logp_pi: Array
    logp_mu: Array
    advantages: Array
    loss_mask: Array
    num_loss_tokens: Array
    num_sequences: Array
    entropy_mu: Array | None
    logp_prox: Array | None
    logp_ref: Array | None
    entropy_pi: Array | None
    stats: dict[str, Array] | None = None


def _check_float(x: Any, name: str, shape: tuple[int, ...]) -> Array:
    chex.assert_rank(x, 2, custom_message=f"argument `{name}` must be [B, T]")
    chex.assert_shape(x, shape, custom_message=f"argument `{name}` must match logp_pi's [B, T]")
    if not jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating):
        raise TypeError(f"argument `{name}` must be floating point, got dtype {jnp.asarray(x).dtype}")
    return jnp.asarray(x, jnp.float32)


def read_inputs(logp_pi: Array, batch: Any, sanitize: bool = True) -> Inputs:
    """Reads, checks (at trace time) and sanitises the fields of ``batch``.

    With ``sanitize=False`` the ``[B, T]`` arrays are returned as given (still cast to f32
    and stop-gradient): for objectives whose gate is a subset of ``loss_mask``, is false on
    non-finite inputs, and is applied with `gate` before any arithmetic, so a single
    ``where`` per input suffices (ENTR; this halves its memory traffic on CPU).

    ``batch`` is read only through the attributes ``logp_mu``, ``advantages``,
    ``loss_mask`` and the optional ``num_loss_tokens``, ``num_sequences``, ``entropy_mu``,
    ``logp_prox``, ``logp_ref``, ``entropy_pi``, ``batch_stats`` (``getattr`` with default
    None), so any object carrying them works. The normalisers and ``batch_stats`` describe
    the whole optimizer batch when ``batch`` is one microbatch of it (`learners.step`).

    Raises:
      AssertionError: (chex) a ``[B, T]`` field has the wrong rank or shape; the message
        names the argument.
      TypeError: a log-prob/advantage field is not floating point, or ``loss_mask`` is not
        bool; the message names the argument.
      TypeError: ``batch`` is a mapping (a dict): the message names ``ObjectiveInput``.
      ValueError: a required attribute is missing from ``batch``.
    """
    chex.assert_rank(logp_pi, 2, custom_message="argument `logp_pi` must be [B, T]")
    if not jnp.issubdtype(jnp.asarray(logp_pi).dtype, jnp.floating):
        raise TypeError(f"argument `logp_pi` must be floating point, got {jnp.asarray(logp_pi).dtype}")
    shape = tuple(logp_pi.shape)
    if isinstance(batch, Mapping):  # a dict's keys are not attributes: say which type is wanted
        raise TypeError(
            "argument `batch` must be an entr_jax.types.ObjectiveInput (its fields are read as "
            f"attributes), got a {type(batch).__name__} with keys {sorted(map(str, batch))}: "
            "pass ObjectiveInput(**batch)")
    for name in ("logp_mu", "advantages", "loss_mask"):
        if getattr(batch, name, None) is None:
            raise ValueError(f"batch.{name} is required by every objective but the "
                             f"{type(batch).__name__} passed as `batch` has no {name} (or it is "
                             "None); build the batch as entr_jax.types.ObjectiveInput")
    loss_mask = batch.loss_mask
    chex.assert_shape(loss_mask, shape, custom_message="argument `batch.loss_mask` must match logp_pi's [B, T]")
    if jnp.asarray(loss_mask).dtype != jnp.bool_:
        raise TypeError(f"argument `batch.loss_mask` must be bool, got {jnp.asarray(loss_mask).dtype}")
    loss_mask = jax.lax.stop_gradient(jnp.asarray(loss_mask))

    def field(name: str, required: bool = False) -> Array | None:
        x = getattr(batch, name, None)
        if x is None:
            return None
        x = jax.lax.stop_gradient(_check_float(x, f"batch.{name}", shape))
        return jnp.where(loss_mask, x, 0.0) if sanitize else x

    counts = normalisers(loss_mask)

    def scalar(name: str) -> Array:
        x = getattr(batch, name, None)
        if x is None:
            return counts[name]
        chex.assert_rank(x, 0, custom_message=f"argument `batch.{name}` must be a scalar")
        return jax.lax.stop_gradient(jnp.asarray(x, jnp.float32))

    stats = getattr(batch, "batch_stats", None)
    if stats is not None:
        stats = {k: jax.lax.stop_gradient(v) for k, v in stats.items()}
    lp = jnp.asarray(logp_pi, jnp.float32)
    return Inputs(
        logp_pi=jnp.where(loss_mask, lp, 0.0) if sanitize else lp,
        logp_mu=field("logp_mu"),
        advantages=field("advantages"),
        loss_mask=loss_mask,
        num_loss_tokens=scalar("num_loss_tokens"),
        num_sequences=scalar("num_sequences"),
        entropy_mu=field("entropy_mu"),
        logp_prox=field("logp_prox"),
        logp_ref=field("logp_ref"),
        entropy_pi=field("entropy_pi"),
        stats=stats,
    )


def normalisers(loss_mask: Array) -> dict[str, Array]:
    """The policy-independent normalisers of a batch, counted on its ``loss_mask``.

    Args:
      loss_mask: ``[..., T] bool`` (any leading axes, e.g. ``[M, b, T]`` microbatched).

    Returns:
      ``{"num_loss_tokens": [] f32, "num_sequences": [] f32}``: loss tokens, and rows with
      at least one loss token (``G`` of the sequence aggregations).
    """
    return {
        "num_loss_tokens": jnp.sum(loss_mask, dtype=jnp.float32),
        "num_sequences": jnp.sum(jnp.any(loss_mask, axis=-1), dtype=jnp.float32),
    }


def stat(inp: Inputs, name: str, compute) -> Array:
    """``inp.stats[name]`` when the batch carries its optimizer-batch statistics, else
    ``compute()`` on the batch given (the same value when it is the whole batch)."""
    if inp.stats is not None and name in inp.stats:
        return inp.stats[name]
    return compute()


def kept_count(inp: Inputs, keep: Array) -> Array:
    """Kept tokens of the optimizer batch: ``batch_stats["num_kept_tokens"]`` or the count of
    ``keep`` on this batch."""
    return stat(inp, "num_kept_tokens", lambda: jnp.sum(keep, dtype=jnp.float32))


def agg(inp: Inputs, loss_tok: Array, keep: Array, cfg, num_kept: Array | None = None) -> Array:
    """`aggregation.aggregate` of ``loss_tok`` over ``keep`` with the optimizer-batch
    normalisers of ``inp`` and ``cfg.mode`` / ``cfg.l_norm``. ``num_kept`` is the kept-token
    count (`kept_count`); None means ``keep`` is ``loss_mask`` (count = ``num_loss_tokens``)."""
    kept = inp.num_loss_tokens if num_kept is None else num_kept
    return aggregate(loss_tok, keep, inp.loss_mask, inp.num_loss_tokens, inp.num_sequences,
                     kept, cfg.mode, cfg.l_norm)


def normaliser(inp: Inputs, cfg, num_kept: Array | None = None) -> Array:
    """``D`` that `agg` divides by (`aggregation.denominator`, before the floor), the
    ``loss/normaliser`` metric; arguments as in `agg`."""
    kept = inp.num_loss_tokens if num_kept is None else num_kept
    return denominator(inp.num_loss_tokens, inp.num_sequences, kept, cfg.mode, cfg.l_norm)


def pg_metrics(inp: Inputs, loss: Array, cfg, num_kept: Array | None = None) -> Metrics:
    """``loss/pg`` and its ``loss/normaliser`` (`normaliser`), the weight that pools it over
    optimizer updates (`entr_jax.objectives.pooling`)."""
    return {"loss/pg": loss, "loss/normaliser": normaliser(inp, cfg, num_kept)}


def proximal(inp: Inputs, cfg: Any, cls_name: str) -> Array:
    """The proximal log-probs of ``cfg.ratio_mode``: ``batch.logp_prox`` in ``"decoupled"``
    mode (AReaL's decoupled loss), ``logp_mu`` in ``"bypass"`` mode (``prox := mu``).

    Raises:
      ValueError: ``"decoupled"`` mode and ``batch.logp_prox`` is None (names the field).
    """
    if cfg.ratio_mode == "bypass":
        return inp.logp_mu
    if inp.logp_prox is None:
        raise ValueError(
            f"{cls_name}.ratio_mode='decoupled' needs batch.logp_prox (log-probs of the "
            "proximal policy, the weights before the first update of the rollout batch), but "
            "it is None" + ("" if cls_name == "TisConfig" else
                            "; set ratio_mode='bypass' for the single-ratio pi/mu form")
        )
    return inp.logp_prox


def log_ratio(log_a: Array, log_b: Array) -> Array:
    """``clip(log_a - log_b, -20, 20)``: the only way a log-ratio is formed."""
    return jnp.clip(log_a - log_b, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)


def ratio(log_a: Array, log_b: Array) -> Array:
    """``exp(clip(log_a - log_b, -20, 20))``."""
    return jnp.exp(log_ratio(log_a, log_b))


def sg(x: Array) -> Array:
    """Stop-gradient (``sg[.]`` in the formulas)."""
    return jax.lax.stop_gradient(x)


def gate(keep: Array, *arrays: Array) -> tuple[Array, ...]:
    """Replaces every array by 0 where ``keep`` is false, before any arithmetic.

    This is what makes a rejected token's gradient exactly zero even if its inputs are
    NaN/inf: ``where`` routes the cotangent of the dropped branch to 0.
    """
    return tuple(jnp.where(keep, a, 0.0) for a in arrays)


def ppo_clip_loss(r: Array, adv: Array, lower: Array | float, upper: Array | float) -> tuple[Array, Array, Array]:
    """Per-token clipped surrogate loss (Schulman et al. 2017, eq. 7, negated).

    ``loss = -min(r A, clip(r, lower, upper) A)``. ``lower``/``upper`` may be scalars or
    ``[B, T]`` (SAT).

    Returns:
      ``(loss, clipped_low, clipped_high)``: ``[B, T] f32`` loss and ``[B, T] bool``
      indicators of tokens whose gradient the clip removes (``r < lower, A < 0`` and
      ``r > upper, A > 0``).
    """
    loss = -jnp.minimum(r * adv, jnp.clip(r, lower, upper) * adv)
    return loss, (r < lower) & (adv < 0), (r > upper) & (adv > 0)


def masked_mean(x: Array, mask: Array) -> Array:
    """Mean of ``x`` over ``mask`` (0 when the mask is empty; non-finite entries ignored)."""
    m = mask & jnp.isfinite(x)
    return jnp.sum(jnp.where(m, x, 0.0)) / jnp.maximum(jnp.sum(m, dtype=jnp.float32), 1.0)


def masked_max(x: Array, mask: Array) -> Array:
    """Max of ``x`` over ``mask`` (0 when the mask is empty; non-finite entries ignored)."""
    m = mask & jnp.isfinite(x)
    return jnp.where(jnp.any(m), jnp.max(jnp.where(m, x, -jnp.inf)), 0.0)


def fraction(flags: Array, mask: Array) -> Array:
    """Fraction of ``mask`` tokens where ``flags`` is true (0 when the mask is empty)."""
    return jnp.sum(flags & mask, dtype=jnp.float32) / jnp.maximum(jnp.sum(mask, dtype=jnp.float32), 1.0)


def stacked_sums(rows: dict[str, Array]) -> dict[str, Array]:
    """``{name: [] f32}``: the sum of each of the same-shape arrays ``rows`` (bool rows
    count as 0/1), in one stacked sum (in the rows' order) instead of one per row.

    XLA builds every row in one fused elementwise pass and reduces them with one reduction
    (on XLA:CPU each separate ``jnp.sum`` materialises its own f32 temporary and runs its
    own reduction). Counts below 2**24 are exact in any summation order; a float row is its
    ``jnp.sum`` up to the order of the float additions, which XLA fixes for neither form.
    """
    arrays = list(rows.values())
    sums = jnp.sum(jnp.stack([r.astype(jnp.float32) for r in arrays]),
                   axis=tuple(range(1, arrays[0].ndim + 1)))
    return {name: sums[i] for i, name in enumerate(rows)}


def base_metrics(
    inp: Inputs,
    keep: Array,
    clipped_low: Array | None = None,
    clipped_high: Array | None = None,
    *,
    means: dict[str, tuple[Array, Array, str]] | None = None,
) -> Metrics:
    """Metrics shared by every objective, over this batch's loss tokens.

    ``mask/fraction`` is the fraction of loss tokens *rejected* (rho_mask of ESTR, section
    3.2); ``tokens/kept`` the loss tokens kept; ``ratio_pi_mu/*`` describe
    ``exp(clip(logp_pi - logp_mu))`` (``ratio_pi_mu/count``: the loss tokens where it is
    finite, the denominator of its mean); ``clip/frac_*`` the fraction of loss tokens whose
    gradient the PPO clip removes. Each equals its `fraction` / `masked_mean` /
    `masked_max` form (the means of ``means`` up to the order of their float sum); every
    count and the sums of ``means`` are taken in one stacked pass (`stacked_sums`); the
    ratio's sum and max stay apart, since joining them made no gain
    (docs/performance.md). The counts are the weights that pool the means over optimizer
    updates (`entr_jax.objectives.pooling`).

    Args:
      inp, keep: the objective's inputs and ``[B, T] bool`` kept tokens.
      clipped_low, clipped_high: ``[B, T] bool`` from `ppo_clip_loss`, or None.
      means: further metrics ``{key: (x, valid, count_key)}``: the mean of ``x`` over
        ``valid`` (``[B, T]`` each; 0 when ``valid`` is empty) and, as ``count_key``, the
        number of ``valid`` tokens. ``valid`` must be false wherever ``x`` is not finite;
        ``(x, mask & isfinite(x))`` gives ``masked_mean(x, mask)``.
    """
    lm = inp.loss_mask
    r = jnp.exp(log_ratio(sg(inp.logp_pi), inp.logp_mu))
    r_valid = lm & jnp.isfinite(r)
    means = means or {}
    rows = {"loss": lm, "rejected": ~keep & lm, "ratio_valid": r_valid}
    rows.update({f"count:{key}": valid for key, (_, valid, _) in means.items()})
    if clipped_low is not None:
        rows.update(clip_low=clipped_low & keep & lm, clip_high=clipped_high & keep & lm)
    rows.update({f"sum:{key}": jnp.where(valid, x, 0.0) for key, (x, valid, _) in means.items()})
    sums = stacked_sums(rows)
    n_loss, n_r = sums["loss"], sums["ratio_valid"]
    den = jnp.maximum(n_loss, 1.0)
    m = {
        "mask/fraction": sums["rejected"] / den,
        "tokens/kept": n_loss - sums["rejected"],
        "ratio_pi_mu/mean": jnp.sum(jnp.where(r_valid, r, 0.0)) / jnp.maximum(n_r, 1.0),
        "ratio_pi_mu/max": jnp.where(n_r > 0, jnp.max(jnp.where(r_valid, r, -jnp.inf)), 0.0),
        "ratio_pi_mu/count": n_r,
    }
    if clipped_low is not None:
        m["clip/frac_low"] = sums["clip_low"] / den
        m["clip/frac_high"] = sums["clip_high"] / den
    for key, (_, _, count_key) in means.items():
        m[key] = sums[f"sum:{key}"] / jnp.maximum(sums[f"count:{key}"], 1.0)
        m[count_key] = sums[f"count:{key}"]
    return m


def f32_metrics(metrics: Metrics) -> Metrics:
    """Casts every metric to a float32 scalar."""
    return {k: jnp.asarray(v, jnp.float32).reshape(()) for k, v in metrics.items()}
