"""A synthetic, seeded train/inference mismatch for the embedded sampler.

Real inference engines compute the behavior distribution with other numerics than the
learner (bf16/fp8 weights and activations, other kernels, batch-dependent reductions), so
``logp_mu`` differs from the learner's ``logp_pi`` even with the same weights. ESTR
(arXiv 2607.22186, Sec. 1 and 3.5) points out that this noise is amplified into large
log-ratios at low-entropy positions, where the sampled token can have a tiny probability.
The tiny CPU model shows little of it in bfloat16 (``benchmarks/mismatch.py`` measures
it), so the sampler offers a stand-in: **synthetic** Gaussian noise on its logits,

    logits_mu = logits + logit_noise_std * n,   n ~ N(0, I_V),

drawn per response token from that token's own key (the sampler's per-token key
``fold_in(fold_in(fold_in(key(seed), prompt_index), sample_index), step)``, folded with
`NOISE_STREAM`), so the same seed gives the same noise whatever the batch composition.
Temperature, filters, the draw, ``logp_mu`` and ``entropy_mu`` then all use
``logits_mu``: the recorded behavior statistics describe exactly the perturbed
distribution that sampled, and the learner (which never sees the noise) carries the
mismatch in its importance ratio, as it would carry a real engine's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

# folded into a token's sampling key to get its (independent) noise key
NOISE_STREAM = 0x6D69736D  # "mism"


def perturb_logits(logits: Array, keys: Array, logit_noise_std: float) -> Array:
    """Synthetic mismatch: ``logits + logit_noise_std * N(0, 1)`` per entry.

    Args:
      logits: ``[B, V]`` raw logits of one decode step (any float dtype).
      keys: ``[B]`` typed PRNG keys, the rows' sampling keys of this step.
      logit_noise_std: standard deviation in logit units (nats), >= 0; 0 returns the
        logits unchanged (no draw).
    Returns:
      ``[B, V]`` float32.
    """
    logits = logits.astype(jnp.float32)
    if logit_noise_std == 0.0:
        return logits
    v = logits.shape[-1]
    noise = jax.vmap(
        lambda k: jax.random.normal(jax.random.fold_in(k, NOISE_STREAM), (v,), jnp.float32)
    )(keys)
    return logits + jnp.float32(logit_noise_std) * noise
