"""Files shipped with the package: the embedded tiny model directory (HF layout, no weights).

``tiny/`` holds ``tokenizer.json``, ``tokenizer_config.json`` (with a ChatML
``chat_template``), ``config.json`` (a tiny ``Qwen2ForCausalLM``) and
``generation_config.json``. Rebuild it with ``python -m entr_jax.assets.build_tiny``.
"""

from __future__ import annotations

import pathlib

__all__ = ["tiny_dir"]


def tiny_dir() -> pathlib.Path:
    """Path of the embedded tiny model directory (exists inside the installed package)."""
    return pathlib.Path(__file__).resolve().parent / "tiny"
