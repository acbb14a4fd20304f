"""Export of the learner's policy in the Hugging Face layout (``sft.save_model``'s
``<run_dir>/sft_model``; `benchmarks/rehearsal.py`)."""

from __future__ import annotations

import pathlib
import shutil
from typing import Any

from entr_jax.assets import tiny_dir
from entr_jax.model import save_pretrained
from experiments.run import multiprocess as mp

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def export_policy(learner_state: Any, path: str | pathlib.Path, model_path: str,
                  writer: bool = True) -> None:
    """Write the policy of ``learner_state`` (a `learners.learner.Learner`'s state) to
    ``path`` (`entr_jax.model.save_pretrained`), with the tokenizer files of
    ``model_path`` (the embedded tiny model's when empty). Every process calls it (the
    weights are gathered); only the ``writer`` writes."""
    model = mp.local_model(learner_state)
    if not writer:
        return
    save_pretrained(model, path)
    source = pathlib.Path(model_path or tiny_dir())
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, pathlib.Path(path) / name)
