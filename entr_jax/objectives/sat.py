"""SAT: Stale but Stable, staleness-adaptive trust regions (arXiv 2607.18722; algorithms.md 4.15).

    d = sg(log(pi/mu)),  q = quantile_alpha(|d|) over the batch's loss tokens
    (c_low, c_high) = `gates.sat_clip_factors(d, ...)`   (1 unless q > 0 and |d| > q)
    l = -min(r A, clip(r, 1 - clip_low * c_low, 1 + clip_high * c_high) A),  r = pi/mu

The endpoint on the side the ratio is already heading is contracted; pull-back updates are
unchanged; with c = 1 this is plain PPO/GRPO. Scope of the quantile: every loss token of the
*optimizer batch*. The paper takes it over "the current microbatch"; here the number of
microbatches is a memory knob that must not change the update, so the learner computes
``q`` once per optimizer step with `sat_batch_stats` on the whole batch and passes it to
every microbatch (``batch_stats["quantile"]``); run with one microbatch per optimizer step
(``learner.microbatches=1``) and set ``learner.minibatches`` to reproduce a per-microbatch
scope. Defaults: ``alpha = 0.9``, Hill exponent 2, clip 0.2/0.2; the Hill
kernel is UNKNOWN (INFERRED ``kernel="shifted"``, or ``"standard"``); aggregation
``token_mean`` (INFERRED).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax

from entr_jax.objectives import common as c
from entr_jax.objectives.aggregation import Aggregation, ObjectiveConfig, check_choice, check_range
from entr_jax.objectives.gates import sat_clip_factors, sat_quantile


@dataclasses.dataclass(frozen=True, kw_only=True)
class SatConfig(ObjectiveConfig):
    """SAT hyperparameters (module docstring).

    Attributes:
      alpha: quantile level of ``|log(pi/mu)|`` over the batch's loss tokens, in (0, 1).
      exponent: the Hill kernel's exponent (> 0).
      kernel: ``shifted`` or ``standard`` Hill kernel.
      clip_low: PPO clip band ``[1 - clip_low, 1 + clip_high]`` on the ratio (>= 0).
      clip_high: PPO clip band ``[1 - clip_low, 1 + clip_high]`` on the ratio (>= 0).
    """

    aggregation: Aggregation = "token_mean"
    alpha: float = 0.9
    exponent: float = 2.0
    kernel: Literal["shifted", "standard"] = "shifted"
    clip_low: float = 0.2
    clip_high: float = 0.2

    def __post_init__(self):
        super().__post_init__()
        check_range("SatConfig", "alpha", self.alpha, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
        check_range("SatConfig", "exponent", self.exponent, lo=0.0, lo_open=True)
        check_choice("SatConfig", "kernel", self.kernel, ("shifted", "standard"))
        self._clip()

    def uses_batch_stats(self) -> bool:
        return True


def sat_batch_stats(logp_pi: jax.Array, batch: Any, cfg: SatConfig) -> dict[str, jax.Array]:
    """SAT's optimizer-batch statistic: ``quantile``, `gates.sat_quantile` of
    ``|sg(logp_pi - logp_mu)|`` at level ``alpha`` over every loss token of the batch."""
    inp = c.read_inputs(logp_pi, batch)
    return {"quantile": sat_quantile(c.sg(inp.logp_pi) - inp.logp_mu, inp.loss_mask, cfg.alpha)}


def sat(logp_pi: jax.Array, batch: Any, cfg: SatConfig) -> tuple[jax.Array, c.Metrics]:
    """SAT loss. Returns ``(loss, metrics)``; metrics add ``sat/quantile`` and
    ``sat/frac_contracted``. The quantile is ``batch.batch_stats["quantile"]`` when given,
    else computed over this batch."""
    inp = c.read_inputs(logp_pi, batch)
    keep = inp.loss_mask
    d = c.sg(inp.logp_pi) - inp.logp_mu
    q = c.stat(inp, "quantile", lambda: sat_quantile(d, keep, cfg.alpha))
    c_low, c_high, contracted = sat_clip_factors(d, keep, cfg.alpha, cfg.exponent, cfg.kernel, q=q)
    r = c.ratio(inp.logp_pi, inp.logp_mu)
    loss_tok, lo, hi = c.ppo_clip_loss(r, inp.advantages, 1.0 - cfg.clip_low * c_low, 1.0 + cfg.clip_high * c_high)
    loss = c.agg(inp, loss_tok, keep, cfg)
    metrics = {**c.pg_metrics(inp, loss, cfg), **c.base_metrics(inp, keep, lo, hi)}
    metrics["sat/quantile"] = q
    metrics["sat/frac_contracted"] = c.fraction(contracted, keep)
    return loss, c.f32_metrics(metrics)
