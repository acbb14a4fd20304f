"""IcePop (masked importance sampling) and KPop (bidirectional binary-KL masking).

Both gate tokens on the train/inference discrepancy of the sampled token and then apply
a PPO clipped surrogate to the kept ones. The config field ``ratio_mode`` says what
"train" is:

* ``"decoupled"`` (the papers' and AReaL's form, ``use_decoupled_loss``): "train" is the
  proximal policy, ``batch.logp_prox`` (the weights before the first optimizer update of
  the rollout batch): ``l = -M * sg(prox/mu) * min(u A, clip(u) A)``, ``u = pi/prox``; the
  IS weight ``k = prox/mu`` is kept on accepted tokens (IcePop's ``M(k) = k``);
* ``"bypass"`` (default; the single-ratio setting in which ESTR compares against them,
  INFERRED): the gate uses ``sg(pi/mu)`` and ``l = -M * min(r A, clip(r) A)`` with
  ``r = pi/mu``, which already carries the IS weight.

Metrics record the mode that ran: ``ratio_mode/decoupled`` is 1 or 0.

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
from typing import Any, Literal

import jax
import jax.numpy as jnp

from entr_jax.objectives import common as c
from entr_jax.objectives.aggregation import Aggregation, ObjectiveConfig, check_choice, check_range
from entr_jax.objectives.gates import icepop_mask, kpop_mask
from entr_jax.objectives.weighted import weighted_ppo


def _gate(inp: c.Inputs, gate_fn, cfg, cls_name: str):
    """``(keep, logp_den, w)`` of the mode in ``cfg.ratio_mode``."""
    if cfg.ratio_mode == "bypass":
        logp_train, logp_den = c.sg(inp.logp_pi), inp.logp_mu
        w = jnp.ones_like(inp.logp_mu)
    else:
        logp_train = logp_den = c.proximal(inp, cfg, cls_name)
        w = c.ratio(logp_train, inp.logp_mu)
    return inp.loss_mask & gate_fn(logp_train, inp.logp_mu), logp_den, w


def _gated(inp: c.Inputs, gate_fn, cfg, cls_name: str) -> tuple[jax.Array, c.Metrics]:
    keep, logp_den, w = _gate(inp, gate_fn, cfg, cls_name)
    loss, metrics = weighted_ppo(inp, logp_den, w, keep, cfg, c.kept_count(inp, keep))
    metrics["ratio_mode/decoupled"] = jnp.float32(cfg.ratio_mode == "decoupled")
    return loss, metrics


def _kept_stats(logp_pi, batch, gate_fn, cfg, cls_name: str) -> dict[str, jax.Array]:
    keep, _, _ = _gate(c.read_inputs(logp_pi, batch), gate_fn, cfg, cls_name)
    return {"num_kept_tokens": jnp.sum(keep, dtype=jnp.float32)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class _MaskedIsConfig(ObjectiveConfig):
    """The masked importance-sampling objectives' common field.

    Attributes:
      ratio_mode: ``bypass`` (the gate and the surrogate use ``pi/mu``) or ``decoupled``
        (the surrogate uses ``pi/prox`` weighted by ``prox/mu``; reads ``logp_prox``); see
        the module docstring.
    """

    ratio_mode: Literal["bypass", "decoupled"] = "bypass"

    def __post_init__(self):
        super().__post_init__()
        check_choice(type(self).__name__, "ratio_mode", self.ratio_mode, ("bypass", "decoupled"))
        self._clip()

    def inputs(self) -> frozenset[str]:
        return frozenset({"logp_prox"}) if self.ratio_mode == "decoupled" else frozenset()

    def uses_batch_stats(self) -> bool:
        return self.mode == "token_mean_kept"


@dataclasses.dataclass(frozen=True, kw_only=True)
class IcePopConfig(_MaskedIsConfig):
    """IcePop hyperparameters (module docstring).

    Attributes:
      ratio_mode: ``bypass`` (the gate and the surrogate use ``pi/mu``) or ``decoupled``
        (the surrogate uses ``pi/prox`` weighted by ``prox/mu``; reads ``logp_prox``); see
        the module docstring.
      alpha: lower end of the kept band of ``k = train/mu`` (0 <= alpha < beta; ``alpha = 0``
        with ``beta = inf`` switches the gate off).
      beta: upper end of the kept band of ``k = train/mu`` (> alpha).
      clip_low: PPO clip band ``[1 - clip_low, 1 + clip_high]`` on the ratio (>= 0).
      clip_high: PPO clip band ``[1 - clip_low, 1 + clip_high]`` on the ratio (>= 0).
    """

    aggregation: Aggregation = "seq_mean_token_mean"
    alpha: float = 0.5
    beta: float = 5.0
    clip_low: float = 0.2
    clip_high: float = 0.2

    def __post_init__(self):
        super().__post_init__()
        check_range("IcePopConfig", "alpha", self.alpha, lo=0.0)
        check_range("IcePopConfig", "beta", self.beta, lo=0.0, lo_open=True)
        if not self.alpha < self.beta:
            raise ValueError(f"IcePopConfig.alpha must be < IcePopConfig.beta, got alpha={self.alpha}, beta={self.beta}")


def _icepop_gate(cfg: IcePopConfig):
    return lambda lt, lmu: icepop_mask(lt - lmu, cfg.alpha, cfg.beta)  # raw: the gate clips


def icepop(logp_pi: jax.Array, batch: Any, cfg: IcePopConfig) -> tuple[jax.Array, c.Metrics]:
    """IcePop loss (see the module docstring). Returns ``(loss, metrics)``.

    Raises:
      ValueError: ``ratio_mode="decoupled"`` and ``batch.logp_prox`` is None.
    """
    return _gated(c.read_inputs(logp_pi, batch), _icepop_gate(cfg), cfg, "IcePopConfig")


def icepop_batch_stats(logp_pi: jax.Array, batch: Any, cfg: IcePopConfig) -> dict[str, jax.Array]:
    """``num_kept_tokens`` of the optimizer batch (denominator of ``token_mean_kept``)."""
    return _kept_stats(logp_pi, batch, _icepop_gate(cfg), cfg, "IcePopConfig")


@dataclasses.dataclass(frozen=True, kw_only=True)
class KPopConfig(_MaskedIsConfig):
    """KPop hyperparameters (module docstring).

    Attributes:
      ratio_mode: ``bypass`` (the gate and the surrogate use ``pi/mu``) or ``decoupled``
        (the surrogate uses ``pi/prox`` weighted by ``prox/mu``; reads ``logp_prox``); see
        the module docstring.
      phi: a token is kept when its symmetric Bernoulli KL between ``train(o_t)`` and
        ``mu(o_t)`` is at most this (> 0).
      clip_low: PPO clip band ``[1 - clip_low, 1 + clip_high]`` on the ratio (>= 0).
      clip_high: PPO clip band ``[1 - clip_low, 1 + clip_high]`` on the ratio (>= 0).
    """

    aggregation: Aggregation = "token_mean"
    phi: float = 2.0
    clip_low: float = 0.2
    clip_high: float = 0.2

    def __post_init__(self):
        super().__post_init__()
        check_range("KPopConfig", "phi", self.phi, lo=0.0, lo_open=True)


def kpop(logp_pi: jax.Array, batch: Any, cfg: KPopConfig) -> tuple[jax.Array, c.Metrics]:
    """KPop loss (see the module docstring). Returns ``(loss, metrics)``.

    Raises:
      ValueError: ``ratio_mode="decoupled"`` and ``batch.logp_prox`` is None.
    """
    return _gated(c.read_inputs(logp_pi, batch), lambda lt, lmu: kpop_mask(lt, lmu, cfg.phi), cfg, "KPopConfig")


def kpop_batch_stats(logp_pi: jax.Array, batch: Any, cfg: KPopConfig) -> dict[str, jax.Array]:
    """``num_kept_tokens`` of the optimizer batch (denominator of ``token_mean_kept``)."""
    return _kept_stats(logp_pi, batch, lambda lt, lmu: kpop_mask(lt, lmu, cfg.phi), cfg, "KPopConfig")
