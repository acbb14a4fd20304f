"""GRPO / DAPO / Dr.GRPO clipped surrogate on pi/mu, with optional k3 KL to a reference.

Formula (DeepSeekMath, arXiv 2402.03300, eq. 3; algorithms.md 4.1-4.3), negated:

    r  = exp(clip(logp_pi - logp_mu, -20, 20))
    l  = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) + kl_coef * k3
    k3 = exp(logp_ref - logp_pi) - (logp_ref - logp_pi) - 1    (eq. 4, Schulman's k3)

``pi_old`` of the paper is the behavior policy mu here (the coupled/"bypass" setting of
the ESTR experiments). ``clip_low != clip_high`` is DAPO's clip-higher (arXiv 2503.14476,
eq. 10: 0.2/0.28). Defaults: symmetric 0.2 (paper), ``aggregation="seq_mean_token_mean"``
(paper; DAPO: ``token_mean``; Dr.GRPO: ``seq_mean_token_sum_norm``), ``kl_coef = 0``
(the paper uses 0.04; with ``kl_coef > 0`` the learner computes ``logp_ref`` under the
frozen reference policy, by default the policy RL starts from, `experiments.run.reference`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from entr_jax.objectives import common as c
from entr_jax.objectives.aggregation import Aggregation, ObjectiveConfig, check_range


@dataclasses.dataclass(frozen=True, kw_only=True)
class GrpoConfig(ObjectiveConfig):
    """GRPO hyperparameters.

    Attributes:
      clip_low: clip band ``[1 - clip_low, 1 + clip_high]``; default 0.2/0.2.
      clip_high: clip band ``[1 - clip_low, 1 + clip_high]``; default 0.2/0.2.
      kl_coef: weight of the k3 KL to ``batch.logp_ref`` (>= 0; 0 disables it).
      aggregation: default ``seq_mean_token_mean``.
    """

    aggregation: Aggregation = "seq_mean_token_mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        self._clip()
        check_range("GrpoConfig", "kl_coef", self.kl_coef, lo=0.0)

    def inputs(self) -> frozenset[str]:
        return frozenset({"logp_ref"}) if self.kl_coef > 0 else frozenset()


def k3_kl(logp_pi: jax.Array, logp_ref: jax.Array) -> jax.Array:
    """Per-token k3 estimate of KL(pi || ref): ``exp(x) - x - 1``, ``x = clip(ref - pi)``."""
    x = c.log_ratio(logp_ref, logp_pi)
    return jnp.exp(x) - x - 1.0


def grpo(logp_pi: jax.Array, batch: Any, cfg: GrpoConfig) -> tuple[jax.Array, c.Metrics]:
    """GRPO loss; ``[B, T]`` inputs as in `common.read_inputs`. Returns ``(loss, metrics)``.

    Metrics add ``loss/kl`` and ``kl/k3`` (mean k3 over loss tokens) when ``kl_coef > 0``.

    Raises:
      ValueError: ``kl_coef > 0`` and ``batch.logp_ref`` is None.
    """
    inp = c.read_inputs(logp_pi, batch)
    if cfg.kl_coef > 0 and inp.logp_ref is None:
        raise ValueError(f"GrpoConfig.kl_coef={cfg.kl_coef} > 0 needs batch.logp_ref, but it is None")
    keep = inp.loss_mask
    r = c.ratio(inp.logp_pi, inp.logp_mu)
    loss_tok, lo, hi = c.ppo_clip_loss(r, inp.advantages, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    pg = c.agg(inp, loss_tok, keep, cfg)
    metrics = {**c.pg_metrics(inp, pg, cfg), **c.base_metrics(inp, keep, lo, hi)}
    loss = pg
    if cfg.kl_coef > 0:
        kl_tok = k3_kl(inp.logp_pi, inp.logp_ref)
        kl = c.agg(inp, kl_tok, keep, cfg)
        loss = pg + cfg.kl_coef * kl
        metrics["loss/kl"] = kl
        metrics["kl/k3"] = c.masked_mean(c.sg(kl_tok), keep)
    return loss, c.f32_metrics(metrics)
