"""Prompt data: example sources, grain prompt-batch iterator, templates, SFT demos.

Importing this package does not import grain, reasoning-gym or math-verify; those load
when used.
"""

from entr_jax.data.pipeline import PromptBatchIterator, PromptDataConfig
from entr_jax.data.sources import data_dir, load_source
from entr_jax.data.templates import PromptTemplate, encode_prompt

__all__ = [
    "PromptBatchIterator",
    "PromptDataConfig",
    "PromptTemplate",
    "data_dir",
    "encode_prompt",
    "load_source",
]
