"""ENTR (Entropy-Normalized Trust Region), published as ESTR, arXiv 2607.22186.

Formula (section 3.2 of ``algorithms.md``; paper section 3, loss eq. as transcribed):

    r = exp(clip(logp_pi - logp_mu, -20, 20)),   delta = sg(logp_pi - logp_mu)
    S = delta**2 / (H + eps),                     M = 1[S <= tau]
    L = (1/N) sum_{i,t} M * -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)

One ratio (pi/mu) for both the mask and the clip: no proximal or recomputed old policy
(INFERRED from "no auxiliary forward passes"). ``M`` is recomputed at every call from the
current ``logp_pi``. Defaults: ``eps = 0.01`` (paper), ``tau = 1.0`` (UNKNOWN in the paper;
project default, sweep {0.25, 0.5, 1, 2, 4}), ``clip_low/high = 0.2/0.28`` (UNKNOWN;
INFERRED DAPO-style), token-mean over all response tokens (``denominator="all_tokens"``,
as transcribed; ``"kept_tokens"`` follows slime PR #657). No KL, no entropy bonus
(INFERRED).

``entropy_source``:
* ``behavior_full`` (paper): ``batch.entropy_mu``, the full-vocabulary entropy of the
  distribution the token was sampled from.
* ``behavior_topk``: also ``batch.entropy_mu``, where the engine could only export an
  estimate from its top-k log-probs (INFERRED stand-in; the objective cannot tell the two
  apart, the name records what the sampler provided). With the SGLang fleet it is the
  midpoint of guaranteed bounds (``samplers/sglang_entropy.py``): ``|error| <=`` the
  reported half-width (its measured bias: ``docs/sglang.md`` section 4), so S is scaled by
  ``(H + eps) / (H_est + eps)``. The main job
  requires ``behavior_topk`` with ``sampler.kind='sglang'`` and ``behavior_full`` with the
  embedded sampler (exact entropies), and records the number of estimated tokens per
  batch (``sampler/entropy_estimated_tokens``).
* ``current_full``: ``batch.entropy_pi``, the trainer-side entropy of pi at the same
  positions (INFERRED stand-in (a) of section 3.3; not the paper's definition).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp

from entr_jax.objectives import common as c
from entr_jax.objectives.aggregation import Aggregation, ObjectiveConfig, check_choice, check_range
from entr_jax.objectives.gates import entr_mask, entr_score

EntropySource = Literal["behavior_full", "behavior_topk", "current_full"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EntrConfig(ObjectiveConfig):
    """ENTR hyperparameters (see the module docstring for sources and status).

    Attributes:
      tau: keep threshold on S (> 0). UNKNOWN in the paper; default 1.0.
      eps: entropy floor in nats (>= 0). Paper: 0.01.
      clip_low: PPO clip band ``[1 - clip_low, 1 + clip_high]`` on pi/mu.
      clip_high: PPO clip band ``[1 - clip_low, 1 + clip_high]`` on pi/mu.
      entropy_source: ``behavior_full`` | ``behavior_topk`` | ``current_full``.
      denominator: ``all_tokens`` (as transcribed) | ``kept_tokens``; ``kept_tokens``
        needs ``aggregation`` in {token_mean, token_mean_kept} and turns it into
        ``token_mean_kept``; ``all_tokens`` with ``aggregation="token_mean_kept"`` is a
        contradiction and raises ValueError.
      aggregation: default ``token_mean``.
    """

    aggregation: Aggregation = "token_mean"
    tau: float = 1.0
    eps: float = 0.01
    clip_low: float = 0.2
    clip_high: float = 0.28
    entropy_source: EntropySource = "behavior_full"
    denominator: Literal["all_tokens", "kept_tokens"] = "all_tokens"

    def __post_init__(self):
        super().__post_init__()
        check_range("EntrConfig", "tau", self.tau, lo=0.0, lo_open=True)
        check_range("EntrConfig", "eps", self.eps, lo=0.0)
        self._clip()
        check_choice("EntrConfig", "entropy_source", self.entropy_source, ("behavior_full", "behavior_topk", "current_full"))
        check_choice("EntrConfig", "denominator", self.denominator, ("all_tokens", "kept_tokens"))
        if self.denominator == "kept_tokens" and self.aggregation not in ("token_mean", "token_mean_kept"):
            raise ValueError(
                f"EntrConfig.denominator='kept_tokens' needs aggregation 'token_mean' or "
                f"'token_mean_kept', got aggregation={self.aggregation!r}"
            )
        if self.denominator == "all_tokens" and self.aggregation == "token_mean_kept":
            raise ValueError(
                "EntrConfig.aggregation='token_mean_kept' divides by the kept tokens, but "
                "EntrConfig.denominator='all_tokens' asks for all response tokens; set "
                "denominator='kept_tokens' (kept tokens) or aggregation='token_mean' (all "
                "tokens)"
            )

    @property
    def mode(self) -> str:
        return "token_mean_kept" if self.denominator == "kept_tokens" else self.aggregation

    def inputs(self) -> frozenset[str]:
        return frozenset({"entropy_pi" if self.entropy_source == "current_full" else "entropy_mu"})

    def uses_batch_stats(self) -> bool:
        return self.mode == "token_mean_kept"


def _entropy(inp: c.Inputs, cfg: EntrConfig) -> jax.Array:
    if cfg.entropy_source == "current_full":
        if inp.entropy_pi is None:
            raise ValueError(
                "EntrConfig.entropy_source='current_full' needs batch.entropy_pi ([B, T] "
                "trainer-side entropy of pi), but the batch has none"
            )
        return inp.entropy_pi
    if inp.entropy_mu is None:
        raise ValueError(f"EntrConfig.entropy_source={cfg.entropy_source!r} needs batch.entropy_mu")
    return inp.entropy_mu


def _keep(inp: c.Inputs, cfg: EntrConfig) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(keep, delta, entropy)``: the ENTR gate on the loss tokens (decided on the raw
    log-ratio, so a non-finite log-prob is rejected) and the clipped ``delta``."""
    entropy = _entropy(inp, cfg)
    raw = c.sg(inp.logp_pi) - inp.logp_mu
    keep = inp.loss_mask & entr_mask(raw, entropy, cfg.tau, cfg.eps)
    return keep, c.log_ratio(c.sg(inp.logp_pi), inp.logp_mu), entropy


def entr_batch_stats(logp_pi: jax.Array, batch: Any, cfg: EntrConfig) -> dict[str, jax.Array]:
    """Optimizer-batch statistic of ENTR: ``num_kept_tokens`` (tokens the gate keeps), the
    denominator of ``denominator="kept_tokens"``. Inputs as in `entr`."""
    keep, _, _ = _keep(c.read_inputs(logp_pi, batch, sanitize=False), cfg)
    return {"num_kept_tokens": jnp.sum(keep, dtype=jnp.float32)}


def entr(logp_pi: jax.Array, batch: Any, cfg: EntrConfig) -> tuple[jax.Array, c.Metrics]:
    """ENTR loss. ``logp_pi``: ``[B, T]`` float; ``batch``: see `common.read_inputs`.

    Returns ``(loss [] f32, metrics)``; metrics add ``entr/score_mean`` (mean S over the
    loss tokens where it is finite) and ``entr/score_count`` (those tokens) to the base
    ones.

    Raises:
      ValueError: ``entropy_source="current_full"`` and ``batch.entropy_pi`` is missing, or
        ``entropy_mu`` is missing for the behavior sources.
    """
    # The ENTR gate is false on non-finite inputs and is intersected with loss_mask, so the
    # one `gate` below protects every arithmetic input: no separate loss_mask pass.
    inp = c.read_inputs(logp_pi, batch, sanitize=False)
    keep, delta, entropy = _keep(inp, cfg)
    lp, lmu, adv = c.gate(keep, inp.logp_pi, inp.logp_mu, inp.advantages)
    # The loss takes its own exp of the gated log-ratio: reusing the metrics' exp(delta)
    # makes the gradient fusion read one more materialised [B, T] array
    # (docs/performance.md).
    r = c.ratio(lp, lmu)
    loss_tok, lo, hi = c.ppo_clip_loss(r, adv, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    num_kept = c.kept_count(inp, keep)
    loss = c.agg(inp, loss_tok, keep, cfg, num_kept)
    # entr/score_mean is masked_mean(S, loss_mask). S = d**2 / max(max(H, 0) + eps, 1e-30)
    # with |d| <= 20 is never infinite and is NaN exactly where delta or H is NaN, so its
    # finite tokens are found without reading S; its sum and count join the other metrics'
    # single stacked pass (`common.base_metrics`).
    score = entr_score(delta, entropy, cfg.eps)
    score_valid = inp.loss_mask & ~jnp.isnan(delta) & ~jnp.isnan(entropy)
    metrics = {**c.pg_metrics(inp, loss, cfg, num_kept),
               **c.base_metrics(inp, keep, lo, hi,
                                means={"entr/score_mean": (score, score_valid, "entr/score_count")})}
    return loss, c.f32_metrics(metrics)
