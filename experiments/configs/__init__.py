"""Named experiment presets: ``entr-run NAME [--field value ...]``.

Each preset is a complete `RunConfig`; command-line flags override any field. The
CPU-scale presets use the embedded tiny model; the GPU/TPU presets take a local Hugging
Face checkpoint with ``--model.path``.
"""

from __future__ import annotations

import dataclasses

from entr_jax.advantages import AdvantageConfig
from entr_jax.staleness import StalenessConfig
from experiments.config import (CheckpointSpec, ModelSpec, ObjectiveSpec, RunConfig, SFTSpec,
                                SamplingSpec, TaskSpec)
from learners.optim import OptimizerConfig

# The embedded default: tiny model, CPU, arithmetic from GSM8K's calculator annotations.
QUICKSTART = RunConfig(
    name="quickstart",
    seed=0,
    rl_steps=150,
    token_samples_every=10,
    task=TaskSpec(name="arithmetic", template="plain", prompts_per_step=16,
                  samples_per_prompt=8, max_new_tokens=12, max_total_tokens=12,
                  eval_examples=0, eval_samples=4, arithmetic_max_chars=4),
    sampling=SamplingSpec(temperature=1.0),
    advantages=AdvantageConfig(estimator="grpo"),
    objective=ObjectiveSpec(name="entr"),
    optim=OptimizerConfig(learning_rate=1e-4, warmup_steps=0, max_grad_norm=1.0),
    sft=SFTSpec(steps=1000, batch_size=64, learning_rate=1e-3, warmup_steps=20),
    staleness=StalenessConfig(mode="simulated", inter_lag=2, intra_switches=1,
                              switch_window=4, ring_size=2),
    checkpoint=CheckpointSpec(every=50, keep=2),
)

PRESETS: dict[str, tuple[str, RunConfig]] = {
    "quickstart": (
        "Tiny model on CPU: SFT warm start, then ENTR under simulated staleness "
        "(inter lag 2, one intra switch) on the calculator steps of GSM8K's training "
        "solutions (expressions of at most 4 characters); eval on held-out expressions "
        "before and after RL.",
        QUICKSTART,
    ),
}


def preset(name: str, **changes) -> RunConfig:
    """A preset with top-level fields replaced (nested specs via dataclasses.replace)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name][1], **changes)
