"""IcePop (masked importance sampling) and KPop (bidirectional binary-KL masking).

Both gate tokens on the train/inference discrepancy of the sampled token and then apply
a PPO clipped surrogate to the kept ones. "train" is ``logp_prox`` when the batch has it
and the current ``logp_pi`` (detached) otherwise:

* **decoupled** (``batch.logp_prox`` given):
  ``l = -M * sg(prox/mu) * min(u A, clip(u) A)``, ``u = pi/prox`` (the IS weight k is
  kept on accepted tokens);
* **bypass** (``logp_prox`` None; the single-ratio setting in which ESTR compares against
  them, INFERRED): the gate uses ``sg(pi/mu)`` and ``l = -M * min(r A, clip(r) A)`` with
  ``r = pi/mu``, which already carries the IS weight.

IcePop (Ring-1T, arXiv 2510.18855; algorithms.md 4.6): ``M = 1[alpha <= k <= beta]``,
``k = train/mu``; defaults ``alpha = 0.5``, ``beta = 5``, clip 0.2/0.2,
``seq_mean_token_mean`` (original form; INTELLECT-3 uses ``token_mean``).

KPop (ringtech.notion.site/kpop; algorithms.md 4.7):
``M = 1[max(D(p||q), D(q||p)) <= phi]`` with Bernoulli KL ``D``, ``p = train(o_t)``,
``q = mu(o_t)``; ``phi = 2.0`` (AReaL ``rejection_sampling.upper``; the blog's value is
UNKNOWN), clip 0.2/0.2 and ``token_mean`` (INFERRED, AReaL).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from entr_jax.objectives import common as c
from entr_jax.objectives.aggregation import Aggregation, ObjectiveConfig, check_range
from entr_jax.objectives.gates import icepop_mask, kpop_mask
from entr_jax.objectives.weighted import weighted_ppo


def _gated(inp: c.Inputs, gate_fn, cfg) -> tuple[jax.Array, c.Metrics]:
    if inp.logp_prox is None:
        logp_train, logp_den = c.sg(inp.logp_pi), inp.logp_mu
        w = jnp.ones_like(inp.logp_mu)
    else:
        logp_train, logp_den = inp.logp_prox, inp.logp_prox
        w = c.ratio(inp.logp_prox, inp.logp_mu)
    keep = inp.loss_mask & gate_fn(logp_train, inp.logp_mu)
    return weighted_ppo(inp, logp_den, w, keep, cfg)


@dataclasses.dataclass(frozen=True, kw_only=True)
class IcePopConfig(ObjectiveConfig):
    """IcePop hyperparameters: band ``[alpha, beta]`` (0 < alpha < beta), clip band."""

    aggregation: Aggregation = "seq_mean_token_mean"
    alpha: float = 0.5
    beta: float = 5.0
    clip_low: float = 0.2
    clip_high: float = 0.2

    def __post_init__(self):
        super().__post_init__()
        check_range("IcePopConfig", "alpha", self.alpha, lo=0.0, lo_open=True)
        check_range("IcePopConfig", "beta", self.beta, lo=0.0, lo_open=True)
        if not self.alpha < self.beta:
            raise ValueError(f"IcePopConfig.alpha must be < IcePopConfig.beta, got alpha={self.alpha}, beta={self.beta}")
        self._clip()


def icepop(logp_pi: jax.Array, batch: Any, cfg: IcePopConfig) -> tuple[jax.Array, c.Metrics]:
    """IcePop loss (see the module docstring). Returns ``(loss, metrics)``."""
    inp = c.read_inputs(logp_pi, batch)
    return _gated(inp, lambda lt, lmu: icepop_mask(c.log_ratio(lt, lmu), cfg.alpha, cfg.beta), cfg)


@dataclasses.dataclass(frozen=True, kw_only=True)
class KPopConfig(ObjectiveConfig):
    """KPop hyperparameters: KL threshold ``phi`` (> 0), clip band."""

    aggregation: Aggregation = "token_mean"
    phi: float = 2.0
    clip_low: float = 0.2
    clip_high: float = 0.2

    def __post_init__(self):
        super().__post_init__()
        check_range("KPopConfig", "phi", self.phi, lo=0.0, lo_open=True)
        self._clip()


def kpop(logp_pi: jax.Array, batch: Any, cfg: KPopConfig) -> tuple[jax.Array, c.Metrics]:
    """KPop loss (see the module docstring). Returns ``(loss, metrics)``."""
    inp = c.read_inputs(logp_pi, batch)
    return _gated(inp, lambda lt, lmu: kpop_mask(lt, lmu, cfg.phi), cfg)
