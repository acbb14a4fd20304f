"""The optimizer: global-norm clipping then AdamW, with a warmup + constant/cosine schedule.

AdamW is Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (arXiv 1711.05101),
Algorithm 2; global-norm clipping is Pascanu et al. 2013 (arXiv 1211.5063), Sec. 3.2:
``g <- g * min(1, max_grad_norm / ||g||_2)`` with the norm over all parameters. Both come
from optax; this module only fixes their order and their configuration.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import optax
from flax import nnx

__all__ = ["OptimizerConfig", "make_optimizer", "make_schedule"]


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW + clipping + learning-rate schedule.

    Attributes:
      learning_rate: peak learning rate (after warmup), > 0.
      warmup_steps: linear warmup from 0 to ``learning_rate`` over this many optimizer
        steps (>= 0; 0 starts at the peak).
      schedule: ``"constant"`` keeps the peak after warmup; ``"cosine"`` decays it to
        ``learning_rate * final_lr_fraction`` at ``total_steps``.
      total_steps: length of the cosine schedule, warmup included (> warmup_steps when
        ``schedule == "cosine"``; ignored for "constant"). A run (``--optim.total_steps``)
        takes 0 as its own optimizer updates, rl_steps x learner.minibatches x
        learner.epochs.
      final_lr_fraction: cosine end value as a fraction of the peak, in [0, 1].
      b1: Adam moment decay rates, in [0, 1).
      b2: Adam moment decay rates, in [0, 1).
      eps: Adam denominator epsilon (> 0).
      weight_decay: decoupled weight decay coefficient (>= 0), applied only to parameters
        with two or more dimensions (not to norm scales or biases).
      max_grad_norm: global-norm clipping threshold (> 0); ``None`` disables clipping.
    """

    learning_rate: float = 1e-6
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine"] = "constant"
    total_steps: int = 0
    final_lr_fraction: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0

    def __post_init__(self):
        if not self.learning_rate > 0:
            raise ValueError(f"OptimizerConfig.learning_rate must be > 0, got {self.learning_rate}")
        if self.warmup_steps < 0:
            raise ValueError(f"OptimizerConfig.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(
                f"OptimizerConfig.schedule must be 'constant' or 'cosine', got {self.schedule!r}"
            )
        if self.total_steps < 0:
            raise ValueError(f"OptimizerConfig.total_steps must be >= 0, got {self.total_steps}")
        if self.schedule == "cosine" and self.total_steps <= self.warmup_steps:
            raise ValueError(
                "OptimizerConfig.total_steps must exceed warmup_steps for a cosine schedule, "
                f"got total_steps={self.total_steps}, warmup_steps={self.warmup_steps}"
            )
        if not 0.0 <= self.final_lr_fraction <= 1.0:
            raise ValueError(
                f"OptimizerConfig.final_lr_fraction must be in [0, 1], got {self.final_lr_fraction}"
            )
        for name in ("b1", "b2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"OptimizerConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.eps > 0:
            raise ValueError(f"OptimizerConfig.eps must be > 0, got {self.eps}")
        if self.weight_decay < 0:
            raise ValueError(f"OptimizerConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(
                f"OptimizerConfig.max_grad_norm must be > 0 or None, got {self.max_grad_norm}"
            )


def make_schedule(config: OptimizerConfig) -> optax.Schedule:
    """Learning rate as a function of the optimizer step count (0-based).

    ``lr(s) = peak * s / warmup`` for ``s < warmup``; then the peak ("constant") or
    ``peak * (f + (1 - f) * (1 + cos(pi * (s - warmup) / (total - warmup))) / 2)``
    ("cosine", ``f = final_lr_fraction``, held at ``peak * f`` after ``total``).
    """
    peak = config.learning_rate
    if config.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=peak,
            warmup_steps=config.warmup_steps,
            decay_steps=config.total_steps,
            end_value=peak * config.final_lr_fraction,
        )
    if config.warmup_steps == 0:
        return optax.constant_schedule(peak)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, config.warmup_steps), optax.constant_schedule(peak)],
        [config.warmup_steps],
    )


def _decay_mask(params):
    """True on matrices (kernels, embeddings), False on vectors (biases, norm gains): the
    parameter's own rank, not counting a stacked layer axis (logical name ``"layers"``,
    `entr_jax.model.partitioning`), read from its ``out_sharding`` metadata when it has
    one, else its array rank."""
    def matrix(leaf):
        if isinstance(leaf, nnx.Variable):
            axes = leaf.get_metadata().get("out_sharding")
            rank = (len([a for a in axes if a != "layers"]) if axes
                    else jnp.ndim(leaf.get_value()))
            return leaf.replace(rank >= 2)
        return jnp.ndim(leaf) >= 2

    return jax.tree.map(matrix, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """``clip_by_global_norm(max_grad_norm)`` then ``adamw(schedule, ...)``.

    The returned transformation's updates are *added* to the parameters
    (``optax.apply_updates``); the learning rate is already folded in.
    """
    parts = []
    if config.max_grad_norm is not None:
        parts.append(optax.clip_by_global_norm(config.max_grad_norm))
    parts.append(
        optax.adamw(
            learning_rate=make_schedule(config),
            b1=config.b1,
            b2=config.b2,
            eps=config.eps,
            weight_decay=config.weight_decay,
            mask=_decay_mask,
        )
    )
    return optax.chain(*parts)
