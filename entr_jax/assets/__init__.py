"""Files shipped with the package: the embedded tiny model directory (HF layout, no
weights) and the data the quickstart needs.

``tiny/`` holds ``tokenizer.json``, ``tokenizer_config.json`` (with a ChatML
``chat_template``), ``config.json`` (a tiny ``Qwen2ForCausalLM``) and
``generation_config.json``. Rebuild it with ``python -m entr_jax.assets.build_tiny``.
``data/`` holds the GSM8K training split, gzip-compressed, with its license and a README
recording source and checksums; `entr_jax.data.files.locate` reads it.
"""

from __future__ import annotations

import pathlib

__all__ = ["tiny_dir"]


def tiny_dir() -> pathlib.Path:
    """Path of the embedded tiny model directory (exists inside the installed package)."""
    return pathlib.Path(__file__).resolve().parent / "tiny"
