"""Attention implementations (entr_jax.model.attention_impl) against the masked reference
`attend`: the blocked XLA form, jax.nn.dot_product_attention's XLA path (the API cuDNN
shares), and Pallas splash attention in interpret mode; values, gradients, padding,
grouped-query heads, and the choice by backend."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from entr_jax.model import Decoder, ModelConfig
from entr_jax.model.attention import attend
from entr_jax.model.attention_impl import resolve_implementation, self_attention

B, L, H, K, HD = 2, 128, 4, 2, 16  # splash's key blocks are multiples of 128
RIGHT = np.arange(L)[None] < np.array([L, 70])[:, None]  # right-padded rows
LEFT = np.arange(L)[None] >= np.array([0, 50])[:, None]  # row 1 left-padded


def _qkv(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.normal(size=shape), dtype)
                 for shape in ((B, L, H, HD), (B, L, K, HD), (B, L, K, HD)))


def _reference(q, k, v, valid):
    """`attend` in f32 under the causal-and-padding mask."""
    causal = np.arange(L)[:, None] >= np.arange(L)[None, :]
    mask = jnp.asarray(causal[None] & np.asarray(valid)[:, None, :])
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    return attend(*f32, mask, jnp.float32)


def _loss(fn, valid):
    """Sum of squares of the output on real query rows (padding rows are meaningless)."""
    return lambda q, k, v: jnp.sum(jnp.where(jnp.asarray(valid)[..., None], fn(q, k, v), 0.0) ** 2)


@pytest.mark.parametrize("impl", ["xla_blocked", "xla", "splash"])
def test_values_and_gradients_match_the_reference_in_f32(impl):
    q, k, v = _qkv(jnp.float32)
    want = np.asarray(_reference(q, k, v, RIGHT))
    got = np.asarray(self_attention(q, k, v, jnp.asarray(RIGHT), jnp.float32, impl))
    assert got.shape == (B, L, H * HD)
    np.testing.assert_allclose(got[RIGHT], want[RIGHT], atol=2e-6, rtol=1e-5)
    grads = jax.grad(_loss(lambda *a: self_attention(*a, jnp.asarray(RIGHT), jnp.float32, impl),
                           RIGHT), argnums=(0, 1, 2))(q, k, v)
    ref = jax.grad(_loss(lambda *a: _reference(*a, RIGHT), RIGHT), argnums=(0, 1, 2))(q, k, v)
    for g, r in zip(grads, ref):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("impl", ["xla_blocked", "xla", "splash"])
def test_bf16_inputs_match_the_f32_reference_to_bf16_rounding(impl):
    q, k, v = _qkv(jnp.bfloat16, seed=1)
    got = self_attention(q, k, v, jnp.asarray(RIGHT), jnp.bfloat16, impl)
    assert got.dtype == jnp.bfloat16
    want = np.asarray(_reference(q, k, v, RIGHT))
    err = np.abs(np.asarray(got, np.float32) - want)[RIGHT]
    assert err.max() < 2e-2 * np.abs(want).max()


@pytest.mark.parametrize("impl", ["xla_blocked", "splash"])
def test_any_padding_pattern_for_the_mask_based_forms(impl):
    """Left padding: real queries read only real keys at or before them."""
    q, k, v = _qkv(jnp.float32, seed=2)
    want = np.asarray(_reference(q, k, v, LEFT))
    got = np.asarray(self_attention(q, k, v, jnp.asarray(LEFT), jnp.float32, impl))
    np.testing.assert_allclose(got[LEFT], want[LEFT], atol=2e-6, rtol=1e-5)


def test_choice_by_backend_dtype_and_length():
    assert resolve_implementation("auto", jnp.bfloat16, 1024, "gpu") == "cudnn"
    assert resolve_implementation("auto", jnp.float32, 1024, "gpu") == "xla_blocked"
    assert resolve_implementation("auto", jnp.bfloat16, 1024, "tpu") == "splash"
    assert resolve_implementation("auto", jnp.bfloat16, 100, "tpu") == "xla_blocked"
    assert resolve_implementation("auto", jnp.bfloat16, 1024, "cpu") == "xla_blocked"
    assert resolve_implementation("splash", jnp.float32, 1024, "cpu") == "splash"
    with pytest.raises(ValueError, match="model.attention"):
        resolve_implementation("flash", jnp.float32, 1024, "cpu")


def test_unusable_choices_are_refused_with_the_fix():
    q, k, v = _qkv(jnp.float32)
    with pytest.raises(ValueError, match="model.dtype=bfloat16 or model.attention"):
        self_attention(q, k, v, jnp.asarray(RIGHT), jnp.float32, "cudnn")
    short = [x[:, :100] for x in (q, k, v)]
    with pytest.raises(ValueError, match="divisible by 128"):
        self_attention(*short, jnp.asarray(RIGHT[:, :100]), jnp.float32, "splash")
    cfg = ModelConfig(architecture="llama", vocab_size=32, hidden_size=16, intermediate_size=32,
                      num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
    with pytest.raises(ValueError, match="attention implementation must be one of"):
        Decoder(cfg, rngs=nnx.Rngs(0), attention="flash")


def test_decoder_logits_agree_across_implementations():
    """The config knob reaches every layer: the model's logits are the same to f32
    rounding with each implementation."""
    cfg = ModelConfig(architecture="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48,
                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                      attention_bias=True)
    ids = jnp.asarray(np.random.default_rng(3).integers(0, 64, (B, L)), jnp.int32)
    mask = jnp.asarray(RIGHT)
    logits = {}
    for impl in ("xla_blocked", "xla", "splash"):
        model = Decoder(cfg, rngs=nnx.Rngs(0), attention=impl)
        assert model.layers.attn.implementation == impl
        logits[impl] = np.asarray(model(ids, mask))[RIGHT]
    for impl in ("xla", "splash"):
        np.testing.assert_allclose(logits[impl], logits["xla_blocked"], atol=2e-5, rtol=1e-5)
