"""Token sampling math of `JaxSampler`: temperature, top-k, top-p, min-p, and the
log-probability and entropy of the distribution actually sampled from.

Shapes: ``B`` rows, ``V`` vocabulary entries. All math is float32; entropies are in nats.

The behavior distribution ``mu`` of one row (``SamplingParams``; filters applied in this
order, each to the renormalised result of the previous one, as the HF
``generate`` logits warpers chain them):

1. temperature: ``z = logits / temperature``;
2. top-k: keep the ``k`` largest ``z`` (exactly ``k``; ties broken by the lower token id);
3. top-p (nucleus, Holtzman et al. 2020, eq. 3): over the top-k renormalised probabilities
   ``p`` sorted in decreasing order, keep token ``i`` iff the mass strictly before it is
   ``< top_p`` (the smallest prefix whose mass reaches ``top_p``; the mode is always kept);
4. min-p (Nguyen et al. 2024): keep ``i`` iff ``p_i >= min_p * max_j p_j``, i.e.
   ``z_i >= max_j z_j + log(min_p)`` (invariant to the renormalisations above, which never
   drop the mode).

``mu = softmax(z masked to the kept set)``. The returned ``logp_mu = log mu(y)`` and
``entropy_mu = -sum_w mu(w) log mu(w)`` (the full-vocabulary entropy of the *filtered,
renormalised* distribution, zero-probability entries contributing 0) are taken from
exactly this distribution, so ``exp(logp_mu)`` is the probability with which the token was
drawn (the importance-ratio denominator of ESTR, arXiv 2607.22186, Sec. 2), and
``entropy_mu`` is the entropy of the policy that acted (ESTR Sec. 3.3). Numerically
(``entr_jax.logprobs``): with ``m = max z``, ``logp = (z_y - m) - log sum exp(z - m)`` and
``H = log sum exp(z - m) - sum_w mu(w) (z_w - m)``, clamped at 0.

Drawing: Gumbel-max (Gumbel 1954; ``argmax_w z_w + g_w`` with ``g_w ~ Gumbel(0, 1)`` i.i.d.
is a draw from ``softmax(z)``). The noise ``g`` is drawn in vocabulary order from the row's
key, so a filter that keeps every token samples the same token as no filter.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

__all__ = ["filter_mask_sorted", "logp_entropy", "sample_tokens"]


def filter_mask_sorted(z_sorted: Array, top_k: Array, top_p: Array, min_p: Array) -> Array:
    """Keep-mask of top-k / top-p / min-p over tempered logits sorted in decreasing order.

    Args:
      z_sorted: ``[B, V]`` f32 tempered logits, sorted decreasing along the last axis.
      top_k: int scalar; ``<= 0`` (the ``-1`` of `SamplingParams`) disables it.
      top_p: f32 scalar in (0, 1]; ``>= 1`` disables it.
      min_p: f32 scalar in [0, 1); 0 disables it.
    Returns:
      ``[B, V]`` bool, true on kept entries (the first entry, the mode, is always kept).
    """
    rank = jnp.arange(z_sorted.shape[-1], dtype=jnp.int32)[None, :]
    keep = (top_k <= 0) | (rank < top_k)
    probs = jax.nn.softmax(jnp.where(keep, z_sorted, -jnp.inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = keep & ((top_p >= 1.0) | (mass_before < top_p) | (rank == 0))
    log_min_p = jnp.where(min_p > 0, jnp.log(jnp.maximum(min_p, 1e-30)), -jnp.inf)
    keep = keep & (z_sorted >= z_sorted[:, :1] + log_min_p)
    return keep


def logp_entropy(z: Array, index: Array) -> tuple[Array, Array]:
    """``log softmax(z)[index]`` and the entropy of ``softmax(z)``, ``-inf`` entries allowed.

    Args:
      z: ``[B, V]`` f32 logits (``-inf`` = probability 0; at least one finite per row).
      index: ``[B]`` int indices into the last axis of ``z``.
    Returns:
      ``(logp [B], entropy [B])`` f32, nats (formulas in the module docstring).
    """
    m = jnp.max(z, axis=-1, keepdims=True)
    shifted = z - m
    log_sum = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
    logp = jnp.take_along_axis(shifted, index[:, None].astype(jnp.int32), axis=-1)[:, 0] - log_sum
    probs = jnp.exp(shifted - log_sum[:, None])
    finite = jnp.where(jnp.isfinite(shifted), shifted, 0.0)
    entropy = jnp.maximum(log_sum - jnp.sum(probs * finite, axis=-1), 0.0)
    return logp, entropy


def sample_tokens(
    logits: Array,
    keys: Array,
    temperature: Array,
    top_k: Array,
    top_p: Array,
    min_p: Array,
    *,
    filtered: bool,
) -> tuple[Array, Array, Array]:
    """Draws one token per row from the tempered, filtered distribution ``mu``.

    Args:
      logits: ``[B, V]`` raw logits (any float dtype; cast to f32).
      keys: ``[B]`` typed PRNG keys, one per row (``jax.random.key``).
      temperature: f32 scalar > 0.
      top_k, top_p, min_p: see `filter_mask_sorted`; ignored unless ``filtered``.
      filtered: static; False skips the sort (the RL default: no filtering).
    Returns:
      ``(tokens [B] int32, logp_mu [B] f32, entropy_mu [B] f32)``.
    """
    z = logits.astype(jnp.float32) / jnp.asarray(temperature, jnp.float32)
    gumbel = jax.vmap(lambda k: jax.random.gumbel(k, (z.shape[-1],), jnp.float32))(keys)
    if not filtered:
        index = jnp.argmax(z + gumbel, axis=-1).astype(jnp.int32)
        logp, entropy = logp_entropy(z, index)
        return index, logp, entropy
    order = jnp.argsort(-z, axis=-1, stable=True).astype(jnp.int32)
    z_sorted = jnp.take_along_axis(z, order, axis=-1)
    keep = filter_mask_sorted(
        z_sorted, top_k, jnp.asarray(top_p, jnp.float32), jnp.asarray(min_p, jnp.float32)
    )
    z_kept = jnp.where(keep, z_sorted, -jnp.inf)
    index = jnp.argmax(z_kept + jnp.take_along_axis(gumbel, order, axis=-1), axis=-1)
    index = index.astype(jnp.int32)
    logp, entropy = logp_entropy(z_kept, index)
    tokens = jnp.take_along_axis(order, index[:, None], axis=-1)[:, 0]
    return tokens, logp, entropy
