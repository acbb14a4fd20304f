"""Objectives without a PPO clip: CISPO (clipped detached IS weight) and M2PO.

Both use the behavior policy mu as the denominator (coupled setting), ``token_mean``.

* `cispo` (MiniMax-M1, arXiv 2506.13585, eq. 4; algorithms.md 4.9):
  ``l = -sg(clip(r, 1 - clip_low, 1 + clip_high)) A log pi``, ``r = pi/mu``; the lower
  bound is disabled by default (``clip_low=None``). ``clip_high`` is UNKNOWN/unverified in
  the source; default 0.3 (INFERRED from a secondary source). Every token keeps a gradient.
* `m2po` (arXiv 2510.01161; algorithms.md 4.10): `gates.m2po_mask` rejects the tokens with
  the largest ``(log r)**2`` until the mean of the rest is ``<= tau``, then ``l = -M r A``
  with no clip. ``tau = 0.04`` (INFERRED/recalled). Scope of the mask: every loss token of
  the *optimizer batch* (as in the paper and AReaL). Under gradient accumulation the
  learner computes it once per optimizer step with `m2po_batch_stats` on the whole batch
  (``batch_stats["keep"]``) and hands each microbatch its slice, so the decisions do not
  depend on the number of microbatches.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from entr_jax.objectives import common as c
from entr_jax.objectives.aggregation import Aggregation, ObjectiveConfig, check_range
from entr_jax.objectives.gates import m2po_mask


@dataclasses.dataclass(frozen=True, kw_only=True)
class CispoConfig(ObjectiveConfig):
    """CISPO weight bounds on the stop-gradient ratio ``r = pi/mu``.

    Attributes:
      clip_low: the weight is at least ``1 - clip_low`` (in [0, 1)); None: no lower bound.
      clip_high: the weight is at most ``1 + clip_high`` (>= 0).
    """

    aggregation: Aggregation = "token_mean"
    clip_low: float | None = None
    clip_high: float = 0.3

    def __post_init__(self):
        super().__post_init__()
        if self.clip_low is not None:
            check_range("CispoConfig", "clip_low", self.clip_low, lo=0.0, hi=1.0, hi_open=True)
        check_range("CispoConfig", "clip_high", self.clip_high, lo=0.0)


def cispo(logp_pi: jax.Array, batch: Any, cfg: CispoConfig) -> tuple[jax.Array, c.Metrics]:
    """CISPO loss. Returns ``(loss, metrics)``.

    Metrics add ``is_weight/frac_truncated_low|high``: the fraction of loss tokens whose
    weight the lower / upper bound truncates. There is no ``clip/frac_*``: that metric
    counts tokens whose gradient a clip removes (``docs/algorithms.md`` section 1), and
    CISPO's bounds remove none (the truncated weight is detached; every token keeps the
    gradient of ``log pi``).
    """
    inp = c.read_inputs(logp_pi, batch)
    keep = inp.loss_mask
    r = c.ratio(c.sg(inp.logp_pi), inp.logp_mu)
    lower = 0.0 if cfg.clip_low is None else 1.0 - cfg.clip_low
    w = jnp.clip(r, lower, 1.0 + cfg.clip_high)
    loss_tok = -w * inp.advantages * inp.logp_pi
    loss = c.agg(inp, loss_tok, keep, cfg)
    metrics = {**c.pg_metrics(inp, loss, cfg), **c.base_metrics(inp, keep),
               "is_weight/frac_truncated_low": c.fraction(r < lower, keep),
               "is_weight/frac_truncated_high": c.fraction(r > 1.0 + cfg.clip_high, keep)}
    return loss, c.f32_metrics(metrics)


@dataclasses.dataclass(frozen=True, kw_only=True)
class M2poConfig(ObjectiveConfig):
    """M2PO hyperparameters.

    Attributes:
      tau: second-moment bound: the tokens of largest ``(log r)**2`` are masked until the
        mean of the rest is at most this (> 0).
    """

    aggregation: Aggregation = "token_mean"
    tau: float = 0.04

    def __post_init__(self):
        super().__post_init__()
        check_range("M2poConfig", "tau", self.tau, lo=0.0, lo_open=True)

    def uses_batch_stats(self) -> bool:
        return True


def _m2po_keep(inp: c.Inputs, lr: jax.Array, cfg: M2poConfig) -> jax.Array:
    return m2po_mask(lr, inp.loss_mask, cfg.tau)


def m2po_batch_stats(logp_pi: jax.Array, batch: Any, cfg: M2poConfig) -> dict[str, jax.Array]:
    """M2PO's optimizer-batch statistics: ``keep`` (``[B, T] bool``, the mask of
    `gates.m2po_mask` over every loss token of the batch) and ``num_kept_tokens``."""
    inp = c.read_inputs(logp_pi, batch)
    keep = _m2po_keep(inp, c.sg(inp.logp_pi) - inp.logp_mu, cfg)  # raw: the gate clips
    return {"keep": keep, "num_kept_tokens": jnp.sum(keep, dtype=jnp.float32)}


def m2po(logp_pi: jax.Array, batch: Any, cfg: M2poConfig) -> tuple[jax.Array, c.Metrics]:
    """M2PO loss. Returns ``(loss, metrics)``; metrics add ``m2po/m2_all`` and
    ``m2po/m2_kept`` (mean ``(log r)**2`` over loss and kept tokens).

    The mask is ``batch.batch_stats["keep"]`` when given (the optimizer batch's, sliced to
    this microbatch), else `gates.m2po_mask` over this batch."""
    inp = c.read_inputs(logp_pi, batch)
    lr = c.log_ratio(c.sg(inp.logp_pi), inp.logp_mu)
    keep = inp.loss_mask & c.stat(inp, "keep", lambda: _m2po_keep(inp, c.sg(inp.logp_pi) - inp.logp_mu, cfg))
    lp, lmu, adv = c.gate(keep, inp.logp_pi, inp.logp_mu, inp.advantages)
    loss_tok = -c.ratio(lp, lmu) * adv
    num_kept = c.kept_count(inp, keep)
    loss = c.agg(inp, loss_tok, keep, cfg, num_kept)
    metrics = {**c.pg_metrics(inp, loss, cfg, num_kept), **c.base_metrics(inp, keep)}
    metrics["m2po/m2_all"] = c.masked_mean(lr * lr, inp.loss_mask)
    metrics["m2po/m2_kept"] = c.masked_mean(lr * lr, keep)
    return loss, c.f32_metrics(metrics)
