"""Sequence-level objectives: GSPO, VESPO and Trust Region Masking (TRM).

All use the behavior policy mu as the denominator of the ratio (coupled setting).

* `gspo` (arXiv 2507.18071, eq. 5-7; algorithms.md 4.8), implemented as GSPO-token
  (ESPO eq. 3): ``s_i = exp(clip(mean_t (logp_pi - logp_mu)))`` over the row's loss tokens,
  ``s_{i,t} = sg(s_i) * pi/sg(pi)``, ``l = -min(s_{i,t} A, clip(s_{i,t}, 1-eps_l, 1+eps_h) A)``.
  With per-sequence advantages and ``seq_mean_token_mean`` (the default) value and gradient
  equal sequence-level GSPO. Defaults ``clip_low = 3e-4``, ``clip_high = 4e-4``.
* `vespo` (arXiv 2602.10693; algorithms.md 4.12): ``log W_i = clip(sum_t log(pi/mu))``
  (true product, no length normalisation), ``phi(W) = W**c1 exp(c2 (1 - W))`` with
  ``(c1, c2) = (2, 3)`` for ``A >= 0`` and ``(3, 2)`` for ``A < 0`` (repo code defaults;
  the paper's values are UNVERIFIED), ``l = -sg(phi(W_i)) A log pi``, ``token_mean``.
  The optional TIS factor of the reference code is not implemented. A long sequence with
  a small per-token gap gets a vanishing weight (1000 tokens at +0.012 give ``log W = 12``
  and ``phi = 0`` in f32); ``vespo/seq_zeroed/count`` and ``/fraction`` count the
  sequences whose weight is below `VESPO_ZERO_WEIGHT`.
* `trm` (arXiv 2512.23075; algorithms.md 4.11): `gates.trm_mask` rejects whole rows, then a
  PPO clip on pi/mu. Thresholds are UNKNOWN in the paper; defaults (INFERRED)
  ``criterion="max"``, ``threshold=0.05`` (i.e. ``|log r| <= 0.316`` on every token), clip
  0.2/0.2, ``token_mean``. ``trm/seq_rejected/count`` and ``/fraction`` count the rejected
  sequences.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp

from entr_jax.objectives import common as c
from entr_jax.objectives.aggregation import Aggregation, ObjectiveConfig, check_choice, check_range
from entr_jax.objectives.gates import trm_mask


def _seq_sum(x: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(jnp.where(mask, x, 0.0), axis=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GspoConfig(ObjectiveConfig):
    """GSPO hyperparameters.

    Attributes:
      clip_low: clip band ``[1 - clip_low, 1 + clip_high]`` of the length-normalised
        sequence ratio (paper: 3e-4).
      clip_high: upper side of that band (paper: 4e-4).
    """

    aggregation: Aggregation = "seq_mean_token_mean"
    clip_low: float = 3e-4
    clip_high: float = 4e-4

    def __post_init__(self):
        super().__post_init__()
        self._clip()


def gspo(logp_pi: jax.Array, batch: Any, cfg: GspoConfig) -> tuple[jax.Array, c.Metrics]:
    """GSPO(-token) loss. Returns ``(loss, metrics)``; metrics add ``ratio_seq/mean`` (over
    rows with loss tokens) and ``sequences/with_loss_tokens`` (those rows)."""
    inp = c.read_inputs(logp_pi, batch)
    keep = inp.loss_mask
    n_B = jnp.maximum(jnp.sum(keep, axis=1, dtype=jnp.float32), 1.0)
    seq_lr_B = c.log_ratio(_seq_sum(c.sg(inp.logp_pi) - inp.logp_mu, keep) / n_B, 0.0)
    s = jnp.exp(seq_lr_B[:, None] + inp.logp_pi - c.sg(inp.logp_pi))
    loss_tok, lo, hi = c.ppo_clip_loss(s, inp.advantages, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss = c.agg(inp, loss_tok, keep, cfg)
    rows = jnp.any(keep, axis=1)
    metrics = {**c.pg_metrics(inp, loss, cfg), **c.base_metrics(inp, keep, lo, hi)}
    metrics["ratio_seq/mean"] = c.masked_mean(jnp.exp(seq_lr_B), rows)
    metrics["sequences/with_loss_tokens"] = jnp.sum(rows, dtype=jnp.float32)
    return loss, c.f32_metrics(metrics)


@dataclasses.dataclass(frozen=True, kw_only=True)
class VespoConfig(ObjectiveConfig):
    """VESPO kernel exponents, ``phi(W) = W**c1 exp(c2 (1 - W))`` (all >= 0).

    Attributes:
      c1_pos: ``c1`` for sequences with advantage ``A >= 0``.
      c2_pos: ``c2`` for sequences with advantage ``A >= 0``.
      c1_neg: ``c1`` for sequences with advantage ``A < 0``.
      c2_neg: ``c2`` for sequences with advantage ``A < 0``.
    """

    aggregation: Aggregation = "token_mean"
    c1_pos: float = 2.0
    c2_pos: float = 3.0
    c1_neg: float = 3.0
    c2_neg: float = 2.0

    def __post_init__(self):
        super().__post_init__()
        for f in ("c1_pos", "c2_pos", "c1_neg", "c2_neg"):
            check_range("VespoConfig", f, getattr(self, f), lo=0.0)


VESPO_ZERO_WEIGHT = 1e-6
"""A VESPO sequence counts as zeroed out when its weight ``phi(W)`` is below this on every
loss token (its gradient is scaled by less than one millionth)."""


def vespo_kernel(log_w: jax.Array, c1: jax.Array | float, c2: jax.Array | float) -> jax.Array:
    """``phi(W) = W**c1 exp(c2 (1 - W))`` from ``log W`` (clipped to +-20); ``phi(1) = 1``."""
    lw = jnp.clip(log_w, -c.LOG_RATIO_CLIP, c.LOG_RATIO_CLIP)
    return jnp.exp(c1 * lw + c2 * (1.0 - jnp.exp(lw)))


def vespo(logp_pi: jax.Array, batch: Any, cfg: VespoConfig) -> tuple[jax.Array, c.Metrics]:
    """VESPO loss. Returns ``(loss, metrics)``; metrics add ``vespo/phi_mean`` (over loss
    tokens), ``vespo/seq_zeroed/count`` and ``vespo/seq_zeroed/fraction`` (rows with loss
    tokens whose ``phi < VESPO_ZERO_WEIGHT`` on every loss token, and their fraction of the
    rows with loss tokens) and ``sequences/with_loss_tokens`` (those rows)."""
    inp = c.read_inputs(logp_pi, batch)
    keep = inp.loss_mask
    log_w_B = c.log_ratio(_seq_sum(c.sg(inp.logp_pi) - inp.logp_mu, keep), 0.0)
    pos = inp.advantages >= 0
    phi = vespo_kernel(
        jnp.broadcast_to(log_w_B[:, None], keep.shape),
        jnp.where(pos, cfg.c1_pos, cfg.c1_neg),
        jnp.where(pos, cfg.c2_pos, cfg.c2_neg),
    )
    loss_tok = -c.sg(phi) * inp.advantages * inp.logp_pi
    loss = c.agg(inp, loss_tok, keep, cfg)
    metrics = {**c.pg_metrics(inp, loss, cfg), **c.base_metrics(inp, keep),
               "vespo/phi_mean": c.masked_mean(phi, keep)}
    rows = jnp.any(keep, axis=1)
    zeroed = rows & jnp.all(~keep | (phi < VESPO_ZERO_WEIGHT), axis=1)
    metrics.update(_seq_counts("vespo/seq_zeroed", zeroed, rows))
    return loss, c.f32_metrics(metrics)


def _seq_counts(prefix: str, flags_B: jax.Array, rows_B: jax.Array) -> c.Metrics:
    """``{prefix}/count`` (rows flagged), ``{prefix}/fraction`` (of ``rows_B``) and
    ``sequences/with_loss_tokens`` (the rows of ``rows_B``, the fraction's denominator)."""
    count = jnp.sum(flags_B & rows_B, dtype=jnp.float32)
    rows = jnp.sum(rows_B, dtype=jnp.float32)
    return {f"{prefix}/count": count, f"{prefix}/fraction": count / jnp.maximum(rows, 1.0),
            "sequences/with_loss_tokens": rows}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrmConfig(ObjectiveConfig):
    """TRM hyperparameters (module docstring).

    Attributes:
      criterion: ``max`` (the largest per-token k2 of a sequence) or ``mean`` (the mean
        per-token k3) is compared with ``threshold``.
      threshold: a sequence is kept when its criterion is at most this (> 0).
      clip_low: PPO clip band ``[1 - clip_low, 1 + clip_high]`` on the ratio (>= 0).
      clip_high: PPO clip band ``[1 - clip_low, 1 + clip_high]`` on the ratio (>= 0).
    """

    aggregation: Aggregation = "token_mean"
    criterion: Literal["max", "mean"] = "max"
    threshold: float = 0.05
    clip_low: float = 0.2
    clip_high: float = 0.2

    def __post_init__(self):
        super().__post_init__()
        check_choice("TrmConfig", "criterion", self.criterion, ("max", "mean"))
        check_range("TrmConfig", "threshold", self.threshold, lo=0.0, lo_open=True)
        self._clip()

    def uses_batch_stats(self) -> bool:
        return self.mode == "token_mean_kept"


def _trm_keep(inp: c.Inputs, cfg: TrmConfig) -> jax.Array:
    return trm_mask(c.sg(inp.logp_pi) - inp.logp_mu, inp.loss_mask, cfg.threshold, cfg.criterion)


def trm_batch_stats(logp_pi: jax.Array, batch: Any, cfg: TrmConfig) -> dict[str, jax.Array]:
    """``num_kept_tokens`` of the optimizer batch (denominator of ``token_mean_kept``)."""
    keep = _trm_keep(c.read_inputs(logp_pi, batch), cfg)
    return {"num_kept_tokens": jnp.sum(keep, dtype=jnp.float32)}


def trm(logp_pi: jax.Array, batch: Any, cfg: TrmConfig) -> tuple[jax.Array, c.Metrics]:
    """TRM loss. Returns ``(loss, metrics)``; metrics add ``mask/seq_fraction`` (rejected
    rows among rows with loss tokens), ``trm/seq_rejected/count`` / ``/fraction`` and
    ``sequences/with_loss_tokens`` (the rows with loss tokens)."""
    inp = c.read_inputs(logp_pi, batch)
    keep = _trm_keep(inp, cfg)
    lp, lmu, adv = c.gate(keep, inp.logp_pi, inp.logp_mu, inp.advantages)
    loss_tok, lo, hi = c.ppo_clip_loss(c.ratio(lp, lmu), adv, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    num_kept = c.kept_count(inp, keep)
    loss = c.agg(inp, loss_tok, keep, cfg, num_kept)
    metrics = {**c.pg_metrics(inp, loss, cfg, num_kept), **c.base_metrics(inp, keep, lo, hi)}
    rows = jnp.any(inp.loss_mask, axis=1)
    metrics["mask/seq_fraction"] = c.fraction(~jnp.any(keep, axis=1), rows)
    metrics.update(_seq_counts("trm/seq_rejected", ~jnp.any(keep, axis=1), rows))
    return loss, c.f32_metrics(metrics)
