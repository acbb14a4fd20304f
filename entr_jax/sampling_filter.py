"""Top-k / top-p / min-p: the one implementation of the sampling filters.

The embedded sampler (`samplers.jax_sampling`) draws every token from the filtered,
renormalised distribution ``mu`` below and records ``logp_mu``/``entropy_mu`` of it; the
learner (`entr_jax.logprobs`) scores ``logp_pi``/``entropy_pi`` of the *same* transform of
its own logits. Both call `filter_logits`, so on-policy (same weights) the importance ratio
``exp(logp_pi - logp_mu)`` is 1 up to float rounding for every filter setting
(ESTR, arXiv 2607.22186, Sec. 2: the ratio's denominator is the probability the token was
drawn with).

The distribution of one row, with ``z = logits / temperature`` (``V`` entries; filters
applied in this order, each to the renormalised result of the previous one, as the HF
``generate`` logits warpers chain them):

1. top-k: keep the ``k`` largest ``z`` (exactly ``k``; among equal values the lower token
   id first); ``k <= 0`` (the ``-1`` of `SamplingParams`) disables it;
2. top-p (nucleus, Holtzman et al. 2020, eq. 3): over the top-k renormalised probabilities
   ``p`` sorted in decreasing order, keep token ``i`` iff the mass strictly before it is
   ``< top_p`` (the smallest prefix whose mass reaches ``top_p``; the mode is always kept);
   ``top_p >= 1`` disables it;
3. min-p (Nguyen et al. 2024): keep ``i`` iff ``p_i >= min_p * max_j p_j``, i.e.
   ``z_i >= max_j z_j + log(min_p)`` (invariant to the renormalisations above, which never
   drop the mode); ``min_p = 0`` disables it.

``mu = softmax(z masked to the kept set)``: kept entries keep their tempered logit, the
others become ``-inf`` (probability 0). In decreasing order the kept set is a prefix of
length ``L`` (each rule keeps a prefix), so in vocabulary order a token is kept iff its
``z`` is above the ``L``-th largest value ``t``, or equal to ``t`` and among the first
``L - #{z > t}`` such tokens by id: the vocabulary-order mask needs one sort and no
scatter.

Gradients: the keep set is computed from ``stop_gradient(z)``; gradient flows only
through the tempered logits of the kept entries.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array

__all__ = ["check_filter", "filter_active", "filter_logits", "keep_mask", "keep_mask_sorted"]


def filter_active(top_k: int, top_p: float, min_p: float) -> bool:
    """Whether any filter is on (Python values; False selects the sort-free path)."""
    return top_k != -1 or top_p < 1.0 or min_p > 0.0


def check_filter(top_k: Any, top_p: Any, min_p: Any, prefix: str = "") -> None:
    """Validates Python filter values; errors name the field (``prefix + name``).

    Raises:
      ValueError: ``top_k`` not -1 and not an int >= 1, ``top_p`` not in (0, 1], or
        ``min_p`` not in [0, 1).
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or (top_k != -1 and top_k < 1):
        raise ValueError(f"{prefix}top_k must be -1 (off) or an int >= 1, got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"{prefix}top_p must be in (0, 1] (1 = off), got {top_p!r}")
    if isinstance(min_p, bool) or not isinstance(min_p, (int, float)) or not 0 <= min_p < 1:
        raise ValueError(f"{prefix}min_p must be in [0, 1) (0 = off), got {min_p!r}")


def keep_mask_sorted(z_sorted: Array, top_k: Any, top_p: Any, min_p: Any) -> Array:
    """Keep-mask of top-k / top-p / min-p over tempered logits sorted in decreasing order.

    Args:
      z_sorted: ``[..., V]`` f32 tempered logits, sorted decreasing along the last axis.
      top_k: int (Python or traced scalar); ``<= 0`` disables it.
      top_p: float scalar in (0, 1]; ``>= 1`` disables it.
      min_p: float scalar in [0, 1); 0 disables it.

    Returns:
      ``[..., V]`` bool, true on kept entries: a prefix of the last axis of length >= 1
      (the mode is always kept).
    """
    rank = jax.lax.broadcasted_iota(jnp.int32, z_sorted.shape, z_sorted.ndim - 1)
    top_k = jnp.asarray(top_k, jnp.int32)
    top_p = jnp.asarray(top_p, jnp.float32)
    min_p = jnp.asarray(min_p, jnp.float32)
    keep = (top_k <= 0) | (rank < top_k)
    probs = jax.nn.softmax(jnp.where(keep, z_sorted, -jnp.inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = keep & ((top_p >= 1.0) | (mass_before < top_p) | (rank == 0))
    log_min_p = jnp.where(min_p > 0, jnp.log(jnp.maximum(min_p, 1e-30)), -jnp.inf)
    keep = keep & (z_sorted >= z_sorted[..., :1] + log_min_p)
    return keep


def keep_mask(z: Array, top_k: Any, top_p: Any, min_p: Any) -> Array:
    """Keep-mask in vocabulary order (see the module docstring), from ``stop_gradient(z)``.

    Args:
      z: ``[..., V]`` f32 tempered logits (any order).
      top_k, top_p, min_p: as in `keep_mask_sorted`.

    Returns:
      ``[..., V]`` bool. Exactly the entries at the first ``L`` positions of a stable
      decreasing sort are kept, ``L`` being the length of `keep_mask_sorted`'s prefix.
    """
    z = jax.lax.stop_gradient(z)
    z_sorted = -jnp.sort(-z, axis=-1, stable=True)
    kept = jnp.sum(keep_mask_sorted(z_sorted, top_k, top_p, min_p), axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(z_sorted, kept - 1, axis=-1)  # the L-th largest value
    above = z > threshold
    tied = z == threshold
    room = kept - jnp.sum(above, axis=-1, keepdims=True)  # tied entries that fit, by id
    return above | (tied & (jnp.cumsum(tied, axis=-1) <= room))


def filter_logits(z: Array, top_k: Any, top_p: Any, min_p: Any) -> Array:
    """``z`` on the kept set, ``-inf`` elsewhere: the logits of ``mu`` (module docstring).

    Args:
      z: ``[..., V]`` f32 tempered logits; gradient flows into the kept entries only.
      top_k, top_p, min_p: as in `keep_mask_sorted`.

    Returns:
      ``[..., V]`` f32; ``softmax`` of it is the filtered, renormalised distribution.
    """
    return jnp.where(keep_mask(z, top_k, top_p, min_p), z, -jnp.inf)
