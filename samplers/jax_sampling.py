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

Drawing: Gumbel-max (Gumbel 1954; ``argmax_w z_w + g_w`` with ``g_w ~ Gumbel(0, 1)`` i.i.d.
is a draw from ``softmax(z)``) over the filtered logits. The noise ``g`` is drawn in
vocabulary order from the row's key, so a filter that keeps every token samples the same
token as no filter.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from entr_jax.logprobs import logprobs_entropy_from_logits
from entr_jax.sampling_filter import filter_logits

Array = jax.Array

__all__ = ["sample_tokens"]


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
    gumbel = jax.vmap(lambda k: jax.random.gumbel(k, (z.shape[-1],), jnp.float32))(keys)
    if filtered:
        z = filter_logits(z, top_k, top_p, min_p)
    tokens = jnp.argmax(z + gumbel, axis=-1).astype(jnp.int32)
    logp, entropy = logprobs_entropy_from_logits(z, tokens)
    return tokens, logp, entropy
