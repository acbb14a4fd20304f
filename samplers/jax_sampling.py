"""Token sampling of `JaxSampler`: temperature, top-k, top-p, min-p, and the
log-probability and entropy of the distribution actually sampled from.

Shapes: ``B`` rows, ``V`` vocabulary entries. All math is float32; entropies are in nats.

The behavior distribution ``mu`` of one row (``SamplingParams``) is the tempered logits
``z = logits / temperature`` filtered by `entr_jax.sampling_filter.filter_logits` (top-k,
then top-p, then min-p; the definitions are there) and renormalised. The learner applies
the same function to its own logits (`entr_jax.logprobs`, with the same ``top_k``,
``top_p``, ``min_p``), so the two describe one distribution and on-policy
``logp_pi == logp_mu`` up to float rounding.

The returned ``logp_mu = log mu(y)`` and ``entropy_mu = -sum_w mu(w) log mu(w)`` (the
full-vocabulary entropy of the *filtered, renormalised* distribution, zero-probability
entries contributing 0) are computed by `entr_jax.logprobs.logprobs_entropy_from_logits`,
so ``exp(logp_mu)`` is the probability with which the token was drawn (the
importance-ratio denominator of ESTR, arXiv 2607.22186, Sec. 2), and ``entropy_mu`` is the
entropy of the policy that acted (ESTR Sec. 3.3).

Drawing: inversion of the cumulative distribution (`draw`): one uniform ``u ~ U[0, 1)``
per row from the row's key, and the token is the first ``y`` (in vocabulary order) with
``F(y) > u F(V - 1)``, where ``F`` is the running sum of ``exp(z - max z)`` (Devroye 1986,
"Non-Uniform Random Variate Generation", Sec. III.2.1: ``P(y) = mu(y)``). Only entries of
positive probability can be drawn. A filter that keeps every token leaves ``F`` and ``u``
unchanged, so it samples the same token as no filter. One uniform per row instead of a
Gumbel variate per vocabulary entry (the former Gumbel-max draw): the draw was about a
quarter of a decode step of the CPU benchmark model (`benchmarks/sampler.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from entr_jax.logprobs import logprobs_entropy_from_logits
from entr_jax.sampling_filter import filter_logits

Array = jax.Array

__all__ = ["draw", "sample_tokens"]


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
      top_k, top_p, min_p: traced scalars, see `entr_jax.sampling_filter.keep_mask_sorted`;
        ignored unless ``filtered``.
      filtered: static; False skips the sort (the RL default: no filtering).
    Returns:
      ``(tokens [B] int32, logp_mu [B] f32, entropy_mu [B] f32)``.
    """
    z = logits.astype(jnp.float32) / jnp.asarray(temperature, jnp.float32)
    if filtered:
        z = filter_logits(z, top_k, top_p, min_p)
    tokens = draw(z, keys)
    logp, entropy = logprobs_entropy_from_logits(z, tokens)
    return tokens, logp, entropy


def draw(z: Array, keys: Array) -> Array:
    """One token per row from ``softmax(z)`` by inverting its cumulative distribution.

    Args:
      z: ``[B, V]`` f32 logits (tempered, filtered: ``-inf`` = probability 0; at least one
        finite entry per row).
      keys: ``[B]`` typed PRNG keys; row ``b`` uses ``u = uniform(keys[b])`` in ``[0, 1)``.
    Returns:
      ``[B]`` int32: the first ``y`` with ``F(y) > u F(V - 1)``, ``F`` the running sum of
      ``w = exp(z - max z)``, among the entries with ``w > 0`` (so a token of probability 0
      is never drawn; should rounding leave none, the last entry with ``w > 0`` of the
      block searched).

    The search runs in two levels (a guide table over blocks, Devroye 1986, Sec. III.2.4):
    the weights are summed in blocks of ``C`` consecutive entries (`block_size`), the
    first block whose running block sum exceeds ``u F(V - 1)`` is found among the ``V / C``
    block sums, and the running sum is formed inside that block only. That is the same
    rule as one running sum over all ``V`` entries, with the additions grouped by block,
    so the two agree except where float rounding moves ``F(y)`` across ``u F(V - 1)``;
    one pass over ``[B, V]`` (the block sums) replaces the ``V``-long running sum and its
    search, about 0.5 ms of a 5 ms decode step of the CPU benchmark model at batch 32.
    """
    b, v = z.shape
    c = block_size(v)
    nb = -(-v // c)
    w = jnp.exp(z - jnp.max(z, axis=-1, keepdims=True))
    w = jnp.pad(w, ((0, 0), (0, nb * c - v))).reshape(b, nb, c)  # padding: weight 0
    u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
    block_w = jnp.sum(w, axis=-1)  # [B, nb]
    block_cdf = jnp.cumsum(block_w, axis=-1)
    target = u * block_cdf[:, -1]
    j = _first_above(block_cdf, target, block_w > 0)  # a block of positive weight
    before = jnp.where(j > 0, jnp.take_along_axis(block_cdf, jnp.maximum(j - 1, 0)[:, None],
                                                  axis=-1)[:, 0], 0.0)
    w_j = jnp.take_along_axis(w, j[:, None, None], axis=1)[:, 0]  # [B, C]
    i = _first_above(before[:, None] + jnp.cumsum(w_j, axis=-1), target, w_j > 0)
    # min: a row of NaN logits (no positive weight anywhere) lands on the last id, never
    # on a padding entry past the vocabulary
    return jnp.minimum(j * c + i, v - 1).astype(jnp.int32)


def block_size(v: int) -> int:
    """Block length ``C`` of `draw` for a vocabulary of ``v``: the power of two nearest
    above ``sqrt(v)`` (at least 16), so both levels search about ``sqrt(v)`` entries."""
    return max(16, 1 << max(0, (int(v) - 1).bit_length() + 1) // 2)


def _first_above(cdf: Array, target: Array, positive: Array) -> Array:
    """``[B]`` int32: per row, the first index with ``cdf > target`` among ``positive``;
    the last ``positive`` index if none (rounding); ``cdf``, ``positive``: ``[B, n]``."""
    above = (cdf > target[:, None]) & positive
    last = cdf.shape[-1] - 1 - jnp.argmax(positive[:, ::-1], axis=-1)
    return jnp.where(jnp.any(above, axis=-1), jnp.argmax(above, axis=-1), last).astype(jnp.int32)
