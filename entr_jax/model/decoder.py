"""`Decoder`: the Llama / Qwen2 / Qwen3 causal LM in flax NNX, with a KV cache for sampling.

Shapes: B batch rows, L (or S) tokens, D hidden, V vocab, M cache slots, K kv heads.
Batches are right-padded: row b holds real tokens at ``[0, len_b)``; positions of real
tokens are therefore ``0..len_b-1`` (computed as ``max(cumsum(attention_mask) - 1, 0)``,
which also gives the right positions for left-padded rows).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct

from entr_jax.model.config import ModelConfig
from entr_jax.model.layers import _INIT, Block, RMSNorm, _part, rope_cos_sin, rope_inv_freq
from entr_jax.model.matmul import matmul


@struct.dataclass
class KVCache:
    """Per-layer key/value cache.

    Attributes:
      k: tuple (one per layer) of ``[B, num_kv_heads, head_dim, M]`` arrays: keys with the
        slot axis last, so a decode step's scores ``q . k`` reduce over ``head_dim`` with
        the ``M`` slots contiguous (on XLA:CPU 2.7x faster than over ``[..., M, head_dim]``
        at one query per row; `entr_jax.model.attention.attend_cache`).
      v: tuple of ``[B, num_kv_heads, M, head_dim]`` arrays (the layout the value mix
        reads as is).
      Slot ``j`` of row ``b`` holds the (RoPE'd) key / value of the token at position
      ``j``; both are heads-first, so no step copies or transposes the cache.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]

    @property
    def max_len(self) -> int:
        return self.v[0].shape[2]


def init_cache(config: ModelConfig, batch_size: int, max_len: int, dtype=jnp.float32) -> KVCache:
    """Zero cache of ``config.num_layers`` layers in ``dtype``: keys ``[batch_size, K,
    head_dim, max_len]``, values ``[batch_size, K, max_len, head_dim]`` (`KVCache`)."""
    for name, value in (("batch_size", batch_size), ("max_len", max_len)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    b, kv, hd, n = batch_size, config.num_kv_heads, config.head_dim, config.num_layers
    return KVCache(k=tuple(jnp.zeros((b, kv, hd, max_len), dtype) for _ in range(n)),
                   v=tuple(jnp.zeros((b, kv, max_len, hd), dtype) for _ in range(n)))


def _check_ids(input_ids, name="input_ids"):
    if input_ids.ndim != 2 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer [B, L] array, got {input_ids.dtype}{input_ids.shape}")


class Decoder(nnx.Module):
    """Causal decoder LM (Llama / Qwen2 / Qwen3 families).

    Args:
      config: `ModelConfig`.
      rngs: parameter initialisation keys (normal(0.02) kernels, zero biases, unit norms).
      dtype: compute dtype of activations and matmuls (f32 or bf16).
      param_dtype: storage dtype of the parameters (f32 or bf16).

    Parameters (attribute paths, which `hf_io` maps to HF names): ``embed_tokens.embedding
    [V,D]``, ``layers[i].{input_norm,post_attn_norm}.scale``, ``layers[i].attn.{q,k,v,o}_proj
    .{kernel,bias}`` (kernels ``[in,out]``), ``layers[i].attn.{q,k}_norm.scale`` (qwen3),
    ``layers[i].mlp.{gate,up,down}_proj.kernel``, ``final_norm.scale``, ``lm_head`` ``[V,D]``
    (untied only). Each carries logical axis names (see `partitioning.LOGICAL_AXIS_RULES`).
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32,
                 param_dtype=jnp.float32):
        for name, dt in (("dtype", dtype), ("param_dtype", param_dtype)):
            if jnp.dtype(dt) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
                raise ValueError(f"{name} must be float32 or bfloat16, got {dt!r}")
        self.config = config
        self.dtype = dtype
        c = config
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.embed_tokens = nnx.Embed(
            c.vocab_size, c.hidden_size, rngs=rngs, **kw,
            embedding_init=_part(_INIT, ("vocab", "embed")),
        )
        self.layers = nnx.List([Block(c, rngs=rngs, **kw) for _ in range(c.num_layers)])
        self.final_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, "norm", **kw)
        if c.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nnx.Param(
                _INIT(rngs.params(), (c.vocab_size, c.hidden_size), param_dtype),
                out_sharding=("vocab", "embed"), eager_sharding=False,
            )

    def _embed(self, input_ids):
        return jnp.take(self.embed_tokens.embedding[...], input_ids, axis=0).astype(self.dtype)

    def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array | None = None):
        """Final-norm hidden states.

        Args:
          input_ids: ``[B, L]`` int32 token ids.
          attention_mask: ``[B, L]`` bool (True = real token) or None (all real). Keys that are
            padding are never attended; causal masking applies throughout.
        Returns:
          ``[B, L, D]`` in the compute dtype; values at padding positions are meaningless.
        Raises:
          ValueError: wrong rank/dtype of ``input_ids`` or a mismatched ``attention_mask``.
        """
        _check_ids(input_ids)
        b, length = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones((b, length), jnp.bool_)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask shape {attention_mask.shape} != input_ids shape {input_ids.shape}"
            )
        valid = attention_mask.astype(jnp.bool_)
        positions = jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1, 0)
        # Positions lie in [0, length): the rotary cos/sin come from a table of that size.
        rope = rope_cos_sin(positions, rope_inv_freq(self.config), num_positions=length)
        x = self._embed(input_ids)
        for layer in self.layers:
            x = layer(x, rope, valid)
        return self.final_norm(x)

    def lm_logits(self, hidden: jax.Array) -> jax.Array:
        """Unembeds ``hidden [..., D]`` to logits ``[..., V]`` float32 (matmul accumulates in f32)."""
        w = self.embed_tokens.embedding[...] if self.lm_head is None else self.lm_head[...]
        return matmul(hidden.astype(self.dtype), w.astype(self.dtype), 1, None, jnp.float32)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None):
        """Logits ``[B, L, V]`` float32 = ``lm_logits(hidden_states(input_ids, attention_mask))``."""
        return self.lm_logits(self.hidden_states(input_ids, attention_mask))

    def decode(self, input_ids: jax.Array, positions: jax.Array, cache: KVCache):
        """Cached forward of S new tokens per row (prefill: S = prompt length; step: S = 1).

        Args:
          input_ids: ``[B, S]`` int32.
          positions: ``[B, S]`` int32, the position of each token; its K/V are written to cache
            slot = position (slots ``>= M`` are dropped), and it attends to every slot
            ``<= position``. Distinct positions per row are the caller's duty.
          cache: `KVCache` (keys ``[B, K, hd, M]``, values ``[B, K, M, hd]``).
        Returns:
          ``(logits [B, S, V] float32, new_cache)``. Pure: the module is not mutated.
        """
        _check_ids(input_ids)
        if positions.shape != input_ids.shape:
            raise ValueError(f"positions shape {positions.shape} != input_ids shape {input_ids.shape}")
        if len(cache.k) != self.config.num_layers or cache.k[0].shape[0] != input_ids.shape[0]:
            raise ValueError(
                f"cache has {len(cache.k)} layers of batch {cache.k[0].shape[0]}; expected "
                f"{self.config.num_layers} layers of batch {input_ids.shape[0]}"
            )
        positions = positions.astype(jnp.int32)
        rope = rope_cos_sin(positions, rope_inv_freq(self.config))  # positions follow the cache
        x = self._embed(input_ids)
        new_k, new_v = [], []
        for layer, ck, cv in zip(self.layers, cache.k, cache.v):
            x, ck, cv = layer.decode(x, positions, rope, ck, cv)
            new_k.append(ck)
            new_v.append(cv)
        logits = self.lm_logits(self.final_norm(x))
        return logits, KVCache(k=tuple(new_k), v=tuple(new_v))
