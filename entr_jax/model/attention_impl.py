"""The full-sequence causal attention of the decoder, by implementation.

One function, `self_attention(q, k, v, valid, dtype, implementation)`, computes the same
quantity as `entr_jax.model.attention.attend` under the causal-and-padding mask
``mask[b, s, t] = (t <= s) & valid[b, t]`` (Vaswani et al. 2017, eq. 1, grouped-query
heads: query head ``h`` reads kv head ``h // (H / K)``), on every query row that can read
at least one key, through one of:

* ``"xla_blocked"``: `entr_jax.model.attention.causal_attend`, query blocks that skip the
  upper triangle, written for XLA:CPU (the CPU default). On CPU it computes in f32 from
  any input dtype (exact upcasts; the probabilities stay f32, the result is cast back):
  XLA:CPU emits a dot with bf16 operands as a fused convert-and-dot loop nest that is
  slow to compile (6.4 s for the forward of one 0.5B-shaped layer at 8 x 1024 against
  0.7 s in f32, `benchmarks/compile.py`), where an f32 dot is a library call;
* ``"xla"``: ``jax.nn.dot_product_attention(implementation="xla")``, JAX's reference
  form of the fused-attention API (scores in f32);
* ``"cudnn"``: ``jax.nn.dot_product_attention(implementation="cudnn")``, cuDNN's fused
  flash attention (GPU, bf16 / fp16 only; the GPU default in bf16);
* ``"splash"``: Pallas splash attention (``jax.experimental.pallas.ops.tpu.
  splash_attention``; the TPU default). On other backends its kernels run in Pallas
  interpret mode, which is how tests check its numbers on CPU;
* ``"auto"``: the default of the backend (`resolve_implementation`).

Padding. ``"xla"`` and ``"cudnn"`` read the padding as per-row lengths
(``key_value_seq_lengths = query_seq_lengths = sum(valid)``), which is the mask only for
right-padded rows (real tokens at ``[0, len_b)``, the learner's batches,
`learners.batching`); ``"xla_blocked"`` and ``"splash"`` take any ``valid`` (splash as
segment ids: real tokens 1, padding 0, so a real query reads real keys only and a
padding query reads padding keys, never an empty row). Values at padding queries are
meaningless in every implementation.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from entr_jax.model.attention import causal_attend

IMPLEMENTATIONS = ("auto", "xla_blocked", "xla", "cudnn", "splash")
# Splash block sizes tried, largest first: a block must divide the sequence length.
_SPLASH_BLOCKS = (512, 256, 128)


def check_implementation(name: str) -> str:
    """``name`` if it is one of `IMPLEMENTATIONS`; ValueError naming the choices otherwise."""
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation must be one of {list(IMPLEMENTATIONS)}, "
                         f"got {name!r} (model.attention)")
    return name


def resolve_implementation(name: str, dtype, length: int, backend: str | None = None) -> str:
    """The implementation ``"auto"`` stands for on ``backend`` (default: JAX's default
    backend) for activations of ``dtype`` and sequences of ``length`` tokens: ``"cudnn"``
    on GPU in bf16 / fp16 (cuDNN's flash attention has no f32 kernel), ``"splash"`` on
    TPU when a splash block (128, 256 or 512) divides ``length``, else ``"xla_blocked"``.
    Any other name is returned as it is."""
    if check_implementation(name) != "auto":
        return name
    backend = backend or jax.default_backend()
    if backend == "gpu" and jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return "cudnn"
    if backend == "tpu" and _splash_block(length) is not None:
        return "splash"
    return "xla_blocked"


def self_attention(q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array, dtype,
                   implementation: str = "auto") -> jax.Array:
    """Causal grouped-query self-attention with key padding.

    Args:
      q: ``[B, L, H, hd]``; k, v: ``[B, L, K, hd]`` with ``H % K == 0``.
      valid: ``[B, L]`` bool, True on real tokens (right-padded rows for ``"xla"`` and
        ``"cudnn"``, module docstring).
      dtype: dtype of the result (and of the probabilities of ``"xla_blocked"``).
      implementation: one of `IMPLEMENTATIONS`.
    Returns:
      ``[B, L, H * hd]`` in ``dtype``.
    Raises:
      ValueError: an unknown implementation, ``"cudnn"`` with f32 inputs, or ``"splash"``
        at a length no splash block divides (each names the fix).
    """
    name = resolve_implementation(implementation, q.dtype, q.shape[1])
    if name == "xla_blocked":
        if jax.default_backend() == "cpu":  # module docstring: f32 dots on XLA:CPU
            f32 = [x.astype(jnp.float32) for x in (q, k, v)]
            return causal_attend(*f32, valid, jnp.float32).astype(dtype)
        return causal_attend(q, k, v, valid, dtype)
    if name in ("xla", "cudnn"):
        return _dot_product(q, k, v, valid, dtype, name)
    return _splash(q, k, v, valid, dtype)


def _dot_product(q, k, v, valid, dtype, implementation):
    """``jax.nn.dot_product_attention`` with causal masking and per-row lengths."""
    if implementation == "cudnn" and q.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(f"attention 'cudnn' needs bfloat16 or float16 activations, got "
                         f"{q.dtype}: set model.dtype=bfloat16 or model.attention=xla_blocked")
    b, length, h, hd = q.shape
    lengths = jnp.sum(valid, axis=1, dtype=jnp.int32)
    out = jax.nn.dot_product_attention(
        q, k.astype(q.dtype), v.astype(q.dtype), is_causal=True, query_seq_lengths=lengths,
        key_value_seq_lengths=lengths, implementation=implementation)
    return out.reshape(b, length, h * hd).astype(dtype)


def _splash_block(length: int) -> int | None:
    return next((blk for blk in _SPLASH_BLOCKS if length % blk == 0), None)


@functools.lru_cache(maxsize=32)
def _splash_kernel(length: int, heads: int, block: int, interpret: bool):
    """A causal splash kernel for ``heads`` query heads over ``length`` tokens (one batch
    row; vmapped over rows), forward and backward blocks of ``block`` positions."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    mask = sa.MultiHeadMask([sa.CausalMask((length, length))] * heads)
    sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                          block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                          block_q_dq=block, block_kv_dq=block)
    return sa.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                              interpret=interpret)


def _splash(q, k, v, valid, dtype):
    """Splash attention: heads-first ``[B, H, L, hd]`` queries pre-scaled by
    ``1 / sqrt(hd)`` (the kernel applies no scale), padding as segment ids, the kernel
    vmapped over the batch rows; in Pallas interpret mode off TPU. Its key blocks are
    multiples of 128 lanes, in interpret mode too."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    b, length, h, hd = q.shape
    block = _splash_block(length)
    if block is None:
        raise ValueError(f"attention 'splash' needs a sequence length divisible by 128, got "
                         f"{length}: set model.attention=auto or xla_blocked")
    kernel = _splash_kernel(length, h, block, jax.default_backend() != "tpu")
    scale = np.asarray(1.0 / math.sqrt(hd), q.dtype)
    qh = (q * scale).transpose(0, 2, 1, 3)
    kh, vh = (x.astype(q.dtype).transpose(0, 2, 1, 3) for x in (k, v))
    seg = valid.astype(jnp.int32)
    out = jax.vmap(lambda qq, kk, vv, s: kernel(qq, kk, vv, segment_ids=sa.SegmentIds(s, s)))(
        qh, kh, vh, seg)
    return out.transpose(0, 2, 1, 3).reshape(b, length, h * hd).astype(dtype)
