"""Parity with Hugging Face transformers (CPU, f32) and safetensors import/export."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from entr_jax.model import (
    Decoder, from_pretrained, load_hf_state_dict, save_pretrained, to_hf_state_dict,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LOGITS_TOL = 1e-4  # model-level logits, f32
LENGTHS = (9, 4, 6)
COMMON = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2)
VARIANTS = {
    # llama3 scaling with original length 512: head_dim 8, theta 5e5 gives one wavelength
    # (~167) in the interpolated band (128, 512), one above and two below.
    "llama_untied_bias_llama3": ("LlamaForCausalLM", transformers.LlamaConfig, dict(
        attention_bias=True, tie_word_embeddings=False, rms_norm_eps=1e-5,
        max_position_embeddings=1024, bos_token_id=1, eos_token_id=[2, 3],
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 512})),
    "qwen2_tied": ("Qwen2ForCausalLM", transformers.Qwen2Config, dict(
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        eos_token_id=5)),
    "qwen3_untied_qknorm": ("Qwen3ForCausalLM", transformers.Qwen3Config, dict(
        tie_word_embeddings=False, head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
}


def _perturb(model, seed):
    """Replaces HF's init (std 0.02, zero bias, unit norms) by O(1) noise: every term counts."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_((1.0 if "norm" in name else 0.0) + 0.3 * noise)
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    out = {}
    for seed, (key, (arch, cfg_cls, extra)) in enumerate(VARIANTS.items()):
        cfg = cfg_cls(**COMMON, **extra)
        model = getattr(transformers, arch)(cfg).eval()
        _perturb(model, seed)
        path = str(tmp_path_factory.mktemp(key))
        model.save_pretrained(path, safe_serialization=True)
        out[key] = (model, path)
    return out


@pytest.fixture(scope="module")
def batch():
    rng = np.random.RandomState(0)
    ids = rng.randint(0, 97, (len(LENGTHS), max(LENGTHS))).astype(np.int32)
    mask = np.arange(max(LENGTHS))[None, :] < np.array(LENGTHS)[:, None]
    return ids, mask


def _hf_logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long),
                     attention_mask=torch.tensor(mask, dtype=torch.long)).logits.float().numpy()


@pytest.mark.parametrize("key", list(VARIANTS))
def test_logits_match_transformers(hf_models, batch, key):
    hf, path = hf_models[key]
    ids, mask = batch
    ours = from_pretrained(path)
    assert ours.config.hf_architecture == VARIANTS[key][0]
    assert (ours.lm_head is None) == hf.config.tie_word_embeddings
    got = np.asarray(ours(jnp.asarray(ids), jnp.asarray(mask)))
    want = _hf_logits(hf, ids, mask)
    assert np.abs(want[mask]).max() > 1.0  # the comparison is not between near-zeros
    np.testing.assert_allclose(got[mask], want[mask], atol=LOGITS_TOL, rtol=0)


@pytest.mark.parametrize("key", list(VARIANTS))
def test_export_is_bitwise_and_loads_in_transformers(hf_models, batch, key, tmp_path):
    hf, path = hf_models[key]
    ids, mask = batch
    ours = from_pretrained(path)
    files = save_pretrained(ours, str(tmp_path))
    assert files == ["model.safetensors"]
    original = load_file(os.path.join(path, "model.safetensors"))
    exported = load_file(str(tmp_path / "model.safetensors"))
    assert set(exported) == set(original) - ({"lm_head.weight"} if hf.config.tie_word_embeddings else set())
    for name, arr in exported.items():
        np.testing.assert_array_equal(arr, original[name], err_msg=name)
    again = from_pretrained(str(tmp_path))
    jax.tree.map(np.testing.assert_array_equal, nnx.state(again, nnx.Param), nnx.state(ours, nnx.Param))

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert type(reloaded).__name__ == VARIANTS[key][0]
    assert reloaded.config.tie_word_embeddings == hf.config.tie_word_embeddings
    assert reloaded.config.rope_parameters == hf.config.rope_parameters
    np.testing.assert_allclose(_hf_logits(reloaded, ids, mask)[mask], _hf_logits(hf, ids, mask)[mask],
                               atol=1e-6, rtol=0)


def test_generation_config_and_sharded_export(hf_models, batch, tmp_path):
    hf, path = hf_models["llama_untied_bias_llama3"]
    ids, mask = batch
    ours = from_pretrained(path)
    files = save_pretrained(ours, str(tmp_path), max_shard_bytes=20_000)
    assert len(files) > 2 and not (tmp_path / "model.safetensors").exists()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == files
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2, 3] and gen["bos_token_id"] == 1
    again = from_pretrained(str(tmp_path))
    jax.tree.map(np.testing.assert_array_equal, nnx.state(again, nnx.Param), nnx.state(ours, nnx.Param))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    np.testing.assert_allclose(_hf_logits(reloaded, ids, mask)[mask], _hf_logits(hf, ids, mask)[mask],
                               atol=1e-6, rtol=0)


def test_weight_sync_round_trip(hf_models, batch):
    _, path = hf_models["qwen3_untied_qknorm"]
    ids, mask = batch
    src = from_pretrained(path)
    dst = Decoder(src.config, rngs=nnx.Rngs(7))
    state_dict = to_hf_state_dict(nnx.state(src, nnx.Param))
    assert state_dict.keys() == to_hf_state_dict(src).keys()
    assert state_dict["model.layers.1.self_attn.q_proj.weight"].shape == (64, 32)  # [out, in]
    load_hf_state_dict(dst, state_dict)
    np.testing.assert_array_equal(dst(jnp.asarray(ids), jnp.asarray(mask)),
                                  src(jnp.asarray(ids), jnp.asarray(mask)))


def _copy_checkpoint(path, dst, tensors=None, config=None):
    os.makedirs(dst, exist_ok=True)
    cfg = json.load(open(os.path.join(path, "config.json")))
    json.dump(config(cfg) if config else cfg, open(os.path.join(dst, "config.json"), "w"))
    t = load_file(os.path.join(path, "model.safetensors"))
    save_file(tensors(t) if tensors else t, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_import_errors_name_the_tensor_or_field(hf_models, tmp_path):
    _, path = hf_models["qwen2_tied"]
    name = "model.layers.1.self_attn.k_proj.bias"

    def drop(t):
        return {k: v for k, v in t.items() if k != name}

    missing = "model.safetensors: tensor '" + name.replace(".", r"\.") + "' is missing"
    with pytest.raises(ValueError, match=missing):
        from_pretrained(_copy_checkpoint(path, str(tmp_path / "missing"), tensors=drop))

    def reshape(t):
        return dict(t, **{name: np.zeros((3,), np.float32)})

    with pytest.raises(ValueError, match=r"k_proj\.bias.*\(3,\).*\(16,\)"):
        from_pretrained(_copy_checkpoint(path, str(tmp_path / "shape"), tensors=reshape))

    def extra(t):
        return dict(t, **{"model.layers.9.mlp.up_proj.weight": np.zeros((2,), np.float32)})

    with pytest.raises(ValueError, match=r"layers\.9\.mlp"):
        from_pretrained(_copy_checkpoint(path, str(tmp_path / "extra"), tensors=extra))

    def arch(cfg):
        return dict(cfg, architectures=["GPT2LMHeadModel"])

    with pytest.raises(ValueError, match="architectures"):
        from_pretrained(_copy_checkpoint(path, str(tmp_path / "arch"), config=arch))

    corrupt = _copy_checkpoint(path, str(tmp_path / "corrupt"))
    with open(os.path.join(corrupt, "model.safetensors"), "r+b") as f:
        f.seek(8)
        f.write(b"\x00not json")
    with pytest.raises(ValueError, match="corrupt safetensors header"):
        from_pretrained(corrupt)

    pickle_only = tmp_path / "pickle"
    pickle_only.mkdir()
    (pickle_only / "config.json").write_text(open(os.path.join(path, "config.json")).read())
    (pickle_only / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(FileNotFoundError, match="pickle"):
        from_pretrained(str(pickle_only))


def test_bf16_load_and_export(hf_models, batch, tmp_path):
    hf, path = hf_models["qwen2_tied"]
    ids, mask = batch
    m16 = from_pretrained(path, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    assert m16.embed_tokens.embedding[...].dtype == jnp.bfloat16
    got = np.asarray(m16(jnp.asarray(ids), jnp.asarray(mask)))
    want = _hf_logits(hf, ids, mask)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    scale = np.abs(want[mask]).max()
    assert np.abs(got[mask] - want[mask]).max() < 0.1 * scale
    save_pretrained(m16, str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    again = from_pretrained(str(tmp_path), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    jax.tree.map(np.testing.assert_array_equal, nnx.state(again, nnx.Param), nnx.state(m16, nnx.Param))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert reloaded.model.embed_tokens.weight.dtype == torch.bfloat16
