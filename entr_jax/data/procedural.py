"""Procedural example sources from the ``reasoning-gym`` package (imported when a source is
built, not with this module), and the example type every source returns
(`entr_jax.data.sources`, `entr_jax.data.chains`)."""

from __future__ import annotations

from typing import Any

class MissingExtraError(ImportError):
    """A source needs a package that only an extra of entr-jax installs; the message names
    the ``pip install`` command."""


Example = dict[str, Any]
"""One example: ``id``, ``question``, ``answer`` (the final answer string), ``source``, plus
source-specific extras (`entr_jax.data.sources`)."""


def reasoning_gym_source(
    task: str = "basic_arithmetic", size: int = 1000, seed: int = 0, **task_kwargs: Any
) -> list[Example]:
    """A procedural source from the ``reasoning-gym`` package (seeded; same seed, same data).

    ``answer`` is reasoning-gym's answer string; the task's metadata is kept under
    ``metadata`` (use reasoning-gym's own ``score_answer`` for non-numeric tasks).

    Raises:
      MissingExtraError: (an ImportError) reasoning-gym is not installed; the message
        names the ``study`` extra.
    """
    if size < 1:
        raise ValueError(f"reasoning_gym_source: size must be >= 1, got {size}")
    try:
        import reasoning_gym
    except ImportError as e:  # a plain install: the extra is missing
        raise MissingExtraError(
            f"data source reasoning_gym/{task} needs the reasoning-gym package, which a plain "
            "install leaves out: pip install 'entr-jax[study]' (from a clone: pip install "
            "'.[study]'; the dev extra has it too)") from e

    dataset = reasoning_gym.create_dataset(task, size=size, seed=seed, **task_kwargs)
    return [
        {
            "id": f"rg/{task}/{seed}/{i}",
            "question": entry["question"],
            "answer": str(entry["answer"]),
            "metadata": entry.get("metadata", {}),
            "source": f"reasoning_gym/{task}",
        }
        for i, entry in enumerate(dataset)
    ]
