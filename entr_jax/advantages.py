"""Group-relative advantage estimators.

Inputs are sequence rewards, either ``rewards_PG: [P, G]`` (P prompts x G samples) or flat
``rewards_N: [N]`` with ``group_ids: [N] int`` (the prompt of each sample). Outputs have
the input's shape. Estimators (algorithms.md section 2 and 4.1-4.2):

* ``grpo`` (DeepSeekMath, arXiv 2402.03300, section 4.1.2):
  ``A_i = (R_i - mean_g R) / (std_g R + eps)``; ``std`` with ``std_ddof`` (default 1, the
  unbiased estimator used by the TRL/verl implementations; the paper does not say).
* ``dr_grpo`` (Dr.GRPO, arXiv 2503.20783, eq. 3): ``A_i = R_i - mean_g R``.
* ``rloo`` (Ahmadian et al., arXiv 2402.14740, eq. 5): ``A_i = R_i - mean_{j != i} R_j
  = G/(G-1) (R_i - mean_g R)``; 0 for a group of one.

A group whose rewards are all equal gets exactly 0 (never NaN, even when rounding makes
``R - mean`` a few ulps off 0). ``batch_normalize`` then optionally standardises over the
whole batch (REINFORCE++-style: ``(A - mean) / (std + eps)``, all-equal -> 0).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

Estimator = Literal["grpo", "dr_grpo", "rloo"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdvantageConfig:
    """Advantage estimator settings.

    Attributes:
      estimator: ``grpo`` | ``dr_grpo`` | ``rloo``.
      eps: added to the standard deviation (>= 0); GRPO's ``eps_A``.
      std_ddof: delta degrees of freedom of GRPO's group std (0 or 1).
      batch_normalize: standardise the advantages over the whole batch afterwards.
    """

    estimator: Estimator = "grpo"
    eps: float = 1e-6
    std_ddof: int = 1
    batch_normalize: bool = False

    def __post_init__(self):
        if self.estimator not in ("grpo", "dr_grpo", "rloo"):
            raise ValueError(f"AdvantageConfig.estimator must be 'grpo', 'dr_grpo' or 'rloo', got {self.estimator!r}")
        if not (isinstance(self.eps, (int, float)) and self.eps >= 0):
            raise ValueError(f"AdvantageConfig.eps must be >= 0, got {self.eps!r}")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"AdvantageConfig.std_ddof must be 0 or 1, got {self.std_ddof!r}")


def _group_stats(rewards_N, gid_N, num_groups):
    """Per-sample group mean, count, sum of squared deviations, and all-equal flag."""
    ones = jnp.ones_like(rewards_N)
    count_K = jax.ops.segment_sum(ones, gid_N, num_groups)
    mean_K = jax.ops.segment_sum(rewards_N, gid_N, num_groups) / jnp.maximum(count_K, 1.0)
    centered_N = rewards_N - mean_K[gid_N]
    ss_K = jax.ops.segment_sum(centered_N * centered_N, gid_N, num_groups)
    equal_K = jax.ops.segment_max(rewards_N, gid_N, num_groups) == jax.ops.segment_min(rewards_N, gid_N, num_groups)
    return centered_N, count_K[gid_N], ss_K[gid_N], equal_K[gid_N]


@functools.partial(jax.jit, static_argnums=(2, 3))
def _advantages(rewards, gid_N, num_groups, cfg: AdvantageConfig):
    """`_flat_advantages` of the flattened ``rewards``, in their shape: one compiled
    program per shape, group count and config (called eagerly, its dozen small
    operations would each be compiled and dispatched on their own)."""
    return _flat_advantages(rewards.reshape(-1), gid_N, num_groups, cfg).reshape(rewards.shape)


def _flat_advantages(rewards_N, gid_N, num_groups, cfg: AdvantageConfig):
    centered, count, ss, equal = _group_stats(rewards_N, gid_N, num_groups)
    if cfg.estimator == "grpo":
        std = jnp.sqrt(ss / jnp.maximum(count - cfg.std_ddof, 1.0))
        adv = centered / (std + cfg.eps)
    elif cfg.estimator == "dr_grpo":
        adv = centered
    else:
        adv = centered * count / jnp.maximum(count - 1.0, 1.0)
    adv = jnp.where(equal, 0.0, adv)
    if cfg.batch_normalize:
        adv = normalize_batch(adv, cfg.eps)
    return adv


def normalize_batch(adv: jax.Array, eps: float = 1e-6) -> jax.Array:
    """``(A - mean(A)) / (std(A) + eps)`` over every entry; exactly 0 if all are equal."""
    a = jnp.asarray(adv, jnp.float32)
    out = (a - jnp.mean(a)) / (jnp.std(a) + eps)
    return jnp.where(jnp.max(a) == jnp.min(a), 0.0, out)


def compute_advantages(
    rewards: jax.Array,
    cfg: AdvantageConfig = AdvantageConfig(),
    group_ids: jax.Array | None = None,
    num_groups: int | None = None,
) -> jax.Array:
    """Per-sequence advantages.

    Args:
      rewards: ``[P, G]`` float rewards (groups are rows), or ``[N]`` with ``group_ids``.
      cfg: estimator settings.
      group_ids: ``[N]`` int group index per sample (flat form only); any integers.
      num_groups: static number of groups for the flat form under ``jit`` (ids must then
        lie in ``[0, num_groups)``); None to derive it from concrete ``group_ids``.

    Returns:
      ``float32`` advantages with the shape of ``rewards``.

    Raises:
      ValueError: wrong ranks, mismatched lengths, or traced ``group_ids`` without
        ``num_groups``.
    """
    r = (jnp.asarray(rewards, jnp.float32) if isinstance(rewards, jax.core.Tracer)
         else np.asarray(rewards, np.float32))
    if group_ids is None:
        if r.ndim != 2:
            raise ValueError(f"rewards must be [P, G] when group_ids is None, got shape {r.shape}")
        p, g = r.shape
        return _advantages(r, np.repeat(np.arange(p, dtype=np.int32), g), p, cfg)
    if r.ndim != 1:
        raise ValueError(f"rewards must be [N] when group_ids is given, got shape {r.shape}")
    if jnp.shape(group_ids) != r.shape:
        raise ValueError(f"group_ids must have shape {r.shape} like rewards, got {jnp.shape(group_ids)}")
    if num_groups is None:
        if isinstance(group_ids, jax.core.Tracer):
            raise ValueError("num_groups must be given when group_ids is traced (under jit)")
        _, inverse = np.unique(np.asarray(group_ids), return_inverse=True)
        gid = inverse.reshape(-1).astype(np.int32)
        num_groups = int(inverse.max()) + 1 if inverse.size else 0
    else:
        gid = jnp.asarray(group_ids, jnp.int32)
    return _advantages(r, gid, num_groups, cfg)
