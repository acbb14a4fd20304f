"""Weight-only quantisation of the embedded sampler (`samplers.jax_quant`): which leaves,
how much error, per-channel scales, and refusals of the main job's config."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from entr_jax.assets import tiny_dir
from entr_jax.model import Decoder, ModelConfig
from experiments.run.config import ModelSpec, SamplerSpec
from samplers.jax_quant import quantize_weights


@pytest.fixture(scope="module")
def state():
    cfg = ModelConfig.from_hf_config(json.loads((tiny_dir() / "config.json").read_text()))
    return nnx.state(Decoder(cfg, rngs=nnx.Rngs(0)))


def _leaves(tree):
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize("scheme, levels", [("int8", 127.5), ("int4", 7.5)])
def test_integer_schemes_round_each_kernel_column_to_its_own_grid(state, scheme, levels):
    before, after = _leaves(state), _leaves(quantize_weights(state, scheme))
    changed = [k for k in before if not np.array_equal(before[k], after[k])]
    # q, k, v, o, gate, up, down, each stacked over the 4 layers ([4, in, out]);
    # embeddings, norms and biases untouched
    assert len(changed) == 7 and all("kernel" in k for k in changed)
    for k in changed:
        w, q = before[k], after[k]
        assert w.shape[0] == 4
        # one scale per layer and output column; qwix maps absmax to the half-step past the
        # largest level, so the signed range [-2^(b-1), 2^(b-1) - 1] is used in full:
        # every value is an integer multiple of its column's scale in that range, the
        # nearest one
        scale = np.abs(w).max(axis=-2, keepdims=True) / levels
        steps = q / scale
        assert np.all(np.abs(steps - np.round(steps)) < 2e-3)
        assert steps.min() >= -levels - 0.5 - 1e-3 and steps.max() <= levels - 0.5 + 1e-3
        assert np.all(np.abs(q - w) <= scale / 2 + 1e-7)


def test_fp8_values_are_e4m3_numbers_times_a_column_scale(state):
    before, after = _leaves(state), _leaves(quantize_weights(state, "fp8"))
    k = next(k for k in before if "down_proj" in k)
    w, q = before[k], after[k]
    scale = np.abs(w).max(axis=-2, keepdims=True) / 448.0  # e4m3's largest finite value
    scaled = q / scale
    np.testing.assert_allclose(scaled, np.asarray(jnp.asarray(scaled).astype(jnp.float8_e4m3fn)
                                                  .astype(jnp.float32)), rtol=1e-5)
    rel = np.abs(q - w) / np.maximum(np.abs(w), 1e-12)
    assert 0.005 < np.median(rel) < 0.07  # 3 mantissa bits


def test_stacked_kernels_get_a_scale_per_layer_and_column():
    w = jax.random.normal(jax.random.key(0), (3, 16, 8)) * jnp.arange(1, 4)[:, None, None]
    tree = {"blocks": {"kernel": w}}
    q = quantize_weights(tree, "int8")["blocks"]["kernel"]
    for layer in range(3):
        alone = quantize_weights({"kernel": w[layer]}, "int8")["kernel"]
        np.testing.assert_array_equal(np.asarray(q[layer]), np.asarray(alone))


def test_none_is_the_identity_and_unknown_schemes_are_refused(state):
    assert quantize_weights(state, "none") is state
    with pytest.raises(ValueError, match="one of"):
        quantize_weights(state, "int3")


def test_config_refuses_engine_options_the_selected_sampler_does_not_have():
    with pytest.raises(ValueError, match="sampler.weight_quant"):
        SamplerSpec(kind="sglang", server_urls=("http://x:1",), weight_quant="int8")
    with pytest.raises(ValueError, match="sampler.recompute_kv_on_swap"):
        SamplerSpec(kind="sglang", server_urls=("http://x:1",), recompute_kv_on_swap=False)
    with pytest.raises(ValueError, match="sampler.weight_quant"):
        SamplerSpec(weight_quant="int3")
    with pytest.raises(ValueError, match="model.sha256 must be 64 lower-case hex"):
        ModelSpec(path="x", sha256="ABC")
    with pytest.raises(ValueError, match="model.sha256 must be empty without model.path"):
        ModelSpec(sha256="0" * 64)
