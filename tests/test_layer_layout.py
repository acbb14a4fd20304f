"""The decoder's two block layouts (stacked and scanned / one block per layer): the same
initial weights, values, gradients and HF tensors; exact conversion between them; a
scanned program whose size does not grow with depth; remat policies; and the optimizer's
weight-decay mask on stacked parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from entr_jax.model import Decoder, ModelConfig, init_cache, to_hf_state_dict
from entr_jax.model.decoder import relayout
from experiments.run.config import ModelSpec
from learners.optim import OptimizerConfig, make_optimizer

CONFIGS = {
    "llama": ModelConfig(architecture="llama", vocab_size=64, hidden_size=32,
                         intermediate_size=48, num_layers=3, num_heads=4, num_kv_heads=2,
                         head_dim=8, attention_bias=True, tie_word_embeddings=False),
    "qwen2": ModelConfig(architecture="qwen2", vocab_size=64, hidden_size=32,
                         intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                         head_dim=8, attention_bias=True, tie_word_embeddings=True),
    "qwen3": ModelConfig(architecture="qwen3", vocab_size=64, hidden_size=32,
                         intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=1,
                         head_dim=8, qk_norm=True, tie_word_embeddings=False),
}
IDS = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 9)), jnp.int32)
MASK = jnp.asarray(np.arange(9)[None] < np.array([9, 6])[:, None])


def _flat(state):
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(state)}


def _assert_same(a, b, atol=0.0):
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for path in fa:
        np.testing.assert_allclose(fa[path], fb[path], atol=atol, rtol=0, err_msg=str(path))


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_stacked_init_is_the_per_layer_init_bit_for_bit(family):
    """Layer i of the stacked init draws the keys the i-th sequentially built block
    draws; the untied lm_head (drawn after the layers) agrees too."""
    cfg = CONFIGS[family]
    stacked = nnx.state(Decoder(cfg, rngs=nnx.Rngs(3)), nnx.Param)
    per_layer = nnx.state(Decoder(cfg, rngs=nnx.Rngs(3), scan_layers=False), nnx.Param)
    assert stacked["layers"]["mlp"]["up_proj"]["kernel"].get_value().shape[0] == cfg.num_layers
    _assert_same(stacked, relayout(per_layer, cfg.num_layers, stacked=True))
    _assert_same(relayout(stacked, cfg.num_layers, stacked=False), per_layer)


def test_relayout_moves_the_layer_axis_name_and_checks_the_count():
    cfg = CONFIGS["qwen3"]
    stacked = nnx.state(Decoder(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    per_layer = relayout(stacked, cfg.num_layers, stacked=False)
    kernel = per_layer["layers"][1]["attn"]["q_proj"]["kernel"]
    assert kernel.get_metadata()["out_sharding"] == ("embed", "heads")
    back = relayout(per_layer, cfg.num_layers, stacked=True)
    assert back["layers"]["attn"]["q_norm"]["scale"].get_metadata()["out_sharding"] == (
        "layers", "head_dim")
    assert relayout(stacked, cfg.num_layers, stacked=True) is not None  # already stacked
    with pytest.raises(ValueError, match="holds 2 layers, expected 3"):
        relayout(stacked, 3, stacked=False)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_layouts_agree_on_logits_decode_and_hf_tensors(family):
    cfg = CONFIGS[family]
    a = Decoder(cfg, rngs=nnx.Rngs(1))
    b = Decoder(cfg, rngs=nnx.Rngs(1), scan_layers=False)
    np.testing.assert_allclose(a(IDS, MASK), b(IDS, MASK), atol=2e-6, rtol=1e-6)
    pos = jnp.broadcast_to(jnp.arange(9, dtype=jnp.int32), (2, 9))
    la, ca = a.decode(IDS, pos, init_cache(cfg, 2, 12))
    lb, cb = b.decode(IDS, pos, init_cache(cfg, 2, 12, stacked=False))
    np.testing.assert_allclose(la, lb, atol=2e-6, rtol=1e-6)
    assert ca.k.shape == (cfg.num_layers, 2, cfg.num_kv_heads, cfg.head_dim, 12)
    np.testing.assert_allclose(ca.v[1], cb.v[1], atol=2e-6)
    with pytest.raises(ValueError, match="stacked=True"):
        a.decode(IDS, pos, cb)
    ha, hb = to_hf_state_dict(a), to_hf_state_dict(b)
    assert ha.keys() == hb.keys() and f"model.layers.{cfg.num_layers - 1}.mlp.up_proj.weight" in ha
    for name in ha:
        np.testing.assert_array_equal(ha[name], hb[name], err_msg=name)


@pytest.mark.parametrize("remat", ["none", "dots", "full"])
def test_gradients_agree_across_layouts_and_remat_policies(remat):
    cfg = CONFIGS["qwen2"]

    def loss(model):
        return jnp.sum(jnp.where(MASK[..., None], model(IDS, MASK), 0.0) ** 2) * 1e-3

    ref = nnx.state(nnx.grad(loss)(Decoder(cfg, rngs=nnx.Rngs(2), remat="none")), nnx.Param)
    for scan in (True, False):
        g = nnx.state(nnx.grad(loss)(Decoder(cfg, rngs=nnx.Rngs(2), remat=remat,
                                             scan_layers=scan)), nnx.Param)
        _assert_same(relayout(g, cfg.num_layers, stacked=True), ref, atol=1e-6)


def test_remat_policies_trade_memory_for_recomputation():
    """Per-device temporary bytes of the compiled gradient: full < dots < none."""
    cfg = ModelConfig(architecture="qwen2", vocab_size=64, hidden_size=64, intermediate_size=256,
                      num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
                      attention_bias=True)
    ids = jnp.zeros((4, 256), jnp.int32)
    temp = {}
    for remat in ("none", "dots", "full"):
        model = Decoder(cfg, rngs=nnx.Rngs(0), remat=remat)
        graphdef, params = nnx.split(model)
        grad = jax.grad(lambda p: jnp.sum(nnx.merge(graphdef, p)(ids) ** 2))
        temp[remat] = jax.jit(grad).lower(params).compile().memory_analysis().temp_size_in_bytes
    assert temp["full"] < temp["dots"] < temp["none"], temp


def _lowered_size(num_layers: int, scan: bool) -> int:
    cfg = ModelConfig(architecture="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48,
                      num_layers=num_layers, num_heads=4, num_kv_heads=2, head_dim=8,
                      attention_bias=True)
    graphdef, params = nnx.split(nnx.eval_shape(
        lambda: Decoder(cfg, rngs=nnx.Rngs(0), scan_layers=scan)))
    grad = jax.grad(lambda p: jnp.sum(nnx.merge(graphdef, p)(IDS, MASK) ** 2))
    return len(jax.jit(grad).lower(params).as_text().splitlines())


def test_the_scanned_gradient_program_does_not_grow_with_depth():
    """One layer in the program whatever the depth (the per-layer layout, as a control,
    grows by a layer's worth per layer)."""
    assert _lowered_size(2, True) == _lowered_size(6, True)
    assert _lowered_size(6, False) > _lowered_size(2, False) + 100


def test_weight_decay_skips_norms_and_biases_of_stacked_layers():
    """AdamW's decay mask reads the parameter's own rank, not the stacked layer axis: one
    update gives the same weights in both layouts (decayed kernels, undecayed vectors)."""
    cfg = CONFIGS["qwen2"]
    tx = make_optimizer(OptimizerConfig(learning_rate=0.1, weight_decay=0.5))
    updated = []
    for scan in (True, False):
        params = jax.tree.map(lambda x: x + 1.0, nnx.state(
            Decoder(cfg, rngs=nnx.Rngs(0), scan_layers=scan), nnx.Param))
        grads = jax.tree.map(jnp.zeros_like, params)  # Adam's own step is 0: decay alone
        step, _ = tx.update(grads, tx.init(params), params)
        updated.append(relayout(optax.apply_updates(params, step), cfg.num_layers, stacked=True))
    _assert_same(updated[0], updated[1])
    flat = _flat(updated[0])
    np.testing.assert_array_equal(flat[("layers", "input_norm", "scale")], 2.0)
    np.testing.assert_array_equal(flat[("layers", "attn", "q_proj", "bias")], 1.0)
    before = _flat(jax.tree.map(lambda x: x + 1.0, nnx.state(Decoder(cfg, rngs=nnx.Rngs(0)),
                                                             nnx.Param)))
    key = ("layers", "mlp", "up_proj", "kernel")
    np.testing.assert_allclose(flat[key], before[key] * (1 - 0.1 * 0.5), rtol=1e-6)


def test_model_knobs_are_checked_before_any_work():
    with pytest.raises(ValueError, match="model.remat"):
        ModelSpec(remat="some")
    with pytest.raises(ValueError, match="model.attention"):
        ModelSpec(attention="flash")
    with pytest.raises(ValueError, match="remat must be one of"):
        Decoder(CONFIGS["qwen2"], rngs=nnx.Rngs(0), remat="some")


def test_the_run_config_chooses_the_learners_layer_layout():
    """``model.scan_layers`` reaches the learner's Decoder built from the run config;
    the quickstart's shallow model runs its layers one after the other, without remat."""
    import dataclasses
    import json

    from entr_jax.assets import tiny_dir
    from experiments.run import build
    from experiments.run.configs import QUICKSTART

    cfg = ModelConfig.from_hf_config(json.loads((tiny_dir() / "config.json").read_text()))
    assert (QUICKSTART.model.scan_layers, QUICKSTART.model.remat) == (False, "none")
    assert ModelSpec().scan_layers is True
    module_fn, weights = build.policy(QUICKSTART, cfg)
    assert weights is None and module_fn().scan_layers is False
    scanned = dataclasses.replace(QUICKSTART, model=ModelSpec(scan_layers=True))
    assert build.policy(scanned, cfg)[0]().scan_layers is True


def test_the_sampler_serves_either_layout_from_either_layout():
    """Weights of a stacked or a per-layer model, served per layer (the default) or
    scanned: the same tokens, logp_mu to f32 rounding."""
    from entr_jax.interfaces import SamplingParams
    from samplers.jax_sampler import JaxSampler, JaxSamplerConfig

    cfg = CONFIGS["qwen2"]
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    params = SamplingParams(max_new_tokens=6, seed=3)
    out = {}
    for scan in (False, True):
        for source in (True, False):
            model = Decoder(cfg, rngs=nnx.Rngs(4), scan_layers=source)
            sampler = JaxSampler(model, config=JaxSamplerConfig(max_batch_size=4,
                                                                scan_layers=scan))
            gens = sampler.generate(prompts, params, num_samples=2)
            out[scan, source] = [(g.response_ids.tolist(), g.logp_mu) for row in gens
                                 for g in row]
    first = out[False, True]
    for key, gens in out.items():
        assert [t for t, _ in gens] == [t for t, _ in first], key
        for (_, a), (_, b) in zip(gens, first):
            np.testing.assert_allclose(a, b, atol=1e-5)
