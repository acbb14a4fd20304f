"""Test setup: 8 fake CPU devices (set before jax is imported) and strict rank promotion."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ENTR_JAX_CACHE", "0")  # entr-run's compilation cache: not in tests

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")


import json  # noqa: E402
import shutil  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory):
    """A 2-layer Qwen2 checkpoint with the embedded tokenizer (vocabulary 1024)."""
    from flax import nnx

    from entr_jax.assets import tiny_dir
    from entr_jax.model import Decoder, ModelConfig, save_pretrained

    path = tmp_path_factory.mktemp("small_model")
    hf = json.loads((tiny_dir() / "config.json").read_text())
    hf.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model = Decoder(ModelConfig.from_hf_config(hf), rngs=nnx.Rngs(0))
    save_pretrained(model, path)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_dir() / name, path / name)
    return path
