"""Decoupled PPO (AReaL) and truncated importance sampling (TIS).

Both factor the behavior ratio through a proximal policy (the "policy triangle",
algorithms.md section 2): a detached weight ``w`` built from ``prox/mu`` times a PPO
clipped surrogate on ``u = pi/prox``:

    l = -sg(w) * min(u A, clip(u, 1 - clip_low, 1 + clip_high) A)

* `decoupled_ppo` (AReaL, arXiv 2505.24298, eq. 5; algorithms.md 4.4):
  ``w = prox/mu``; optional ``weight_cap``: ``weight_cap_mode="mask"`` drops tokens with
  ``w > cap`` (AReaL's ``behav_imp_weight_cap``, INFERRED), ``"truncate"`` uses
  ``min(w, cap)``. Needs ``batch.logp_prox``. Defaults: clip 0.2/0.2, no cap,
  ``token_mean``.
* `tis` (Yao et al., "Your efficient RL framework secretly brings you off-policy RL
  training", 2025; algorithms.md 4.5): ``w = min(prox/mu, cap)`` per token
  (``level="token"``) or ``w_i = min(exp(clip(sum_t log(prox/mu))), cap)`` per sequence
  (``level="sequence"``); ``cap = 2``. Needs ``batch.logp_prox``: a *bypass* mode
  (``prox := mu``) would give ``w = 1`` and GRPO's loss, so `TisConfig` refuses it.
  Defaults: clip 0.2/0.2, ``token_mean``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp

from entr_jax.objectives import common as c
from entr_jax.objectives.aggregation import Aggregation, ObjectiveConfig, check_choice, check_range
from entr_jax.objectives.weighted import weighted_ppo


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoupledPpoConfig(ObjectiveConfig):
    """Decoupled PPO hyperparameters.

    Attributes:
      clip_low: clip band on ``pi/prox``; default 0.2/0.2.
      clip_high: clip band on ``pi/prox``; default 0.2/0.2.
      weight_cap: cap on ``prox/mu`` (> 0) or None (no cap).
      weight_cap_mode: ``mask`` (drop tokens above the cap) | ``truncate``.
      aggregation: default ``token_mean``.
    """

    aggregation: Aggregation = "token_mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    weight_cap: float | None = None
    weight_cap_mode: Literal["mask", "truncate"] = "mask"

    def __post_init__(self):
        super().__post_init__()
        self._clip()
        if self.weight_cap is not None:
            check_range("DecoupledPpoConfig", "weight_cap", self.weight_cap, lo=0.0, lo_open=True)
        check_choice("DecoupledPpoConfig", "weight_cap_mode", self.weight_cap_mode, ("mask", "truncate"))

    def inputs(self) -> frozenset[str]:
        return frozenset({"logp_prox"})

    def uses_batch_stats(self) -> bool:
        return self.mode == "token_mean_kept"


def decoupled_ppo(logp_pi: jax.Array, batch: Any, cfg: DecoupledPpoConfig) -> tuple[jax.Array, c.Metrics]:
    """AReaL decoupled PPO loss (see the module docstring). Returns ``(loss, metrics)``.

    Raises:
      ValueError: ``batch.logp_prox`` is None.
    """
    inp = c.read_inputs(logp_pi, batch)
    w, keep = _decoupled_weight(inp, cfg)
    loss, metrics = weighted_ppo(inp, inp.logp_prox, w, keep, cfg, c.kept_count(inp, keep))
    metrics["ratio_mode/decoupled"] = jnp.float32(1.0)
    return loss, metrics


def _decoupled_weight(inp: c.Inputs, cfg: DecoupledPpoConfig) -> tuple[jax.Array, jax.Array]:
    if inp.logp_prox is None:
        raise ValueError("decoupled_ppo needs batch.logp_prox (proximal-policy log-probs), but it is None")
    w = c.ratio(inp.logp_prox, inp.logp_mu)
    # checked on the raw log-ratio: after the ±20 clip w is finite even for a log-prob of
    # -inf, which would give the token a weight of e^20
    keep = inp.loss_mask & jnp.isfinite(inp.logp_prox - inp.logp_mu)
    if cfg.weight_cap is not None:
        if cfg.weight_cap_mode == "mask":
            keep = keep & (w <= cfg.weight_cap)
        else:
            w = jnp.minimum(w, cfg.weight_cap)
    return w, keep


def decoupled_ppo_batch_stats(logp_pi: jax.Array, batch: Any, cfg: DecoupledPpoConfig) -> dict[str, jax.Array]:
    """``num_kept_tokens`` of the optimizer batch (tokens not dropped by the weight cap)."""
    _, keep = _decoupled_weight(c.read_inputs(logp_pi, batch), cfg)
    return {"num_kept_tokens": jnp.sum(keep, dtype=jnp.float32)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TisConfig(ObjectiveConfig):
    """TIS hyperparameters.

    Attributes:
      cap: truncation ``C`` of the weight (> 0); default 2.0.
      level: ``token`` | ``sequence``.
      clip_low: clip band on ``pi/prox``; default 0.2/0.2.
      clip_high: clip band on ``pi/prox``; default 0.2/0.2.
      ratio_mode: ``decoupled`` (reads ``batch.logp_prox``), the only accepted value: the
        field exists so that a comparison base's ``ratio_mode`` reaches TIS and is refused
        rather than silently applied. ``bypass`` (``prox := mu``) would make the weight
        ``min(mu/mu, cap) = 1``: TIS would be GRPO's PPO clip on ``pi/mu`` and ``cap`` and
        ``level`` would change nothing, so it raises ValueError.
      aggregation: default ``token_mean``.
    """

    aggregation: Aggregation = "token_mean"
    cap: float = 2.0
    level: Literal["token", "sequence"] = "token"
    clip_low: float = 0.2
    clip_high: float = 0.2
    ratio_mode: Literal["decoupled", "bypass"] = "decoupled"

    def __post_init__(self):
        super().__post_init__()
        check_range("TisConfig", "cap", self.cap, lo=0.0, lo_open=True)
        check_choice("TisConfig", "level", self.level, ("token", "sequence"))
        check_choice("TisConfig", "ratio_mode", self.ratio_mode, ("decoupled", "bypass"))
        if self.ratio_mode == "bypass":
            raise ValueError(
                "TisConfig.ratio_mode='bypass' sets prox := mu, so the truncated weight "
                "min(prox/mu, cap) is 1 on every token: TIS would be GRPO's PPO clip on pi/mu "
                "and cap/level would do nothing; TIS needs ratio_mode='decoupled' "
                "(--objective.tis.ratio_mode decoupled: the learner's own log-probs of the "
                "sampled tokens as prox)")
        self._clip()

    def inputs(self) -> frozenset[str]:
        return frozenset({"logp_prox"}) if self.ratio_mode == "decoupled" else frozenset()


def tis(logp_pi: jax.Array, batch: Any, cfg: TisConfig) -> tuple[jax.Array, c.Metrics]:
    """Truncated-IS PPO loss (see the module docstring). Returns ``(loss, metrics)``.

    Raises:
      ValueError: ``ratio_mode="decoupled"`` and ``batch.logp_prox`` is None.
    """
    inp = c.read_inputs(logp_pi, batch)
    logp_prox = c.proximal(inp, cfg, "TisConfig")
    log_w = c.log_ratio(logp_prox, inp.logp_mu)
    if cfg.level == "sequence":
        seq_log_w_B = c.log_ratio(jnp.sum(log_w, axis=1), 0.0)
        log_w = jnp.broadcast_to(seq_log_w_B[:, None], log_w.shape)
    w = jnp.minimum(jnp.exp(log_w), cfg.cap)
    loss, metrics = weighted_ppo(inp, logp_prox, w, inp.loss_mask, cfg)
    metrics["ratio_mode/decoupled"] = jnp.float32(cfg.ratio_mode == "decoupled")
    return loss, metrics
