"""Decoder building blocks: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, block.

Formulas:
- RMSNorm (Zhang & Sennrich 2019, eq. 4): ``y = x / sqrt(mean(x**2) + eps) * g``, computed in
  f32 and cast back to the compute dtype before the gain (as HF Llama/Qwen do).
- RoPE (Su et al. 2021, RoFormer eq. 34), "rotate-half" layout used by HF:
  ``x' = x * cos(p * w) + rotate_half(x) * sin(p * w)``, ``w_i = theta ** (-2i / head_dim)``;
  with Llama 3 scaling the ``w_i`` are rescaled by wavelength band (see `rope_inv_freq`).
- Attention (Vaswani et al. 2017, eq. 1) with grouped-query heads (Ainslie et al. 2023):
  query head ``h`` reads kv head ``h // (H / K)``; scores and softmax in f32 (see
  `entr_jax.model.attention`: causal query blocks in the full forward, a mask in decode).
- SwiGLU MLP (Shazeer 2020, eq. 6): ``down(silu(gate(x)) * up(x))``.

The decoder holds its blocks as one `Block` whose parameters carry a leading layer axis
(`stacked_blocks`, built with ``nnx.vmap``) and applies them with a scan, so a compiled
program holds one layer's computation whatever the depth (MaxText, levanter).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from entr_jax.model.attention import attend_cache
from entr_jax.model.attention_impl import self_attention
from entr_jax.model.config import ModelConfig
from entr_jax.model.matmul import dense_dot_general

INIT = nnx.initializers.normal(stddev=0.02)  # every weight matrix's init (decoder.py too)

# Rematerialisation policies of a decoder layer in the backward pass (``jax.checkpoint``):
# None = no checkpoint (every residual kept); nothing saveable = recompute the layer;
# the weight matmuls' outputs saved, the rest (norms, RoPE, attention, SwiGLU) recomputed.
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def partitioned(init, axes):
    """``init`` with the logical sharding ``axes`` attached (`nnx.with_partitioning`)."""
    return nnx.with_partitioning(init, axes, eager_sharding=False)


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """Inverse RoPE frequencies ``[head_dim // 2]`` float32 (radians per position).

    Plain: ``w_i = theta ** (-2i / head_dim)``. Llama 3 scaling (Meta Llama 3.1 release): with
    wavelength ``l_i = 2 pi / w_i``, ``L = original_max_position_embeddings``, bands
    ``l_i > L / low_freq_factor`` -> ``w_i / factor``; ``l_i < L / high_freq_factor`` -> ``w_i``;
    in between ``(1 - s) w_i / factor + s w_i`` with
    ``s = (L / l_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``.
    """
    hd = config.head_dim
    inv = 1.0 / (config.rope_theta ** (np.arange(0, hd, 2, dtype=np.int64).astype(np.float32) / hd))
    inv = inv.astype(np.float32)
    rs = config.rope_scaling
    if rs is None:
        return inv
    old = float(rs.original_max_position_embeddings)
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / rs.low_freq_factor, inv / rs.factor, inv)
    smooth = (old / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = (wavelen >= old / rs.high_freq_factor) & (wavelen <= old / rs.low_freq_factor)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(positions: jax.Array, inv_freq: np.ndarray,
                 num_positions: int | None = None) -> tuple[jax.Array, jax.Array]:
    """``(cos, sin)`` of the rotary angles ``p * w_i`` at ``positions [B, S]`` (int).

    Returns two ``[B, S, 1, hd]`` f32 arrays, the ``hd / 2`` frequencies repeated over both
    halves (rotate-half layout); the angles are the f32 products ``float(p) * w_i``.

    With ``num_positions`` (a static int; every position must lie in ``[0,
    num_positions)``, which the caller guarantees) they are looked up by position in a
    ``[num_positions, hd / 2]`` table of the same angles: the same values bit for bit, made
    once per call, so the fusions that rotate each layer's queries and keys (forward and
    backward) read them instead of evaluating cos and sin per head and element (XLA fuses
    the table's cos and sin into the lookup itself; measured in docs/performance.md).
    Without it (decode, where positions follow the cache) they are
    evaluated at ``positions`` directly.
    """
    inv = jnp.asarray(inv_freq)
    if num_positions is None:
        angles = positions.astype(jnp.float32)[:, :, None] * inv[None, None, :]
        cos, sin = jnp.cos(angles), jnp.sin(angles)
    else:
        table = jnp.arange(num_positions, dtype=jnp.float32)[:, None] * inv[None, :]
        cos, sin = jnp.cos(table)[positions], jnp.sin(table)[positions]
    return (jnp.concatenate([cos, cos], axis=-1)[:, :, None, :],
            jnp.concatenate([sin, sin], axis=-1)[:, :, None, :])


def rope_rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates ``x [B, S, N, hd]`` by `rope_cos_sin`'s ``cos, sin [B, S, 1, hd]``; math in
    f32, returns x.dtype."""
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos + rotated * sin).astype(x.dtype)


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis; parameter ``scale [dim]`` (init ones)."""

    def __init__(self, dim: int, eps: float, axis_name: str, *, dtype, param_dtype):
        self.eps = eps
        self.dtype = dtype
        self.scale = nnx.Param(
            jnp.ones((dim,), param_dtype), out_sharding=(axis_name,), eager_sharding=False
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        scale = self.scale[...].astype(self.dtype).reshape((1,) * (x.ndim - 1) + (-1,))
        return normed.astype(self.dtype) * scale


def _linear(din, dout, axes, bias, rngs, dtype, param_dtype):
    return nnx.Linear(
        din, dout, use_bias=bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
        kernel_init=partitioned(INIT, axes),
        bias_init=partitioned(nnx.initializers.zeros_init(), axes[1:]),
        dot_general=dense_dot_general,  # its weight gradient contracts 2-D operands
    )


class Attention(nnx.Module):
    """Self-attention with RoPE, GQA, optional q/k/v bias (qwen2/llama) and q/k norm (qwen3)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, dtype, param_dtype,
                 attention: str = "auto"):
        c = config
        d, h, k, hd = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim, self.dtype = h, k, hd, dtype
        self.implementation = attention
        bias = c.attention_bias
        self.q_proj = _linear(d, h * hd, ("embed", "heads"), bias, rngs, dtype, param_dtype)
        self.k_proj = _linear(d, k * hd, ("embed", "kv_heads"), bias, rngs, dtype, param_dtype)
        self.v_proj = _linear(d, k * hd, ("embed", "kv_heads"), bias, rngs, dtype, param_dtype)
        o_bias = bias and c.architecture == "llama"
        self.o_proj = _linear(h * hd, d, ("heads", "embed"), o_bias, rngs, dtype, param_dtype)
        if c.qk_norm:
            self.q_norm = RMSNorm(hd, c.rms_norm_eps, "head_dim", dtype=dtype, param_dtype=param_dtype)
            self.k_norm = RMSNorm(hd, c.rms_norm_eps, "head_dim", dtype=dtype, param_dtype=param_dtype)
        else:
            self.q_norm = self.k_norm = None

    def qkv(self, x: jax.Array, rope: tuple[jax.Array, jax.Array]):
        """Projects ``x [B, S, D]`` to RoPE'd ``q [B,S,H,hd]`` and ``k, v [B,S,K,hd]``;
        ``rope``: `rope_cos_sin` at the tokens' positions."""
        b, s, _ = x.shape
        q = self.q_proj(x).reshape(b, s, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, s, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, s, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return rope_rotate(q, *rope), rope_rotate(k, *rope), v

    def __call__(self, x, rope, valid):
        """Full-sequence causal attention: ``x [B,L,D]``, ``rope`` (`rope_cos_sin` of the
        positions, ``[B,L,1,hd]`` each), ``valid [B,L]`` bool (True = real token; padding
        keys are never read); computed by `self_attention` with this layer's
        implementation."""
        q, k, v = self.qkv(x, rope)
        return self.o_proj(self_attention(q, k, v, valid, self.dtype, self.implementation))

    def decode(self, x, positions, rope, cache_k, cache_v, layer=None):
        """Writes the new K/V at slot = position of this layer's cache, attends to its
        slots ``<= position``.

        ``x [B,S,D]``, ``positions [B,S]`` int32, ``rope`` (`rope_cos_sin` of the
        positions); the cache (`entr_jax.model.decoder.KVCache`) is this layer's
        ``cache_k [B,K,hd,M]``, ``cache_v [B,K,M,hd]`` when ``layer`` is None, else every
        layer's ``[N,B,K,hd,M]`` / ``[N,B,K,M,hd]`` with ``layer`` an int32 scalar in
        ``[0, N)`` (the decode scan carries the whole cache). Returns ``(out [B,S,D],
        cache_k, cache_v)`` with only this layer's written slots changed (a scatter, not
        a copy). Positions ``>= M`` are dropped from the write.
        """
        q, k, v = self.qkv(x, rope)
        rows = jnp.arange(x.shape[0], dtype=jnp.int32)[:, None]
        rows = jnp.broadcast_to(rows, positions.shape)
        at = () if layer is None else (layer,)
        # Index [rows, :, :, positions] of [B, K, hd, M] and [rows, :, positions] of
        # [B, K, M, hd] both select [B, S, K, hd]: k's and v's own layout.
        cache_k = cache_k.at[at + (rows, slice(None), slice(None), positions)].set(
            k.astype(cache_k.dtype), mode="drop")
        cache_v = cache_v.at[at + (rows, slice(None), positions)].set(
            v.astype(cache_v.dtype), mode="drop")
        own_k, own_v = (cache_k, cache_v) if layer is None else (cache_k[layer], cache_v[layer])
        slots = jnp.arange(own_v.shape[2], dtype=jnp.int32)
        mask = slots[None, None, :] <= positions[:, :, None]
        out = self.o_proj(attend_cache(q, own_k, own_v, mask, self.dtype))
        return out, cache_k, cache_v


class MLP(nnx.Module):
    """SwiGLU: ``down_proj(silu(gate_proj(x)) * up_proj(x))``, no biases."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        d, i = config.hidden_size, config.intermediate_size
        self.gate_proj = _linear(d, i, ("embed", "mlp"), False, rngs, dtype, param_dtype)
        self.up_proj = _linear(d, i, ("embed", "mlp"), False, rngs, dtype, param_dtype)
        self.down_proj = _linear(i, d, ("mlp", "embed"), False, rngs, dtype, param_dtype)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nnx.Module):
    """Pre-norm decoder block: ``h = x + attn(norm1(x)); y = h + mlp(norm2(h))``."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, dtype, param_dtype,
                 attention: str = "auto"):
        eps = config.rms_norm_eps
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.input_norm = RMSNorm(config.hidden_size, eps, "norm", **kw)
        self.attn = Attention(config, rngs=rngs, attention=attention, **kw)
        self.post_attn_norm = RMSNorm(config.hidden_size, eps, "norm", **kw)
        self.mlp = MLP(config, rngs=rngs, **kw)

    def __call__(self, x, rope, valid):
        h = x + self.attn(self.input_norm(x), rope, valid)
        return h + self.mlp(self.post_attn_norm(h))

    def decode(self, x, positions, rope, cache_k, cache_v, layer=None):
        """`Attention.decode` (this layer's cache, or every layer's and this one's index)
        inside the block."""
        a, cache_k, cache_v = self.attn.decode(self.input_norm(x), positions, rope, cache_k,
                                               cache_v, layer)
        h = x + a
        return h + self.mlp(self.post_attn_norm(h)), cache_k, cache_v


class _KeyCounter:
    """Stands in for ``nnx.Rngs`` to count the keys a module's constructor draws."""

    def __init__(self):
        self.draws = 0

    def params(self):
        self.draws += 1
        return jax.random.key(0)


def stacked_blocks(config: ModelConfig, rngs: nnx.Rngs, **kw) -> Block:
    """``config.num_layers`` blocks as one `Block` whose every variable has a leading
    layer axis (logical name ``"layers"``), built by ``nnx.vmap`` in one traced program.

    Layer ``i`` draws the same keys from ``rngs``' ``params`` stream as the ``i``-th of
    ``num_layers`` blocks built one after the other would (stream counts ``c0 + i * n``
    onwards, ``n`` the keys one block draws, counted by tracing one block's
    constructor), so the stacked weights equal the sequential ones bit for bit; the
    stream ends where the sequential construction would leave it. ``kw``: `Block`'s
    keyword arguments (dtype, param_dtype, attention).
    """
    counter = _KeyCounter()
    jax.eval_shape(lambda: (Block(config, rngs=counter, **kw), 0)[1])
    per_block = counter.draws
    stream = rngs.params
    key, start = stream.key[...], stream.count[...]
    counts = start + jnp.arange(config.num_layers, dtype=start.dtype) * per_block

    @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def build(count):
        layer_rngs = nnx.Rngs(params=key)
        layer_rngs.params.count[...] = count
        return Block(config, rngs=layer_rngs, **kw)

    blocks = build(counts)
    stream.count[...] = start + config.num_layers * per_block
    return blocks
