"""`ModelConfig`: the decoder's hyper-parameters, read from and written to HF `config.json`.

One frozen dataclass covers the three supported decoder families:

- ``llama``  (``LlamaForCausalLM``): optional q/k/v/o bias (``attention_bias``), optional
  Llama 3 RoPE frequency scaling (``rope_scaling`` of type ``"llama3"``);
- ``qwen2``  (``Qwen2ForCausalLM``): bias on q/k/v (always), none on o;
- ``qwen3``  (``Qwen3ForCausalLM``): RMSNorm over ``head_dim`` on q and k (``qk_norm``).

`from_hf_config` accepts both the transformers 4.x layout (top-level ``rope_theta`` /
``rope_scaling``) and the 5.x layout (``rope_parameters``); `to_hf_config` writes both so
that transformers 4/5, vLLM and SGLang read it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Mapping

Family = Literal["llama", "qwen2", "qwen3"]

ARCHITECTURES: dict[str, Family] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_ARCH_OF_FAMILY = {family: arch for arch, family in ARCHITECTURES.items()}


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3 RoPE frequency scaling (HF ``rope_scaling`` with ``rope_type="llama3"``).

    Attributes:
      factor: divisor applied to low frequencies (wavelength > original_max / low_freq_factor).
      low_freq_factor: wavelengths above ``original_max_position_embeddings / low_freq_factor``
        are divided by ``factor``.
      high_freq_factor: wavelengths below ``original_max_position_embeddings /
        high_freq_factor`` are kept; in between, inverse frequencies are interpolated.
      original_max_position_embeddings: the pre-training context length (tokens).
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self):
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"rope_scaling.{name} must be > 0, got {getattr(self, name)!r}")
        if not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                "rope_scaling.high_freq_factor must be > rope_scaling.low_freq_factor, got "
                f"{self.high_freq_factor} <= {self.low_freq_factor}"
            )
        if not int(self.original_max_position_embeddings) > 0:
            raise ValueError("rope_scaling.original_max_position_embeddings must be > 0")

    def to_hf(self) -> dict[str, Any]:
        return {
            "rope_type": "llama3",
            "factor": float(self.factor),
            "low_freq_factor": float(self.low_freq_factor),
            "high_freq_factor": float(self.high_freq_factor),
            "original_max_position_embeddings": int(self.original_max_position_embeddings),
        }


TokenIds = int | tuple[int, ...] | None


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder hyper-parameters (hashable, so it can be closed over by `jax.jit`).

    Attributes:
      architecture: decoder family, ``"llama" | "qwen2" | "qwen3"``.
      vocab_size: V, rows of the embedding / unembedding matrix.
      hidden_size: D, residual stream width.
      intermediate_size: I, SwiGLU hidden width.
      num_layers: number of decoder blocks (HF ``num_hidden_layers``).
      num_heads: query heads H (HF ``num_attention_heads``).
      num_kv_heads: key/value heads K (grouped-query attention; H % K == 0).
      head_dim: per-head width (even, for RoPE).
      rope_theta: RoPE base (inverse frequencies ``theta ** (-2i / head_dim)``).
      rope_scaling: `Llama3RopeScaling` or None (plain RoPE).
      rms_norm_eps: epsilon inside every RMSNorm's square root.
      tie_word_embeddings: unembed with the input embedding matrix (no ``lm_head``).
      attention_bias: bias on the q/k/v projections (and o for llama); always True for qwen2.
      qk_norm: RMSNorm over head_dim on q and k before RoPE; True exactly for qwen3.
      max_position_embeddings: the context length declared by the checkpoint (tokens).
      bos_token_id / eos_token_id / pad_token_id: as given in config.json (int, tuple of
        ints for several eos ids, or None).
    """

    architecture: Family
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: TokenIds = None
    eos_token_id: TokenIds = None
    pad_token_id: TokenIds = None

    def __post_init__(self):
        if self.architecture not in _ARCH_OF_FAMILY:
            raise ValueError(
                f"architecture must be one of {sorted(_ARCH_OF_FAMILY)}, got {self.architecture!r}"
            )
        for name in (
            "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
            "num_kv_heads", "head_dim", "max_position_embeddings",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if not float(self.rope_theta) > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta!r}")
        if not float(self.rms_norm_eps) > 0:
            raise ValueError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, Llama3RopeScaling):
            raise ValueError(
                f"rope_scaling must be a Llama3RopeScaling or None, got {self.rope_scaling!r}"
            )
        if self.architecture == "qwen2" and not self.attention_bias:
            raise ValueError("attention_bias must be True for architecture 'qwen2'")
        if self.qk_norm != (self.architecture == "qwen3"):
            raise ValueError(
                f"qk_norm must be {self.architecture == 'qwen3'} for architecture "
                f"{self.architecture!r}"
            )
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            ids = value if isinstance(value, tuple) else (value,)
            if not all(i is None or (isinstance(i, int) and not isinstance(i, bool)) for i in ids):
                raise ValueError(f"{name} must be an int, a tuple of ints or None, got {value!r}")

    @property
    def hf_architecture(self) -> str:
        """The transformers class name, e.g. ``"Qwen2ForCausalLM"``."""
        return _ARCH_OF_FAMILY[self.architecture]

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """All end-of-sequence ids as a tuple (empty when unknown)."""
        if self.eos_token_id is None:
            return ()
        return self.eos_token_id if isinstance(self.eos_token_id, tuple) else (self.eos_token_id,)

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any]) -> "ModelConfig":
        """Builds a config from a parsed HF ``config.json``.

        Raises:
          ValueError: unsupported ``architectures`` / ``model_type``, ``hidden_act`` other than
            silu, ``mlp_bias``, ``use_sliding_window``, a ``rope_scaling`` type other than
            default/llama3, or a missing required field (each message names the field).
        """
        archs = hf.get("architectures")
        if archs is not None:
            if not isinstance(archs, (list, tuple)) or len(archs) != 1 or archs[0] not in ARCHITECTURES:
                raise ValueError(
                    f"architectures must be one of {[[a] for a in ARCHITECTURES]}, got {archs!r}"
                )
            family = ARCHITECTURES[archs[0]]
        elif hf.get("model_type") in _ARCH_OF_FAMILY:
            family = hf["model_type"]
        else:
            raise ValueError(
                "architectures is missing and model_type "
                f"{hf.get('model_type')!r} is not one of {sorted(_ARCH_OF_FAMILY)}"
            )

        def req(name: str):
            if hf.get(name) is None:
                raise ValueError(f"config.json field {name!r} is missing")
            return hf[name]

        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act must be 'silu', got {act!r}")
        if hf.get("mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported")
        if hf.get("use_sliding_window", False):
            raise ValueError("use_sliding_window=True is not supported")

        rope_theta, rope_scaling = _parse_rope(hf)
        num_heads = int(req("num_attention_heads"))
        hidden = int(req("hidden_size"))
        head_dim = hf.get("head_dim") or hidden // num_heads
        if family == "qwen2":
            attention_bias = True
        else:
            attention_bias = bool(hf.get("attention_bias", False))
        return cls(
            architecture=family,
            vocab_size=int(req("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(req("intermediate_size")),
            num_layers=int(req("num_hidden_layers")),
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            qk_norm=family == "qwen3",
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            bos_token_id=_ids(hf.get("bos_token_id")),
            eos_token_id=_ids(hf.get("eos_token_id")),
            pad_token_id=_ids(hf.get("pad_token_id")),
        )

    def to_hf_config(self) -> dict[str, Any]:
        """The inverse of `from_hf_config`: a ``config.json`` dict for transformers/vLLM/SGLang.

        RoPE is written in both layouts (``rope_theta`` + ``rope_scaling`` for 4.x readers,
        ``rope_parameters`` for transformers 5). ``from_hf_config(c.to_hf_config()) == c``.
        """
        rope_scaling = self.rope_scaling.to_hf() if self.rope_scaling is not None else None
        rope_parameters = {"rope_theta": float(self.rope_theta), "rope_type": "default"}
        if rope_scaling is not None:
            rope_parameters.update(rope_scaling)
        out: dict[str, Any] = {
            "architectures": [self.hf_architecture],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": float(self.rms_norm_eps),
            "rope_theta": float(self.rope_theta),
            "rope_scaling": rope_scaling,
            "rope_parameters": rope_parameters,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_dropout": 0.0,
            "bos_token_id": _hf_ids(self.bos_token_id),
            "eos_token_id": _hf_ids(self.eos_token_id),
            "pad_token_id": _hf_ids(self.pad_token_id),
            "use_cache": True,
        }
        if self.architecture == "llama":
            out.update(attention_bias=self.attention_bias, mlp_bias=False)
        elif self.architecture == "qwen2":
            out.update(use_sliding_window=False, sliding_window=None)
        else:
            out.update(attention_bias=self.attention_bias, use_sliding_window=False,
                       sliding_window=None)
        return out


def _ids(value: Any) -> TokenIds:
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    return value


def _hf_ids(value: TokenIds) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _parse_rope(hf: Mapping[str, Any]) -> tuple[float, Llama3RopeScaling | None]:
    params = hf.get("rope_parameters")
    if isinstance(params, Mapping):
        theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
        scaling, field = params, "rope_parameters"
    else:
        theta = hf.get("rope_theta", 10000.0)
        scaling, field = hf.get("rope_scaling"), "rope_scaling"
    if not scaling:
        return theta, None
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ValueError(f"{field} of type {rope_type!r} is not supported (only default, llama3)")
    try:
        return theta, Llama3RopeScaling(
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise ValueError(f"{field} of type 'llama3' is missing {e.args[0]!r}") from None
