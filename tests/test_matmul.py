"""`entr_jax.model.matmul`: the forward is ``lax.dot_general`` bit for bit, the gradients are
JAX's own (to float rounding), and the decoder's gradient is unchanged by it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from entr_jax.model import Decoder, ModelConfig
from entr_jax.model import decoder as decoder_mod
from entr_jax.model import layers as layers_mod
from entr_jax.model.matmul import dense_dot_general, matmul


def _plain(x, w, w_contract, precision=None, pet=None):
    return lax.dot_general(x, w, (((x.ndim - 1,), (w_contract,)), ((), ())),
                           precision=precision, preferred_element_type=pet)


def _case(w_contract, lead, k=24, n=40, dtype=jnp.float32):
    kx, kw, kg = jax.random.split(jax.random.key(w_contract * 7 + len(lead)), 3)
    x = jax.random.normal(kx, lead + (k,), jnp.float32).astype(dtype)
    w = jax.random.normal(kw, (k, n) if w_contract == 0 else (n, k), jnp.float32).astype(dtype)
    g = jax.random.normal(kg, lead + (n,), jnp.float32)
    return x, w, g


@pytest.mark.parametrize("w_contract", [0, 1])
@pytest.mark.parametrize("lead", [(5,), (3, 7), (2, 3, 4)])
def test_forward_is_dot_general_and_gradients_match_jax(w_contract, lead):
    x, w, g = _case(w_contract, lead)
    y = matmul(x, w, w_contract)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(_plain(x, w, w_contract)))
    # the cotangent-weighted sum's gradient, ours against jax.grad of the plain dot_general
    ours = jax.grad(lambda a, b: jnp.sum(matmul(a, b, w_contract) * g), argnums=(0, 1))(x, w)
    ref = jax.grad(lambda a, b: jnp.sum(_plain(a, b, w_contract) * g), argnums=(0, 1))(x, w)
    for o, r in zip(ours, ref):
        assert o.shape == r.shape and o.dtype == r.dtype
        np.testing.assert_allclose(np.asarray(o), np.asarray(r), rtol=1e-5, atol=1e-5)
    # and against the chain rule written out: dx = g w^T, dw = x^T g (flattened)
    wk = w if w_contract == 0 else w.T  # [K, N]
    x2, g2 = np.asarray(x).reshape(-1, x.shape[-1]), np.asarray(g).reshape(-1, g.shape[-1])
    np.testing.assert_allclose(np.asarray(ours[0]), np.asarray(g) @ np.asarray(wk).T,
                               rtol=1e-5, atol=1e-5)
    dw = x2.T @ g2
    np.testing.assert_allclose(np.asarray(ours[1]), dw if w_contract == 0 else dw.T,
                               rtol=1e-5, atol=1e-5)


def test_bfloat16_with_float32_accumulation_keeps_dtypes():
    x, w, g = _case(1, (3, 5), dtype=jnp.bfloat16)
    y = matmul(x, w, 1, None, jnp.float32)
    assert y.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(y), np.asarray(_plain(x, w, 1, None, jnp.float32)))
    ours = jax.grad(lambda a, b: jnp.sum(matmul(a, b, 1, None, jnp.float32) * g), (0, 1))(x, w)
    ref = jax.grad(lambda a, b: jnp.sum(_plain(a, b, 1, None, jnp.float32) * g), (0, 1))(x, w)
    for o, r in zip(ours, ref):
        assert o.dtype == jnp.bfloat16 == r.dtype
        np.testing.assert_allclose(np.asarray(o, np.float32), np.asarray(r, np.float32),
                                   rtol=2e-2, atol=2e-2)


def test_dense_dot_general_routes_only_the_linear_product():
    x, w, _ = _case(0, (3, 5))
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    np.testing.assert_array_equal(np.asarray(dense_dot_general(x, w, dims)),
                                  np.asarray(lax.dot_general(x, w, dims)))
    # a batched product is not the Linear layer's: plain dot_general, same value
    a = jax.random.normal(jax.random.key(3), (2, 4, 6))
    b = jax.random.normal(jax.random.key(4), (2, 6, 5))
    bdims = (((2,), (1,)), ((0,), (0,)))
    np.testing.assert_array_equal(np.asarray(dense_dot_general(a, b, bdims)),
                                  np.asarray(lax.dot_general(a, b, bdims)))


def test_bad_shapes_name_the_problem():
    with pytest.raises(ValueError, match="2-D"):
        matmul(jnp.ones((3, 4)), jnp.ones((4, 2, 1)), 0)
    with pytest.raises(ValueError, match="last axis"):
        matmul(jnp.ones((3, 5)), jnp.ones((4, 2)), 0)


def test_decoder_gradient_equals_the_plain_dot_generals(monkeypatch):
    """The whole model's loss gradient with `matmul` equals the one with nnx.Linear's default
    dot_general and an einsum unembedding (the layers before this module)."""
    cfg = ModelConfig(architecture="qwen2", vocab_size=64, hidden_size=32, intermediate_size=80,
                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                      attention_bias=True, tie_word_embeddings=True)
    tokens = jax.random.randint(jax.random.key(5), (3, 9), 0, cfg.vocab_size)

    def loss(model):
        logp = jax.nn.log_softmax(model(tokens)[:, :-1])
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    new = Decoder(cfg, rngs=nnx.Rngs(0))
    assert new.layers.mlp.up_proj.dot_general is dense_dot_general
    g_new = nnx.state(nnx.grad(loss)(new), nnx.Param)

    def plain_linear(din, dout, axes, bias, rngs, dtype, param_dtype):
        return nnx.Linear(din, dout, use_bias=bias, dtype=dtype, param_dtype=param_dtype,
                          rngs=rngs, kernel_init=layers_mod.partitioned(layers_mod.INIT, axes),
                          bias_init=layers_mod.partitioned(nnx.initializers.zeros_init(), axes[1:]))

    def plain_logits(self, hidden):
        w = self.embed_tokens.embedding[...]
        return jnp.einsum("...d,vd->...v", hidden, w, preferred_element_type=jnp.float32)

    monkeypatch.setattr(layers_mod, "_linear", plain_linear)
    monkeypatch.setattr(decoder_mod.Decoder, "lm_logits", plain_logits)
    old = Decoder(cfg, rngs=nnx.Rngs(0))
    assert old.layers.mlp.up_proj.dot_general is lax.dot_general
    np.testing.assert_array_equal(np.asarray(loss(new)), np.asarray(loss(old)))
    g_old = nnx.state(nnx.grad(loss)(old), nnx.Param)
    flat_new, flat_old = jax.tree.leaves(g_new), jax.tree.leaves(g_old)
    assert len(flat_new) == len(flat_old) > 12  # stacked layers: one leaf per block parameter
    for a, b in zip(flat_new, flat_old):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
