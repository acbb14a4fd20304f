"""`Decoder`: the Llama / Qwen2 / Qwen3 causal LM in flax NNX, with a KV cache for sampling.

Two layouts of the blocks (``scan_layers``), the same weights, the same values to float
rounding (MaxText's and levanter's ``scan_layers``):

* stacked (default, the learner's): one `Block` whose parameters carry a leading layer
  axis, applied by ``lax.scan`` (`entr_jax.model.layers.stacked_blocks`), so a compiled
  program holds one layer whatever the depth: compile time and program size do not grow
  with the number of layers. The KV cache is stacked the same way.
* per layer (``scan_layers=False``): a list of blocks applied one after the other, a KV
  cache per layer. A scan step reads its layer's weights and cache through a dynamic
  slice, which XLA:CPU (and XLA:GPU without dynamic-slice fusion) copies before each
  matmul; in a decode step, where the weights and the cache are the bytes that count,
  the per-layer layout reads each buffer once (`JaxSamplerConfig.scan_layers`).

`relayout` converts a state between the two (exact copies).

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
from entr_jax.model.attention_impl import check_implementation
from entr_jax.model.layers import (INIT, REMAT_POLICIES, Block, RMSNorm, partitioned,
                                   rope_cos_sin, rope_inv_freq, stacked_blocks)
from entr_jax.model.matmul import matmul


@struct.dataclass
class KVCache:
    """Key/value cache of every layer, stacked on a leading layer axis or one per layer.

    Attributes:
      k: ``[N, B, num_kv_heads, head_dim, M]`` (N layers; a tuple of N ``[B, num_kv_heads,
        head_dim, M]`` arrays in the per-layer layout): keys with the slot axis last, so
        a decode step's scores ``q . k`` reduce over ``head_dim`` with the ``M`` slots
        contiguous (on XLA:CPU 2.7x faster than over ``[..., M, head_dim]`` at one query
        per row; `entr_jax.model.attention.attend_cache`).
      v: ``[N, B, num_kv_heads, M, head_dim]`` (or a tuple of ``[B, num_kv_heads, M,
        head_dim]``; the layout the value mix reads as is).
      Slot ``j`` of row ``b`` holds the (RoPE'd) key / value of the token at position
      ``j``; both are heads-first, so no step copies or transposes the cache. The stacked
      cache is carried whole through the decode scan, each layer writing its new slots
      in place (`entr_jax.model.layers.Attention.decode`).
    """

    k: jax.Array | tuple[jax.Array, ...]
    v: jax.Array | tuple[jax.Array, ...]

    @property
    def stacked(self) -> bool:
        return not isinstance(self.k, (tuple, list))

    @property
    def max_len(self) -> int:
        return jax.tree.leaves(self.v)[0].shape[-2]

    @property
    def batch_size(self) -> int:
        return jax.tree.leaves(self.k)[0].shape[-4]


def init_cache(config: ModelConfig, batch_size: int, max_len: int, dtype=jnp.float32, *,
               stacked: bool = True) -> KVCache:
    """Zero cache of ``config.num_layers`` layers in ``dtype``: keys ``[N, batch_size, K,
    head_dim, max_len]``, values ``[N, batch_size, K, max_len, head_dim]`` (`KVCache`);
    with ``stacked=False`` tuples of the N layers' arrays (for ``scan_layers=False``)."""
    for name, value in (("batch_size", batch_size), ("max_len", max_len)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    b, kv, hd, n = batch_size, config.num_kv_heads, config.head_dim, config.num_layers
    if stacked:
        return KVCache(k=jnp.zeros((n, b, kv, hd, max_len), dtype),
                       v=jnp.zeros((n, b, kv, max_len, hd), dtype))
    return KVCache(k=tuple(jnp.zeros((b, kv, hd, max_len), dtype) for _ in range(n)),
                   v=tuple(jnp.zeros((b, kv, max_len, hd), dtype) for _ in range(n)))


def relayout(state: nnx.State, num_layers: int, *, stacked: bool) -> nnx.State:
    """A `Decoder` state (parameters, or any state of it) in the other block layout:
    ``stacked=True`` stacks ``layers[i].…`` into ``layers.…`` ``[N, ...]``; False slices
    ``layers.… [N, ...]`` into ``layers[i].…``. A state already in the asked layout is
    returned as it is. Exact copies; ``out_sharding`` metadata gains or loses the
    ``"layers"`` axis. Raises ValueError when the layers do not number ``num_layers``."""
    flat = dict(nnx.to_flat_state(state))
    out = {}
    for path, var in flat.items():
        if not path or path[0] != "layers":
            out[path] = var
        elif isinstance(path[1], int) and stacked:
            key = ("layers",) + path[2:]
            if key not in out:
                parts = [flat[("layers", i) + path[2:]] for i in range(num_layers)]
                out[key] = _with_axis(parts[0], jnp.stack([_value(p) for p in parts]),
                                      add=True)
        elif not isinstance(path[1], int) and not stacked:
            value = _value(var)
            if value.shape[0] != num_layers:
                raise ValueError(f"relayout: {'.'.join(map(str, path))} holds "
                                 f"{value.shape[0]} layers, expected {num_layers}")
            for i in range(num_layers):
                out[("layers", i) + path[1:]] = _with_axis(var, value[i], add=False)
        else:
            out[path] = var
    return nnx.from_flat_state(out)


def _value(leaf):
    return leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf


def _with_axis(var, value, *, add: bool):
    """``var`` holding ``value``, its logical axes with (``add``) or without a leading
    ``"layers"`` (a plain array: ``value``)."""
    if not isinstance(var, nnx.Variable):
        return value
    axes = var.get_metadata().get("out_sharding")
    if axes:
        axes = ("layers",) + tuple(axes) if add else tuple(axes)[1:]
        return var.replace(value, out_sharding=axes)
    return var.replace(value)


def _check_ids(input_ids, name="input_ids"):
    if input_ids.ndim != 2 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer [B, L] array, got {input_ids.dtype}{input_ids.shape}")


class Decoder(nnx.Module):
    """Causal decoder LM (Llama / Qwen2 / Qwen3 families).

    Args:
      config: `ModelConfig`.
      rngs: parameter initialisation keys (normal(0.02) kernels, zero biases, unit norms);
        layer ``i`` draws the same keys in both layouts (`stacked_blocks`), so both hold
        the same weights.
      dtype: compute dtype of activations and matmuls (f32 or bf16).
      param_dtype: storage dtype of the parameters (f32 or bf16).
      remat: rematerialisation of each layer in the backward pass (`REMAT_POLICIES`):
        ``"none"`` keeps every layer's residuals, ``"full"`` recomputes the layer's forward
        from its input, ``"dots"`` (default) keeps the weight matmuls' outputs and
        recomputes the rest. Values and gradients are the same to float rounding; memory,
        step and compile time differ (`benchmarks/remat.py`).
      attention: implementation of the full-sequence attention (`entr_jax.model.
        attention_impl.IMPLEMENTATIONS`; ``"auto"`` picks by backend at trace time).
        ``"xla"`` and ``"cudnn"`` (auto's choice on GPU in bf16) read the padding as
        per-row lengths: right-padded rows only, as the learner's batches are.
      scan_layers: the stacked layout, applied by a scan (module docstring); False: a list
        of blocks, applied one after the other (``remat`` then wraps each block).

    Parameters (attribute paths, which `hf_io` maps to HF names): ``embed_tokens.embedding
    [V,D]``, ``layers.{input_norm,post_attn_norm}.scale [N,D]``, ``layers.attn.{q,k,v,o}_proj
    .{kernel,bias}`` (kernels ``[N,in,out]``), ``layers.attn.{q,k}_norm.scale [N,hd]``
    (qwen3), ``layers.mlp.{gate,up,down}_proj.kernel``, ``final_norm.scale``, ``lm_head``
    ``[V,D]`` (untied only); every ``layers`` parameter has the leading layer axis ``N``
    (per-layer layout: ``layers[i].…`` without it). Each carries logical axis names (see
    `partitioning.LOGICAL_AXIS_RULES`; the layer axis is ``"layers"``, never sharded).
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32,
                 param_dtype=jnp.float32, remat: str = "dots", attention: str = "auto",
                 scan_layers: bool = True):
        for name, dt in (("dtype", dtype), ("param_dtype", param_dtype)):
            if jnp.dtype(dt) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
                raise ValueError(f"{name} must be float32 or bfloat16, got {dt!r}")
        if remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be one of {sorted(REMAT_POLICIES)}, got {remat!r}")
        check_implementation(attention)
        self.config = config
        self.dtype = dtype
        self.remat = remat
        self.scan_layers = bool(scan_layers)
        c = config
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.embed_tokens = nnx.Embed(
            c.vocab_size, c.hidden_size, rngs=rngs, **kw,
            embedding_init=partitioned(INIT, ("vocab", "embed")),
        )
        if self.scan_layers:
            self.layers = stacked_blocks(c, rngs, attention=attention, **kw)
        else:
            self.layers = nnx.List([Block(c, rngs=rngs, attention=attention, **kw)
                                    for _ in range(c.num_layers)])
        self.final_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, "norm", **kw)
        if c.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nnx.Param(
                INIT(rngs.params(), (c.vocab_size, c.hidden_size), param_dtype),
                out_sharding=("vocab", "embed"), eager_sharding=False,
            )

    def _embed(self, input_ids):
        return jnp.take(self.embed_tokens.embedding[...], input_ids, axis=0).astype(self.dtype)

    def _apply_layers(self, body, carry, *, remat: bool):
        """``carry = body(block, carry, layer)`` for every layer in order (``layer``: its
        int32 index): a ``lax.scan`` over the stacked layers, or a loop over the list;
        each layer's call wrapped in ``jax.checkpoint`` with this model's policy when
        ``remat``."""
        def step(graphdef):
            def one(carry, xs):
                return body(nnx.merge(graphdef, xs[0]), carry, xs[1]), None

            if remat and self.remat != "none":
                one = jax.checkpoint(one, policy=REMAT_POLICIES[self.remat],
                                     prevent_cse=not self.scan_layers)
            return one

        if self.scan_layers:
            graphdef, state = nnx.split(self.layers)
            layers = jnp.arange(self.config.num_layers, dtype=jnp.int32)
            return jax.lax.scan(step(graphdef), carry, (state, layers))[0]
        for i, block in enumerate(self.layers):
            graphdef, state = nnx.split(block)
            carry = step(graphdef)(carry, (state, jnp.int32(i)))[0]
        return carry

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
        x = self._apply_layers(lambda block, x, _: block(x, rope, valid),
                               self._embed(input_ids), remat=True)
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
          cache: `KVCache` (keys ``[N, B, K, hd, M]``, values ``[N, B, K, M, hd]``; per
            layer in the per-layer layout, `init_cache` with ``stacked=False``).
        Returns:
          ``(logits [B, S, V] float32, new_cache)``. Pure: the module is not mutated.
        """
        _check_ids(input_ids)
        if positions.shape != input_ids.shape:
            raise ValueError(f"positions shape {positions.shape} != input_ids shape {input_ids.shape}")
        n = self.config.num_layers
        layers = cache.k.shape[0] if cache.stacked else len(cache.k)
        if (cache.stacked != self.scan_layers or layers != n
                or cache.batch_size != input_ids.shape[0]):
            raise ValueError(
                f"cache holds {layers} layers of batch {cache.batch_size} "
                f"({'stacked' if cache.stacked else 'per layer'}); expected {n} layers of batch "
                f"{input_ids.shape[0]} ({'stacked' if self.scan_layers else 'per layer'}: "
                f"init_cache(..., stacked={self.scan_layers}))")
        positions = positions.astype(jnp.int32)
        rope = rope_cos_sin(positions, rope_inv_freq(self.config))  # positions follow the cache

        if self.scan_layers:  # the whole stacked cache is carried, each layer writes its slots
            def body(block, carry, layer):
                x, ck, cv = carry
                return block.decode(x, positions, rope, ck, cv, layer)

            x, k, v = self._apply_layers(body, (self._embed(input_ids), cache.k, cache.v),
                                         remat=False)
        else:
            x, k, v = self._embed(input_ids), [], []
            for block, ck, cv in zip(self.layers, cache.k, cache.v):
                x, ck, cv = block.decode(x, positions, rope, ck, cv, None)
                k.append(ck)
                v.append(cv)
            k, v = tuple(k), tuple(v)
        logits = self.lm_logits(self.final_norm(x))
        return logits, KVCache(k=k, v=v)
