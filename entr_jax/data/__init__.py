"""Prompt data: data files, example sources, grain prompt-batch iterator, templates, SFT demos.

Data files are found by `locate` (data folder, package, user cache, pinned download; see
`entr_jax.data.files`) and fetched ahead of time with ``entr-data`` (`entr_jax.data.cli`).
Importing this package does not import grain, reasoning-gym, math-verify, httpx or
huggingface_hub; those load when used.
"""

from entr_jax.data.pipeline import PromptBatchIterator, PromptDataConfig
from entr_jax.data.files import DataNotFoundError, locate
from entr_jax.data.sources import load_source
from entr_jax.data.templates import PromptTemplate, encode_prompt

__all__ = [
    "DataNotFoundError",
    "PromptBatchIterator",
    "PromptDataConfig",
    "PromptTemplate",
    "encode_prompt",
    "load_source",
    "locate",
]
