"""Hugging Face checkpoint I/O and weight sync for `Decoder` (safetensors only, never pickles).

ONE name map (`nnx_path_to_hf`) serves import (`from_pretrained`, `load_hf_state_dict`),
export (`save_pretrained`, `to_hf_state_dict`) and weight sync to HF-layout engines
(SGLang / vLLM). HF ``nn.Linear`` weights are ``[out, in]``; ours are ``[in, out]``, so
those entries are transposed; embeddings, ``lm_head`` and norm gains are copied as is.
The decoder's block parameters are stacked on a leading layer axis (``layers.attn.q_proj
.kernel [N, D, H*hd]``); layer ``i``'s slice is HF's ``model.layers.{i}.…`` tensor, so
export slices and import stacks (`hf_entries`), exact copies both ways.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from entr_jax.file_errors import BadFileError, read_json_object
from entr_jax.model.config import ModelConfig
from entr_jax.model.decoder import Decoder

# NNX path -> (HF name, transpose). Layer entries are relative to ("layers", i) /
# "model.layers.{i}.".
_TOP = {
    ("embed_tokens", "embedding"): ("model.embed_tokens.weight", False),
    ("final_norm", "scale"): ("model.norm.weight", False),
    ("lm_head",): ("lm_head.weight", False),
}
_LAYER = {
    ("input_norm", "scale"): ("input_layernorm.weight", False),
    ("post_attn_norm", "scale"): ("post_attention_layernorm.weight", False),
    ("attn", "q_norm", "scale"): ("self_attn.q_norm.weight", False),
    ("attn", "k_norm", "scale"): ("self_attn.k_norm.weight", False),
    ("mlp", "gate_proj", "kernel"): ("mlp.gate_proj.weight", True),
    ("mlp", "up_proj", "kernel"): ("mlp.up_proj.weight", True),
    ("mlp", "down_proj", "kernel"): ("mlp.down_proj.weight", True),
}
for _p in ("q_proj", "k_proj", "v_proj", "o_proj"):
    _LAYER[("attn", _p, "kernel")] = (f"self_attn.{_p}.weight", True)
    _LAYER[("attn", _p, "bias")] = (f"self_attn.{_p}.bias", False)

# Tensors found in some HF checkpoints that carry no parameter of ours.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def nnx_path_to_hf(path: tuple) -> tuple[str, bool]:
    """Maps an NNX parameter path, e.g. ``("layers", 3, "attn", "q_proj", "kernel")``
    (layer 3's slice of the stacked parameter), to ``(HF tensor name, transpose)``, e.g.
    ``("model.layers.3.self_attn.q_proj.weight", True)``.

    Raises:
      KeyError: a path that is not a `Decoder` parameter.
    """
    path = tuple(path)
    if path in _TOP:
        return _TOP[path]
    if len(path) > 2 and path[0] == "layers" and path[2:] in _LAYER:
        name, transpose = _LAYER[path[2:]]
        return f"model.layers.{int(path[1])}.{name}", transpose
    raise KeyError(f"no HF name for parameter path {path!r}")


def hf_entries(path: tuple, num_layers: int) -> list[tuple[str, bool, int | None]]:
    """``(HF name, transpose, layer)`` of every HF tensor held by the parameter at
    ``path``: one entry with layer None for a top-level parameter, one per layer ``i``
    (its slice ``[i]``) for a stacked block parameter ``("layers", ...)``.

    Raises:
      KeyError: a path that is not a `Decoder` parameter.
    """
    path = tuple(path)
    if path and path[0] == "layers" and not isinstance(path[1], int):
        return [nnx_path_to_hf(("layers", i) + path[1:]) + (i,) for i in range(num_layers)]
    return [nnx_path_to_hf(path) + (None,)]


def _flat_params(obj: Any) -> Iterator[tuple[tuple, Any]]:
    """(path, leaf) pairs of a Decoder, an ``nnx.State`` or a nested dict of arrays."""
    if isinstance(obj, nnx.Module):
        obj = nnx.state(obj, nnx.Param)

    def walk(node, prefix):
        if isinstance(node, Mapping):
            for key, child in node.items():
                yield from walk(child, prefix + (key,))
        elif node is not None:
            yield prefix, node

    yield from walk(obj, ())


def _array(leaf: Any):
    return leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf


def to_hf_state_dict(params: Decoder | nnx.State | Mapping) -> dict[str, np.ndarray]:
    """HF-named host arrays (``[out, in]`` Linear weights) of a model's parameters.

    Args:
      params: a `Decoder`, its ``nnx.State`` (``nnx.state(model, nnx.Param)``, possibly
        sharded: each array is gathered to the host) or the same as a nested dict; block
        parameters stacked on a leading layer axis (`hf_entries`).
    Returns:
      ``{hf_name: np.ndarray}`` in the parameters' dtype (bf16 as ``ml_dtypes.bfloat16``).
    """
    out = {}
    for path, leaf in _flat_params(params):
        arr = np.asarray(jax.device_get(_array(leaf)))
        for name, transpose, layer in hf_entries(path, len(arr) if path[0] == "layers" else 0):
            one = arr if layer is None else arr[layer]
            out[name] = np.ascontiguousarray(one.T if transpose else one)
    return out


def _fault(where: str | None, problem: str) -> ValueError:
    """A `BadFileError` for file ``where``, or a plain ValueError for in-memory tensors."""
    return BadFileError(where, problem) if where else ValueError(problem)


def _check_tensor(name: str, shape: tuple, dtype: str, want: tuple, where: str | None) -> None:
    """Refuse a tensor of another shape than the model's, or of a non-float dtype."""
    if tuple(shape) != tuple(want):
        raise _fault(where, f"tensor {name!r} has shape {tuple(shape)}, expected {tuple(want)} "
                            "by config.json (weights of another model?)")
    if not dtype.startswith(("F", "BF", "float", "bfloat")):
        raise _fault(where, f"tensor {name!r} has dtype {dtype}; weights must be floating point "
                            "(float32, bfloat16 or float16), they are never cast from integers")


def _missing(name: str, config: ModelConfig, where: str | None) -> ValueError:
    return _fault(where, f"tensor {name!r} is missing (config.json describes a "
                         f"{config.architecture} model: weights of another architecture?)")


def _hf_shape(want: tuple[int, ...], transpose: bool, layer: int | None) -> tuple[int, ...]:
    """The HF shape of one entry (`hf_entries`) of a parameter of shape ``want``."""
    one = tuple(want[1:]) if layer is not None else tuple(want)
    return one[::-1] if transpose else one


def _gather(tensors: Mapping[str, np.ndarray], entries, want: tuple[int, ...],
            config: ModelConfig) -> np.ndarray:
    """The HF tensors of ``entries`` (`hf_entries`), checked (present, the right shape, a
    float dtype, finite values: `load_hf_state_dict`), transposed back to our layout and
    stacked when they are a stacked parameter's layers."""
    where = getattr(tensors, "file_of", lambda name: None)
    arrays = []
    for name, transpose, layer in entries:
        if name not in tensors:
            raise _missing(name, config, where(None))
        arr = np.asarray(tensors[name])
        is_float = arr.dtype.kind == "f" or arr.dtype.name.startswith(("bfloat", "float"))
        _check_tensor(name, arr.shape, "float" if is_float else arr.dtype.name,
                      _hf_shape(want, transpose, layer), where(name))
        if not np.isfinite(arr).all():
            bad = int(arr.size - np.isfinite(arr).sum())
            raise _fault(where(name), f"tensor {name!r} has {bad} NaN/inf values of {arr.size}")
        arrays.append(arr.T if transpose else arr)
    return arrays[0] if entries[0][2] is None else np.stack(arrays)


def _unexpected(model: Decoder, names, used: set[str]) -> list[str]:
    return sorted(
        n for n in names
        if n not in used and not n.endswith(_IGNORED_SUFFIXES)
        and not (n == "lm_head.weight" and model.config.tie_word_embeddings))


def load_hf_state_dict(model: Decoder, tensors: Mapping[str, np.ndarray], *,
                       strict: bool = True) -> None:
    """Copies HF-named tensors into ``model``'s parameters in place (weight sync / import).

    Each value is cast to the parameter's dtype (from another float dtype only) and placed
    with the parameter's current sharding when it has one; the layers' tensors are stacked
    into the block parameters. ``lm_head.weight`` is ignored for tied-embedding models.

    Raises:
      ValueError: a tensor the model needs is missing, has the wrong shape, a non-float
        dtype or a NaN/inf value, or, with ``strict``, ``tensors`` holds a name the model
        does not use; each names the tensor and, for tensors read from files
        (`read_hf_tensors`), is a `entr_jax.file_errors.BadFileError` naming the file.
    """
    used = set()
    for path, var in list(nnx.to_flat_state(nnx.state(model, nnx.Param))):
        current = var.get_value()
        entries = hf_entries(path, model.config.num_layers)
        value = jnp.asarray(_gather(tensors, entries, tuple(current.shape), model.config),
                            dtype=current.dtype)
        sharding = getattr(current, "sharding", None)
        if isinstance(sharding, jax.sharding.Sharding):
            value = jax.device_put(value, sharding)
        var.set_value(value)
        used.update(name for name, _, _ in entries)
    if strict:
        extra = _unexpected(model, tensors, used)
        if extra:
            where = getattr(tensors, "file_of", lambda name: None)
            raise _fault(where(None), f"unexpected tensors in the checkpoint: {extra[:8]} "
                                      "(weights of another architecture than config.json's?)")


def check_hf_tensors(path: str, config: ModelConfig) -> None:
    """Check the safetensors of directory ``path`` against ``config`` from their headers
    only (no weight is read): every tensor the model needs is there, with its shape and a
    float dtype, and none is left over.

    Raises:
      FileNotFoundError: no safetensors files (`read_hf_tensors`).
      entr_jax.file_errors.BadFileError: naming the file and the tensor.
    """
    tensors = read_hf_tensors(path)
    model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    used = set()
    for param_path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        shape = tuple(var.get_value().shape)
        for name, transpose, layer in hf_entries(param_path, config.num_layers):
            if name not in tensors:
                raise _missing(name, config, tensors.file_of(None))
            header_shape, dtype = tensors.header(name)
            _check_tensor(name, header_shape, dtype, _hf_shape(shape, transpose, layer),
                          tensors.file_of(name))
            used.add(name)
    extra = _unexpected(model, tensors, used)
    if extra:
        raise BadFileError(tensors.file_of(None), f"unexpected tensors in the checkpoint: "
                           f"{extra[:8]} (weights of another architecture than config.json's?)")


class _LazySafetensors(Mapping):
    """Read-only ``{name: np.ndarray}`` over one or more safetensors files, loaded on access."""

    def __init__(self, files_by_name: dict[str, str], source: str):
        self._files_by_name = files_by_name
        self._source = source
        self._handles: dict[str, Any] = {}

    def file_of(self, name: str | None) -> str:
        """The file holding tensor ``name`` (None: the checkpoint's index or single file)."""
        return self._files_by_name.get(name, self._source) if name else self._source

    def header(self, name: str) -> tuple[tuple[int, ...], str]:
        """``(shape, safetensors dtype such as "BF16")`` of tensor ``name``, header only."""
        file = self._files_by_name[name]
        try:
            piece = self._handle(file).get_slice(name)
            return tuple(piece.get_shape()), str(piece.get_dtype())
        except SafetensorError as e:
            raise BadFileError(file, f"cannot read tensor {name!r}: {e}") from None

    def _handle(self, file):
        if file not in self._handles:
            self._handles[file] = _open(file)
        return self._handles[file]

    def __getitem__(self, name):
        file = self._files_by_name[name]
        try:
            return self._handle(file).get_tensor(name)
        except SafetensorError as e:
            raise BadFileError(file, f"cannot read tensor {name!r}: {e}") from None

    def __iter__(self):
        return iter(self._files_by_name)

    def __len__(self):
        return len(self._files_by_name)


def _open(file: str):
    try:
        return safe_open(file, framework="numpy")
    except SafetensorError as e:
        raise BadFileError(file, f"corrupt safetensors header: {e}") from None
    except FileNotFoundError:
        raise FileNotFoundError(f"safetensors file {file!r} listed in the checkpoint is missing") from None


def read_hf_tensors(path: str) -> Mapping[str, np.ndarray]:
    """Lazy ``{name: np.ndarray}`` of ``path/model.safetensors`` or the files named by
    ``path/model.safetensors.index.json`` (``weight_map``). Pickle checkpoints are refused."""
    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(index):
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(
                isinstance(v, str) for v in weight_map.values()):
            raise BadFileError(index, "field 'weight_map' is missing or not an object of "
                                      "file names")
        return _LazySafetensors({k: os.path.join(path, v) for k, v in weight_map.items()}, index)
    if os.path.exists(single):
        return _LazySafetensors({k: single for k in _open(single).keys()}, single)
    raise FileNotFoundError(
        f"no model.safetensors or model.safetensors.index.json in {path} "
        "(pickle checkpoints such as pytorch_model.bin are not loaded)"
    )


def read_config(path: str | os.PathLike) -> ModelConfig:
    """`ModelConfig` of ``<path>/config.json``.

    Raises:
      FileNotFoundError: the file does not exist.
      entr_jax.file_errors.BadFileError: it is not JSON or not a supported model (naming
        the file and the field).
    """
    config_file = os.path.join(path, "config.json")
    try:
        return ModelConfig.from_hf_config(read_json_object(config_file))
    except BadFileError:
        raise
    except ValueError as e:
        raise BadFileError(config_file, str(e)) from None


def from_pretrained(path: str, *, dtype=jnp.float32, param_dtype=jnp.float32,
                    **decoder_kwargs) -> Decoder:
    """Loads a local HF directory (``config.json`` + safetensors) into a `Decoder`.

    Parameters are created abstractly (no random init) and filled from the files;
    ``decoder_kwargs`` go to `Decoder` (``remat``, ``attention``, ``scan_layers``).

    Raises:
      FileNotFoundError: no config.json / safetensors files.
      entr_jax.file_errors.BadFileError: (a ValueError) naming the file: config.json not
        JSON or of an unsupported model, a corrupt safetensors header, a tensor missing,
        left over, of another shape, of a non-float dtype or with NaN/inf values.
    """
    config = read_config(path)
    model = nnx.eval_shape(
        lambda: Decoder(config, rngs=nnx.Rngs(0), dtype=dtype, param_dtype=param_dtype,
                        **decoder_kwargs)
    )
    load_hf_state_dict(model, read_hf_tensors(path))
    return model


def _dtype_name(arr: np.ndarray) -> str:
    return "bfloat16" if arr.dtype.name == "bfloat16" else str(arr.dtype)


_OS_ERROR_CODE = re.compile(r"os error (\d+)|code: (\d+)")


def save_safetensors(tensors: Mapping[str, np.ndarray], filename: str,
                     metadata: dict[str, str] | None = None) -> None:
    """`safetensors.numpy.save_file`; a failed write is raised as the `OSError` it is (e.g.
    ``errno.ENOSPC``) with ``filename`` set and the `SafetensorError`, which names no file,
    as its cause. Other failures to serialise stay `SafetensorError`."""
    try:
        save_file(dict(tensors), filename, metadata=metadata)
    except SafetensorError as e:
        match = _OS_ERROR_CODE.search(str(e))
        if match is None:
            raise
        code = int(match.group(1) or match.group(2))
        raise OSError(code, os.strerror(code), filename) from e


def save_pretrained(model: Decoder, path: str, *, max_shard_bytes: int = 4 * 2**30) -> list[str]:
    """Writes ``config.json``, safetensors weights and (when eos ids are known)
    ``generation_config.json`` into ``path``, loadable by transformers, vLLM and SGLang.

    Weights go to ``model.safetensors``, or, past ``max_shard_bytes``, to
    ``model-0000k-of-0000n.safetensors`` shards with ``model.safetensors.index.json``.
    Tied-embedding models write no ``lm_head.weight``. Returns the weight file names.

    Raises:
      OSError: a file could not be written (a full disk), naming it (`save_safetensors`).
    """
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be > 0, got {max_shard_bytes}")
    os.makedirs(path, exist_ok=True)
    config = model.config
    tensors = to_hf_state_dict(model)
    hf_config = config.to_hf_config()
    dtype = _dtype_name(tensors["model.embed_tokens.weight"])
    hf_config["torch_dtype"] = dtype
    hf_config["dtype"] = dtype
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
    if config.eos_token_id is not None:
        gen = {"bos_token_id": hf_config["bos_token_id"], "eos_token_id": hf_config["eos_token_id"]}
        if config.pad_token_id is not None:
            gen["pad_token_id"] = hf_config["pad_token_id"]
        with open(os.path.join(path, "generation_config.json"), "w") as f:
            json.dump(gen, f, indent=2)

    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].nbytes
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += nbytes
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_safetensors(shards[0], os.path.join(path, "model.safetensors"), metadata=meta)
        return ["model.safetensors"]
    files, weight_map = [], {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_safetensors(shard, os.path.join(path, fname), metadata=meta)
        files.append(fname)
        weight_map.update({name: fname for name in shard})
    index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))},
             "weight_map": weight_map}
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
    return files
