"""Grouped-query softmax attention: the masked reference and a causal, query-blocked form.

Formula (Vaswani et al. 2017, eq. 1) with grouped-query heads (Ainslie et al. 2023): query
head ``h`` reads kv head ``h // (H / K)``; ``softmax(q k^T / sqrt(hd) + mask) v`` with
scores and softmax in f32. A masked score is the finite ``_MASK_VALUE`` (f32 min), so
``exp(masked - row max)`` underflows to exactly 0 and a row whose every key is masked gets
a uniform (finite, not NaN) softmax.

Layout. Both forms move heads ahead of positions once (``q -> [B, K, G, S, hd]``,
``k, v -> [B, K, T, hd]``; ``G = H / K``), so both score matmuls are batched over
``(B, K)`` with the ``[G * S, T]`` scores contiguous: XLA needs no copy of a score-sized
array in the forward or the backward pass, only of the ``[B, S, H, hd]`` inputs and output.
The backward pass is written out (`_attend_vjp`) so that this holds on XLA:CPU too, where
autodiff's ``dS^T Q`` had the score gradient written transposed.
The KV cache is stored heads-first (keys ``[B, K, hd, M]``, values ``[B, K, M, hd]``), so
a decode step reads it as is instead of transposing the whole cache for each layer at each
step (`attend_cache`); the keys keep the slot axis last, so the scores of one query reduce
over ``hd`` with the slots contiguous.

`causal_attend` (training / scoring forward) splits the queries into blocks of
``C`` positions; query block ``[s0, s1)`` reads only the keys ``[0, s1)`` (the keys a causal
query there may see), so the upper-triangle blocks are neither computed nor stored for the
backward pass: with ``n`` blocks the score work is ``(n + 1) / (2 n)`` of the full ``L^2``.
Within a row it is the same softmax over the same unmasked keys as `attend` with the
causal-and-padding mask (masked keys contribute exactly 0), so the two agree to f32
rounding on every row with at least one readable key.

Blocks and autodiff. The positions are cut into the blocks' segments once
(``lax.split``), and block ``i`` reads query segment ``i`` and the concatenation of key
and value segments ``0..i``. Reverse-mode autodiff transposes a split into a
concatenation and a concatenation into slices, so each segment's gradient is a sum of
same-sized slices. Slicing ``k[:, :s1]`` per block instead transposes into a zero-padded
full-length array per block, summed over the blocks: with 8 blocks, 22 full-length pads
per layer (8 of dQ, 7 each of dK and dV; their cost: docs/performance.md).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

# Finite "minus infinity" so that a fully masked query row gives a uniform (not NaN) softmax.
_MASK_VALUE = float(np.finfo(np.float32).min)
# Query blocks of `causal_attend`: at least MIN_BLOCK positions, at most MAX_BLOCKS blocks
# (the blocks are unrolled, so their count bounds the compiled program's size).
MIN_BLOCK = 128
MAX_BLOCKS = 8


def _heads_first(q: jax.Array, num_kv_heads: int) -> jax.Array:
    """``[B, S, H, hd] -> [B, K, G, S, hd]`` with query head ``h = k * G + g``."""
    b, s, h, hd = q.shape
    return q.reshape(b, s, num_kv_heads, h // num_kv_heads, hd).transpose(0, 2, 3, 1, 4)


def _positions_first(out: jax.Array) -> jax.Array:
    """``[B, K, G, S, hd] -> [B, S, K * G * hd]``."""
    b, kv, g, s, hd = out.shape
    return out.transpose(0, 3, 1, 2, 4).reshape(b, s, kv * g * hd)


def _softmax_attend(qh, kh, vh, mask, dtype, *, keys_last: bool = False):
    """``qh [B,K,G,S,hd]``, ``kh [B,K,T,hd]`` (``[B,K,hd,T]`` when ``keys_last``), ``vh
    [B,K,T,hd]``, ``mask`` bool broadcastable to ``[B,K,G,S,T]`` -> ``[B,K,G,S,hd]`` in
    ``dtype``. The positions-last form (training) differentiates through `_attend_vjp`."""
    if keys_last:
        return _probs_values(_probs(qh, kh, mask, keys_last=True), vh, dtype)
    return _attend_vjp(qh, kh, vh, mask, dtype)


def _probs(qh, kh, mask, *, keys_last: bool = False):
    """``softmax(q k^T / sqrt(hd))`` over the unmasked keys: ``[B,K,G,S,T]`` f32."""
    scale = 1.0 / math.sqrt(qh.shape[-1])
    scores = jnp.einsum("bkgsd,bkdt->bkgst" if keys_last else "bkgsd,bktd->bkgst", qh,
                        kh.astype(qh.dtype), preferred_element_type=jnp.float32) * scale
    scores = jnp.where(mask, scores, _MASK_VALUE)
    return jax.nn.softmax(scores, axis=-1)


def _probs_values(probs, vh, dtype):
    """``probs [B,K,G,S,T]`` (f32) times ``vh [B,K,T,hd]``, both cast to ``dtype`` ->
    ``[B,K,G,S,hd]`` in ``dtype``."""
    return jnp.einsum("bkgst,bktd->bkgsd", probs.astype(dtype), vh.astype(dtype))


def _contract_rows(a, b):
    """``[B, K, hd, T]``: ``a^T b`` over the ``G * S`` rows of ``a [B, K, G, S, hd]`` and
    ``b [B, K, G, S, T]``, batched over ``(B, K)`` (one contracting axis: merged by a free
    reshape, so XLA:CPU hands the product to its matmul library)."""
    bb, kk, g, s = a.shape[:4]
    a = a.reshape(bb, kk, g * s, a.shape[-1])
    b = b.reshape(bb, kk, g * s, b.shape[-1])
    return jax.lax.dot_general(a, b, (((2,), (2,)), ((0, 1), (0, 1))))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attend_vjp(qh, kh, vh, mask, dtype):
    """`_softmax_attend` (positions-last keys) with the same values and a backward pass in
    which no ``[B, K, G, S, T]`` array is transposed.

    Reverse-mode autodiff forms the key and value gradients as ``dS^T Q`` and ``P^T dO``,
    which contract the ``G * S`` rows of the score-sized ``dS`` and ``P``; XLA:CPU then
    lays the elementwise fusion that produces them out transposed, writing a score-sized
    array column by column (``copy_bitcast_fusion``; its cost: docs/performance.md).
    Here they are formed transposed instead, ``(Q^T dS)^T`` and ``(dO^T P)^T``: the
    score-sized operand is read in its own row-major layout and only the ``[T, hd]``
    results are transposed. Same products (float rounding aside): the softmax backward
    ``dS = P * (dP - sum_t dP * P) / sqrt(hd)`` on the unmasked scores, 0 on masked ones.
    In bfloat16, ``dP`` is accumulated in f32 and ``dS`` is rounded to bf16 before its two
    products, as the forward's ``P`` is; autodiff rounds at other places, so the two agree
    to bf16 precision, not bit for bit. Reverse mode only (a ``custom_vjp``: no ``jvp``).
    """
    return _probs_values(_probs(qh, kh, mask), vh, dtype)


def _attend_fwd(qh, kh, vh, mask, dtype):
    """Forward of `_attend_vjp`; residuals: the inputs and the f32 ``P [B,K,G,S,T]``."""
    probs = _probs(qh, kh, mask)
    return _probs_values(probs, vh, dtype), (qh, kh, vh, mask, probs)


def _attend_bwd(dtype, res, d_out):
    """Backward of `_attend_vjp`: ``d_out [B,K,G,S,hd]`` -> cotangents of ``(qh, kh, vh,
    mask)`` in their dtypes (None for the bool mask)."""
    qh, kh, vh, mask, probs = res
    d_out = d_out.astype(dtype)
    d_probs = jnp.einsum("bkgsd,bktd->bkgst", d_out, vh.astype(dtype),
                         preferred_element_type=jnp.float32)
    d_v = _contract_rows(d_out, probs.astype(dtype))  # [B, K, hd, T]
    d_scores = probs * (d_probs - jnp.sum(d_probs * probs, axis=-1, keepdims=True))
    d_scores = jnp.where(mask, d_scores, 0.0) * (1.0 / math.sqrt(qh.shape[-1]))
    d_q = jnp.einsum("bkgst,bktd->bkgsd", d_scores.astype(qh.dtype), kh.astype(qh.dtype))
    d_k = _contract_rows(qh, d_scores.astype(qh.dtype))  # [B, K, hd, T]
    return (d_q.astype(qh.dtype), jnp.swapaxes(d_k, 2, 3).astype(kh.dtype),
            jnp.swapaxes(d_v, 2, 3).astype(vh.dtype), None)


_attend_vjp.defvjp(_attend_fwd, _attend_bwd)


def attend_cache(q: jax.Array, cache_k: jax.Array, cache_v: jax.Array, mask: jax.Array,
                 dtype) -> jax.Array:
    """Grouped-query softmax attention over a heads-first KV cache (the decode path).

    Args:
      q: ``[B, S, H, hd]``; cache_k: ``[B, K, hd, T]``, cache_v: ``[B, K, T, hd]`` (the
        `KVCache` layout, read in place: no per-step copy of the cache) with ``H % K == 0``.
      mask: ``[B, S, T]`` bool, True where query s may read key (cache slot) t.
      dtype: dtype of the probabilities, the value matmul and the result.
    Returns:
      ``[B, S, H * hd]`` in ``dtype``.
    """
    out = _softmax_attend(_heads_first(q, cache_k.shape[1]), cache_k, cache_v,
                          mask[:, None, None, :, :], dtype, keys_last=True)
    return _positions_first(out)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, dtype) -> jax.Array:
    """Grouped-query softmax attention under an explicit mask: ``q [B, S, H, hd]``,
    ``k, v [B, T, K, hd]`` (positions-first), ``mask [B, S, T]`` bool; returns
    ``[B, S, H * hd]`` in ``dtype`` (the reference form of `causal_attend`)."""
    out = _softmax_attend(_heads_first(q, k.shape[2]), k.transpose(0, 2, 1, 3),
                          v.transpose(0, 2, 1, 3), mask[:, None, None, :, :], dtype)
    return _positions_first(out)


def query_blocks(length: int, min_block: int | None = None,
                 max_blocks: int | None = None) -> list[tuple[int, int]]:
    """Static ``[s0, s1)`` query blocks of `causal_attend`: blocks of
    ``C = max(min_block, ceil(length / max_blocks))`` positions, the last one shorter
    (None: the module's `MIN_BLOCK` / `MAX_BLOCKS`, read at call time)."""
    min_block = MIN_BLOCK if min_block is None else min_block
    max_blocks = MAX_BLOCKS if max_blocks is None else max_blocks
    if length < 1 or min_block < 1 or max_blocks < 1:
        raise ValueError(
            f"query_blocks needs length, min_block, max_blocks >= 1, got {length}, {min_block}, "
            f"{max_blocks}")
    size = max(min_block, -(-length // max_blocks))
    return [(s0, min(s0 + size, length)) for s0 in range(0, length, size)]


def causal_attend(q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array, dtype, *,
                  min_block: int | None = None, max_blocks: int | None = None) -> jax.Array:
    """Causal grouped-query self-attention with key padding, upper triangle skipped.

    Equals ``attend(q, k, v, mask, dtype)`` with ``mask[b, s, t] = (t <= s) & valid[b, t]``
    on every query row that can read at least one key (module docstring); a row that can
    read none (e.g. a left-padding position) gets a finite, meaningless value.

    Args:
      q: ``[B, L, H, hd]``; k, v: ``[B, L, K, hd]`` (the same L positions), ``H % K == 0``.
      valid: ``[B, L]`` bool, True on real tokens; padding keys are never read.
      dtype: dtype of the probabilities, the value matmul and the result.
      min_block, max_blocks: query blocking, see `query_blocks` (static ints).
    Returns:
      ``[B, L, H * hd]`` in ``dtype``.
    """
    length, kv = q.shape[1], k.shape[2]
    if k.shape[1] != length or v.shape[1] != length or valid.shape != q.shape[:2]:
        raise ValueError(
            f"causal_attend: q {q.shape}, k {k.shape}, v {v.shape} and valid {valid.shape} "
            "must share [B, L]")
    qh = _heads_first(q, kv)
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    idx = np.arange(length)
    blocks = query_blocks(length, min_block, max_blocks)
    # Positions split into the blocks' segments: block i reads segment i of the queries and
    # segments 0..i of the keys and values (module docstring, "Blocks and autodiff").
    sizes = [s1 - s0 for s0, s1 in blocks]
    q_seg = jax.lax.split(qh, sizes, axis=3)
    k_seg, v_seg = jax.lax.split(kh, sizes, axis=2), jax.lax.split(vh, sizes, axis=2)
    outs = []
    for i, (s0, s1) in enumerate(blocks):
        causal = idx[s0:s1, None] >= idx[None, :s1]  # static [s1 - s0, s1]
        mask = causal[None, None, None] & valid[:, None, None, None, :s1]
        k_i = jnp.concatenate(k_seg[:i + 1], axis=2) if i else k_seg[0]
        v_i = jnp.concatenate(v_seg[:i + 1], axis=2) if i else v_seg[0]
        outs.append(_softmax_attend(q_seg[i], k_i, v_i, mask, dtype))
    return _positions_first(outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=3))
