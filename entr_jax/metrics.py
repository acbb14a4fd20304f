"""Token-level diagnostics shared by the learner and the analysis notebooks.

Pure ``jax.numpy`` functions of ``[B, T]`` arrays returning flat dicts of f32 scalars
(slash-namespaced keys), cheap enough to run inside the jitted learner step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from entr_jax.objectives.common import LOG_RATIO_CLIP

# Edges (nats) of the entropy buckets used for per-bucket ratio statistics; the last bucket
# is open-ended. Chosen to separate the near-deterministic regime (< 0.1), where ENTR's
# eps floor dominates, from moderate and high entropy.
ENTROPY_BUCKET_EDGES = (0.0, 0.1, 0.5, 1.0, 2.0)


def _masked(x: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.where(mask, x, 0.0)


def k3_sum(log_ratio_pi_mu: jax.Array, mask: jax.Array) -> jax.Array:
    """Sum over ``mask`` of ``k3 = (r - 1) - log r``, ``r = exp(clip(delta, -20, 20))``
    (the numerator of `kl_mu_pi_k3`, so microbatch sums add up). ``[] f32``."""
    d = jnp.clip(_masked(log_ratio_pi_mu, mask), -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
    return jnp.sum(_masked(jnp.expm1(d) - d, mask))


def kl_mu_pi_k3(log_ratio_pi_mu: jax.Array, mask: jax.Array) -> jax.Array:
    """Estimate of KL(mu || pi) per sampled token, averaged over ``mask``.

    For tokens drawn from mu and ``r = pi/mu``, ``k3 = (r - 1) - log r`` is an unbiased,
    non-negative estimator of KL(mu || pi) (Schulman, "Approximating KL divergence",
    2020). The log-ratio is clipped to [-20, 20] before ``exp``.

    Args:
      log_ratio_pi_mu: ``[B, T] f32`` ``logp_pi - logp_mu``.
      mask: ``[B, T] bool`` tokens to average over.
    Returns: ``[] f32`` (0 when the mask is empty).
    """
    return k3_sum(log_ratio_pi_mu, mask) / jnp.maximum(jnp.sum(mask), 1)


def ratio_by_entropy_bucket_sums(
    log_ratio_pi_mu: jax.Array,
    entropy_mu: jax.Array,
    mask: jax.Array,
    edges: tuple[float, ...] = ENTROPY_BUCKET_EDGES,
) -> dict[str, jax.Array]:
    """Per behavior-entropy bucket: token count, sum of ``delta^2`` and sum of entropy.

    Sums (not means) so that microbatches add up; `bucket_means` turns them into means.
    Bucket ``i`` holds tokens with ``edges[i] <= entropy_mu < edges[i+1]`` (the last is
    open-ended). Keys: ``ratio_by_entropy/b{i}/{count,delta_sq_sum,entropy_sum}``.
    """
    d = _masked(log_ratio_pi_mu, mask)
    h = _masked(entropy_mu, mask)
    out = {}
    for i, lo in enumerate(edges):
        hi = edges[i + 1] if i + 1 < len(edges) else jnp.inf
        in_bucket = mask & (h >= lo) & (h < hi)
        out[f"ratio_by_entropy/b{i}/count"] = jnp.sum(in_bucket).astype(jnp.float32)
        out[f"ratio_by_entropy/b{i}/delta_sq_sum"] = jnp.sum(_masked(d * d, in_bucket))
        out[f"ratio_by_entropy/b{i}/entropy_sum"] = jnp.sum(_masked(h, in_bucket))
    return out


def bucket_means(sums: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """``.../count`` kept, ``..._sum`` entries turned into ``..._mean`` (0 for empty buckets)."""
    out = {}
    for key, value in sums.items():
        if not key.startswith("ratio_by_entropy/"):
            continue
        if key.endswith("/count"):
            out[key] = value
            continue
        count = sums[key.rsplit("/", 1)[0] + "/count"]
        out[key.removesuffix("_sum") + "_mean"] = value / jnp.maximum(count, 1.0)
    return out


def ratio_by_entropy_bucket(
    log_ratio_pi_mu: jax.Array,
    entropy_mu: jax.Array,
    mask: jax.Array,
    edges: tuple[float, ...] = ENTROPY_BUCKET_EDGES,
) -> dict[str, jax.Array]:
    """Second moment of the log-ratio per behavior-entropy bucket.

    ESTR (arXiv 2607.22186, section 3) predicts ``E[delta^2] ~ H``; these figures let a
    run check it. Bucket ``i`` holds tokens with ``edges[i] <= entropy_mu < edges[i+1]``
    (the last bucket is open-ended).

    Args:
      log_ratio_pi_mu: ``[B, T] f32`` delta = ``logp_pi - logp_mu`` (detached by caller).
      entropy_mu: ``[B, T] f32`` behavior entropy, nats.
      mask: ``[B, T] bool``.
    Returns: ``{"ratio_by_entropy/b{i}/count", ".../delta_sq_mean", ".../entropy_mean"}``.
    """
    return bucket_means(ratio_by_entropy_bucket_sums(log_ratio_pi_mu, entropy_mu, mask, edges))
