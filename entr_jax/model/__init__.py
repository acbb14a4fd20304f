"""The policy model: a Llama / Qwen2 / Qwen3 decoder in flax NNX, its config, its logical
sharding axes and Hugging Face checkpoint I/O.

Heavy dependencies (transformers, torch) are never imported here; HF files are read and
written with `safetensors` + numpy.
"""

from entr_jax.model.config import Llama3RopeScaling, ModelConfig
from entr_jax.model.decoder import Decoder, KVCache, init_cache
from entr_jax.model.hf_io import (
    check_hf_tensors,
    from_pretrained,
    hf_entries,
    load_hf_state_dict,
    nnx_path_to_hf,
    read_config,
    read_hf_tensors,
    save_pretrained,
    to_hf_state_dict,
)
from entr_jax.model.partitioning import LOGICAL_AXIS_RULES, MESH_AXES

__all__ = [
    "Decoder", "KVCache", "LOGICAL_AXIS_RULES", "Llama3RopeScaling", "MESH_AXES",
    "ModelConfig", "check_hf_tensors", "from_pretrained", "hf_entries", "init_cache",
    "load_hf_state_dict", "nnx_path_to_hf", "read_config", "read_hf_tensors", "save_pretrained",
    "to_hf_state_dict",
]
