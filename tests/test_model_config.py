"""ModelConfig: HF config.json parsing (4.x and 5.x RoPE layouts), inverse, validation."""

import dataclasses

import pytest

from entr_jax.model import Llama3RopeScaling, ModelConfig

LLAMA_V4 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 97,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "max_position_embeddings": 1024, "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 512},
    "bos_token_id": 1, "eos_token_id": [2, 3], "hidden_act": "silu", "attention_bias": True,
}


def test_llama_v4_layout():
    c = ModelConfig.from_hf_config(LLAMA_V4)
    assert c.architecture == "llama" and c.head_dim == 8 and c.num_kv_heads == 2
    assert c.rope_theta == 500000.0 and c.rms_norm_eps == 1e-5 and c.attention_bias
    assert c.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 512)
    assert c.eos_token_id == (2, 3) and c.eos_token_ids == (2, 3) and c.bos_token_id == 1
    assert not c.qk_norm and not c.tie_word_embeddings
    hash(c)  # closed over by jit: must be hashable


def test_v5_rope_parameters_layout_equals_v4():
    v5 = {k: v for k, v in LLAMA_V4.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = dict(LLAMA_V4["rope_scaling"], rope_theta=500000.0)
    assert ModelConfig.from_hf_config(v5) == ModelConfig.from_hf_config(LLAMA_V4)


@pytest.mark.parametrize("arch,extra", [
    ("Qwen2ForCausalLM", {"attention_bias": False}),  # qwen2 ignores the field: always bias
    ("Qwen3ForCausalLM", {"head_dim": 16, "attention_bias": False}),
    ("LlamaForCausalLM", {}),
])
def test_round_trip(arch, extra):
    hf = dict(LLAMA_V4, architectures=[arch], rope_scaling=None)
    hf.update(extra)
    c = ModelConfig.from_hf_config(hf)
    assert ModelConfig.from_hf_config(c.to_hf_config()) == c
    assert c.to_hf_config()["architectures"] == [arch]
    assert c.attention_bias == (arch != "Qwen3ForCausalLM")  
    assert c.qk_norm == (arch == "Qwen3ForCausalLM")
    assert c.head_dim == extra.get("head_dim", 8)


def test_llama_scaling_round_trip():
    c = ModelConfig.from_hf_config(LLAMA_V4)
    hf = c.to_hf_config()
    assert hf["rope_scaling"]["rope_type"] == "llama3"
    assert hf["rope_parameters"]["rope_theta"] == 500000.0
    assert hf["eos_token_id"] == [2, 3]
    assert ModelConfig.from_hf_config(hf) == c


@pytest.mark.parametrize("patch,field", [
    ({"architectures": ["MistralForCausalLM"]}, "architectures"),
    ({"architectures": None, "model_type": "gpt2"}, "architectures"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 4.0}}, "low_freq_factor"),
    ({"num_key_value_heads": 3}, "num_heads"),
    ({"vocab_size": None}, "vocab_size"),
    ({"num_attention_heads": 4, "head_dim": 7}, "head_dim"),
])
def test_from_hf_config_errors_name_the_field(patch, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig.from_hf_config(dict(LLAMA_V4, **patch))


def test_validation_names_the_field():
    c = ModelConfig.from_hf_config(LLAMA_V4)
    for kwargs, field in [
        ({"architecture": "qwen2", "attention_bias": False}, "attention_bias"),
        ({"architecture": "qwen3"}, "qk_norm"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
        ({"eos_token_id": "2"}, "eos_token_id"),
    ]:
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(c, **kwargs)
    with pytest.raises(ValueError, match="high_freq_factor"):
        Llama3RopeScaling(8.0, 4.0, 1.0, 512)
