"""Token/sequence gates as public pure functions (boolean keep-masks, ``[B, T]``).

Every gate stops gradient on its inputs and returns False (reject) for non-finite inputs,
checked on the values it is given *before* the ±20 clip of a log-ratio: a log-prob of
``-inf`` (or NaN) is rejected, not read as a log-ratio of ±20 that a wide band would keep.
Callers therefore pass raw log-ratios (``sg(logp_a) - logp_b``), never clipped ones.
The batch-level gates (`m2po_mask`, `sat_quantile`) use global ``jnp`` reductions over
the whole ``[B, T]`` array they are given: under ``jit`` with a batch-sharded input GSPMD
makes them global. The learner gives them the whole optimizer batch (also under gradient
accumulation, through the objectives' ``*_batch_stats`` functions), so their scope is the
optimizer batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from entr_jax.objectives.common import LOG_RATIO_CLIP

Array = jax.Array
sg = jax.lax.stop_gradient


def _replicated(x: Array) -> Array:
    """Gathers ``x`` to every device when its type carries an explicit sharding.

    Batch-level sorts need the whole array: with ``Auto`` mesh axes (GSPMD) the compiler
    does this itself; with ``Explicit`` axes (``jax.make_mesh``'s default) a sort over a
    sharded dimension is a type error, so the array is resharded to replicated first.
    """
    sharding = getattr(jax.typeof(x), "sharding", None)
    spec = getattr(sharding, "spec", None)
    if spec is not None and any(p is not None for p in spec):
        return jax.sharding.reshard(x, jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec()))
    return x


def entr_score(log_ratio: Array, entropy: Array, eps: float) -> Array:
    """ENTR/ESTR entropy score ``S = delta**2 / (H + eps)`` (arXiv 2607.22186, section 3.2).

    ``H`` is clamped at 0 (an entropy is never negative; tiny negatives are rounding).
    Where ``H + eps == 0`` the denominator is floored at 1e-30, so ``S`` is finite.
    """
    d = jnp.clip(sg(log_ratio), -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
    h = jnp.maximum(sg(entropy), 0.0)
    return d * d / jnp.maximum(h + eps, 1e-30)


def entr_mask(log_ratio: Array, entropy: Array, tau: float, eps: float) -> Array:
    """ENTR keep-mask ``M = 1[delta**2 / (H + eps) <= tau]`` (arXiv 2607.22186, section 3.2).

    Computed in the division-free form ``delta**2 <= tau * (max(H, 0) + eps)``, so
    ``H + eps = 0`` with ``delta = 0`` keeps the token and nothing is ever 0/0.
    Equivalent to ``|delta| <= sqrt(tau (H + eps))``: symmetric in the sign of delta,
    non-increasing in ``|delta|``, non-decreasing in ``H``; with ``H + eps`` a constant
    ``C`` it is the fixed band ``|delta| <= sqrt(tau C)``.

    Args:
      log_ratio: ``[B, T]`` ``delta = log pi - log mu`` (stop-gradient inside).
      entropy: ``[B, T]`` behavior entropy ``H`` in nats.
      tau: keep threshold (> 0); ``inf`` switches the gate off (every finite token kept,
        also where ``H + eps = 0``, where ``inf * 0`` would be NaN). eps: entropy floor (>= 0).

    Returns:
      ``[B, T] bool``, false where ``log_ratio`` or ``entropy`` is not finite (``log_ratio``
      checked before its ±20 clip).
    """
    raw = sg(log_ratio)
    d = jnp.clip(raw, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
    h = sg(entropy)
    finite = jnp.isfinite(h) & jnp.isfinite(raw)
    if tau == float("inf"):
        return finite
    return (d * d <= tau * (jnp.maximum(h, 0.0) + eps)) & finite


def icepop_mask(log_ratio: Array, alpha: float, beta: float) -> Array:
    """IcePop / MIS keep-mask ``1[alpha <= k <= beta]``, ``k = exp(log_ratio)`` (Ring-1T,
    arXiv 2510.18855; algorithms.md 4.6). Returns ``[B, T] bool``, false where
    ``log_ratio`` is not finite (checked before its ±20 clip)."""
    raw = sg(log_ratio)
    k = jnp.exp(jnp.clip(raw, -LOG_RATIO_CLIP, LOG_RATIO_CLIP))
    return (k >= alpha) & (k <= beta) & jnp.isfinite(raw)


def _log1mexp(x: Array) -> Array:
    """``log(1 - exp(x))`` for ``x <= 0`` (-inf at x = 0), accurate on both sides of -log 2."""
    return jnp.where(x > -0.6931472, jnp.log(-jnp.expm1(x)), jnp.log1p(-jnp.exp(x)))


def binary_kl(logp: Array, logq: Array) -> Array:
    """Bernoulli KL ``D(p||q) = p log(p/q) + (1-p) log((1-p)/(1-q))`` from log-probs.

    KPop, algorithms.md 4.7. Log-probs are clamped to ``[-1e4, 0]``; ``0 log 0 = 0``;
    ``p < 1 = q`` gives ``+inf``. Returns ``[B, T] f32`` (>= 0 up to rounding).
    """
    lp = jnp.clip(sg(logp), -1e4, 0.0)
    lq = jnp.clip(sg(logq), -1e4, 0.0)
    l1p, l1q = _log1mexp(lp), _log1mexp(lq)
    t1 = jnp.exp(lp) * (lp - lq)
    finite_1p = jnp.isfinite(l1p)
    safe_l1p = jnp.where(finite_1p, l1p, 0.0)
    t2 = jnp.where(finite_1p, jnp.exp(safe_l1p) * (safe_l1p - l1q), 0.0)
    return t1 + t2


def kpop_mask(logp_train: Array, logp_infer: Array, phi: float) -> Array:
    """KPop keep-mask ``1[max(D(p||q), D(q||p)) <= phi]`` with ``p = exp(logp_train)``,
    ``q = exp(logp_infer)`` the sampled-token probabilities (algorithms.md 4.7, AReaL
    ``rejection_sampling.upper``). Returns ``[B, T] bool``, false where either log-prob is
    not finite (checked before `binary_kl` clamps them to ``[-1e4, 0]``)."""
    fwd = binary_kl(logp_train, logp_infer)
    rev = binary_kl(logp_infer, logp_train)
    finite = jnp.isfinite(sg(logp_train)) & jnp.isfinite(sg(logp_infer))
    return (fwd <= phi) & (rev <= phi) & finite


def m2po_mask(log_ratio: Array, loss_mask: Array, tau: float) -> Array:
    """M2PO second-moment keep-mask (arXiv 2510.01161; algorithms.md 4.10).

    Over the valid tokens (``loss_mask`` and a finite log-ratio, checked before its ±20
    clip; the others are rejected) of the whole batch, sort
    ``(log r)**2`` descending and reject the smallest prefix such that the mean of the
    remaining tokens is ``<= tau``. Ties are broken by flat index (stable sort). If no
    prefix suffices every valid token is rejected. Batch scope: the whole ``[B, T]`` array
    given (global under GSPMD sharding).

    Returns ``[B, T] bool`` (subset of ``loss_mask``).
    """
    raw = sg(log_ratio)
    lr = jnp.clip(raw, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
    valid = loss_mask & jnp.isfinite(raw)
    sq = _replicated(jnp.where(valid, lr * lr, -1.0)).reshape(-1)  # invalid tokens sort last
    order = jnp.argsort(-sq, stable=True)
    sq_sorted = sq[order]
    valid_sorted = sq_sorted >= 0.0
    n = jnp.sum(valid_sorted, dtype=jnp.int32)
    vals = jnp.where(valid_sorted, sq_sorted, 0.0)
    # suffix_sum[k] = sum of sorted[k:], accumulated from the small end for accuracy.
    suffix_sum = jnp.cumsum(vals[::-1])[::-1]
    k = jnp.arange(sq.shape[0], dtype=jnp.int32)
    remaining = (n - k).astype(jnp.float32)
    ok = (k <= n) & (suffix_sum <= tau * jnp.maximum(remaining, 1.0))
    # smallest k in [0, n] that is ok; k = n (reject all) when none is.
    num_rejected = jnp.minimum(jnp.min(jnp.where(ok, k, n)), n)
    keep_sorted = valid_sorted & (k >= num_rejected)
    keep = jnp.zeros_like(keep_sorted).at[order].set(keep_sorted)
    return keep.reshape(loss_mask.shape)  # replicated; consumers reshard as they need


def trm_mask(log_ratio: Array, loss_mask: Array, threshold: float, criterion: str = "max") -> Array:
    """Trust Region Masking sequence gate (arXiv 2512.23075; algorithms.md 4.11).

    ``criterion="max"``: reject row i if ``max_t k2 > threshold``, ``k2 = (log r)**2 / 2``.
    ``criterion="mean"``: reject row i if ``mean_t k3 > threshold``,
    ``k3 = r - log r - 1``. Over the row's loss tokens; a non-finite log-ratio on a loss
    token rejects its row. Returns ``[B, T] bool``: the row decision broadcast over its
    loss tokens.
    """
    raw = sg(log_ratio)
    lr = jnp.clip(jnp.where(loss_mask, raw, 0.0), -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
    bad_B = jnp.any(loss_mask & ~jnp.isfinite(raw), axis=1)
    if criterion == "max":
        stat_B = jnp.max(jnp.where(loss_mask, 0.5 * lr * lr, 0.0), axis=1)
    elif criterion == "mean":
        k3 = jnp.exp(lr) - lr - 1.0
        n_B = jnp.maximum(jnp.sum(loss_mask, axis=1, dtype=jnp.float32), 1.0)
        stat_B = jnp.sum(jnp.where(loss_mask, k3, 0.0), axis=1) / n_B
    else:
        raise ValueError(f"criterion must be 'max' or 'mean', got {criterion!r}")
    keep_B = (stat_B <= threshold) & ~bad_B
    return loss_mask & keep_B[:, None]


def sat_quantile(log_ratio: Array, loss_mask: Array, alpha: float) -> Array:
    """SAT quantile ``q`` of ``|sg(log r)|`` at level ``alpha`` over the batch's loss tokens
    (linear interpolation; non-finite entries ignored; 0 when there are none). Batch scope:
    the whole array given (global under GSPMD sharding)."""
    d = jnp.abs(sg(log_ratio))
    q = jnp.nanquantile(_replicated(jnp.where(loss_mask & jnp.isfinite(d), d, jnp.nan)), alpha)
    return jnp.where(jnp.isnan(q), 0.0, q)


def sat_clip_factors(
    log_ratio: Array, loss_mask: Array, alpha: float = 0.9, exponent: float = 2.0, kernel: str = "shifted",
    q: Array | None = None,
) -> tuple[Array, Array, Array]:
    """SAT staleness-adaptive clip contraction factors (arXiv 2607.18722; algorithms.md 4.15).

    ``d = sg(log r)``, ``q = sat_quantile(d, alpha)`` (or the given ``q``, e.g. the
    quantile of the whole optimizer batch when ``log_ratio`` is one microbatch). A token is *contracted* when
    ``q > 0`` and ``|d| > q``; then ``c = Hill(|d|; q)`` goes to the endpoint on the side
    the ratio is heading (``d > 0``: ``c_high``; ``d < 0``: ``c_low``), the other stays 1.
    The Hill kernel is UNKNOWN in the source; INFERRED choices:
    ``kernel="shifted"``: ``1 / (1 + ((|d| - q)/q)**exponent)`` (continuous at q, default);
    ``kernel="standard"``: ``q**e / (q**e + |d|**e)``.

    Returns:
      ``(c_low, c_high, contracted)``: ``[B, T] f32`` factors in (0, 1] and the
      ``[B, T] bool`` contracted tokens. The clip band is
      ``[1 - clip_low * c_low, 1 + clip_high * c_high]``.
    """
    d = jnp.clip(sg(log_ratio), -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
    if q is None:
        q = sat_quantile(log_ratio, loss_mask, alpha)
    q = sg(q)
    a = jnp.abs(d)
    contracted = loss_mask & jnp.isfinite(d) & (q > 0) & (a > q)
    safe_q = jnp.where(q > 0, q, 1.0)
    if kernel == "shifted":
        c = 1.0 / (1.0 + ((a - safe_q) / safe_q) ** exponent)
    elif kernel == "standard":
        c = safe_q**exponent / (safe_q**exponent + a**exponent)
    else:
        raise ValueError(f"kernel must be 'shifted' or 'standard', got {kernel!r}")
    c = jnp.where(contracted, c, 1.0)
    c_high = jnp.where(d > 0, c, 1.0)
    c_low = jnp.where(d < 0, c, 1.0)
    return c_low, c_high, contracted
