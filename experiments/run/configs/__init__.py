"""Named experiment presets: ``entr-run NAME [--field value ...]``.

Each preset is a complete `RunConfig`; command-line flags override any field. The
CPU-scale presets use the embedded tiny model; the GPU/TPU presets take a local Hugging
Face checkpoint with ``--model.path``.
"""

from __future__ import annotations

import dataclasses

from entr_jax.advantages import AdvantageConfig
from entr_jax.objectives.entr import EntrConfig
from entr_jax.staleness import StalenessConfig
from entr_jax.sharding import MeshConfig
from experiments.run.config import (CheckpointSpec, LearnerSpec, ModelSpec, ObjectiveSpec, RunConfig,
                                SamplerSpec, SFTSpec, SamplingSpec, TaskSpec)
from learners.optim import OptimizerConfig

# The embedded default: tiny model, CPU, arithmetic from GSM8K's calculator annotations.
# Sized for a few minutes on 2 CPU cores (`time/phases` in its summary shows where the
# time goes). The warm start needs its 1000 updates of 64 demonstrations: the
# arithmetic is learned late (SFT loss 0.74 at step 400, 0.20 at step 1000, held-out
# avg@4 0.25 before RL); at batch 32 the loss followed batch 64's for ~300 steps, then
# stalled (0.67 at step 1000, avg@4 0.07), and 500 steps of 32 gave avg@4 0.04. Then 100
# RL steps of 16 prompts x 8 samples at learning rate 2e-4. At 1e-4 the README's earlier
# run (another warm start) gained 0.007 in held-out avg@4; from this warm start (avg@4
# 0.245) one RL run each gained 0.074 at 2e-4 (paired 95% interval [0.033, 0.114] over the
# 153 examples) and 0.013 at 3e-4 ([-0.033, 0.059]). The 4 layers are applied one after
# the other without remat: at this depth the scanned layout compiles no faster and its
# steps cost more CPU (`benchmarks/quickstart_step.py`, docs/performance.md).
QUICKSTART = RunConfig(
    name="quickstart",
    seed=0,
    model=ModelSpec(scan_layers=False, remat="none"),
    rl_steps=100,
    token_samples_every=10,
    task=TaskSpec(name="arithmetic", template="plain", prompts_per_step=16,
                  samples_per_prompt=8, max_new_tokens=12, max_total_tokens=12,
                  eval_examples=0, eval_samples=4, arithmetic_max_chars=4),
    sampling=SamplingSpec(temperature=1.0),
    advantages=AdvantageConfig(estimator="grpo"),
    objective=ObjectiveSpec(name="entr"),
    optim=OptimizerConfig(learning_rate=2e-4, warmup_steps=0, max_grad_norm=1.0),
    sft=SFTSpec(steps=1000, batch_size=64, learning_rate=1e-3, warmup_steps=20),
    staleness=StalenessConfig(mode="simulated", inter_lag=2, intra_switches=1,
                              switch_window=4, ring_size=2),
    checkpoint=CheckpointSpec(every=50, keep=2),
)

# The stress testbed (docs/stress.md): long worked-step responses (76-92 tokens, at least 64 by
# construction) so that in-flight weight switches happen inside every response; Fig. 9's
# staleness axes are reachable (inter lag up to 30 through the delay line, intra switches
# up to 9 with a ring of 10 versions and switch steps drawn from [1, 47], below the
# shortest response). The synthetic sampler mismatch is off by default
# (--sampler.logit_noise_std; docs/stress.md).
STRESS = RunConfig(
    name="stress",
    seed=0,
    rl_steps=60,
    token_samples_every=10,
    task=TaskSpec(name="chain_sum", template="plain", prompts_per_step=8,
                  samples_per_prompt=8, max_new_tokens=100, max_total_tokens=128,
                  eval_examples=128, eval_samples=4, chain_terms_min=9, chain_terms_max=9,
                  chain_digits_min=1, chain_digits_max=1, chain_train_size=20000,
                  chain_style="reduce", chain_min_solution_chars=67),
    sampling=SamplingSpec(temperature=1.0),
    advantages=AdvantageConfig(estimator="grpo"),
    objective=ObjectiveSpec(name="entr"),
    optim=OptimizerConfig(learning_rate=1e-4, warmup_steps=0, max_grad_norm=1.0),
    sft=SFTSpec(steps=1500, batch_size=16, learning_rate=1e-3, warmup_steps=20),
    staleness=StalenessConfig(mode="simulated", inter_lag=4, intra_switches=3,
                              switch_window=48, ring_size=10),
    checkpoint=CheckpointSpec(every=0, keep=2),
)

# The paper's setups at real model sizes (ESTR, arXiv 2607.22186, section 6): a local HF
# checkpoint given with --model.path (Qwen2.5-7B-Instruct, Qwen3-*), learner in bf16 with
# FSDP over every device, rollouts from an SGLang fleet (docs/sglang.md), real async mode.
# Hyperparameters the paper does not state (batch, group size, LR, lengths) are the
# project's INFERRED defaults (algorithms.md section 3.4): LR 1e-6 constant, G = 8.
_GPU_COMMON = dict(
    rl_steps=500,
    token_samples_every=50,
    model=ModelSpec(path="", dtype="bfloat16", param_dtype="float32", sampler_dtype="bfloat16"),
    sampler=SamplerSpec(kind="sglang", server_urls=("http://127.0.0.1:30000",)),
    sampling=SamplingSpec(temperature=1.0),
    advantages=AdvantageConfig(estimator="grpo"),
    # stock SGLang reports top-k log-probs only: ENTR reads their entropy estimate
    objective=ObjectiveSpec(name="entr", entr=EntrConfig(entropy_source="behavior_topk")),
    optim=OptimizerConfig(learning_rate=1e-6, warmup_steps=10, max_grad_norm=1.0),
    learner=LearnerSpec(microbatches=16, mesh=MeshConfig(data=1, fsdp=-1), logprob_chunk=256),
    staleness=StalenessConfig(mode="async", max_staleness=4, intra_switches=0, ring_size=1),
    checkpoint=CheckpointSpec(every=25, keep=3),
)

GSM8K_TOOLS_GPU = RunConfig(
    name="gsm8k_tools",
    task=TaskSpec(name="gsm8k_calculator", template="chat", prompts_per_step=64,
                  samples_per_prompt=8, max_new_tokens=512, max_turns=4,
                  max_total_tokens=2048, eval_examples=0, eval_samples=4),
    **_GPU_COMMON,
)

MATH_GPU = RunConfig(
    name="math",
    task=TaskSpec(name="math", template="chat", prompts_per_step=128, samples_per_prompt=8,
                  max_new_tokens=4096, max_turns=1, max_total_tokens=4096, eval_examples=0,
                  eval_samples=4),
    **_GPU_COMMON,
)

PRESETS: dict[str, tuple[str, RunConfig]] = {
    "quickstart": (
        "Tiny model on CPU: SFT warm start, then ENTR under simulated staleness "
        "(inter lag 2, one intra switch) on the calculator steps of GSM8K's training "
        "solutions (expressions of at most 4 characters); eval on held-out expressions "
        "before and after RL.",
        QUICKSTART,
    ),
    "stress": (
        "Tiny model on CPU, the stress testbed: chains of 9 one-digit terms reduced one "
        "operation per line (76-92 response tokens), SFT warm start, then ENTR under "
        "simulated staleness (inter lag 4, 3 in-flight switches inside every response). "
        "Reuse one warm start: --model.path RUN/sft_model --sft.steps 0.",
        STRESS,
    ),
    "gsm8k_tools": (
        "Multi-turn GSM8K with a calculator tool at real model size (e.g. Qwen2.5-7B): "
        "--model.path DIR is required; SGLang fleet sampler, async, bf16 FSDP learner. "
        "Methods: --objective.name {grpo,icepop,kpop,entr,...}; GRPO sync: "
        "--staleness.mode sync.",
        GSM8K_TOOLS_GPU,
    ),
    "math": (
        "Math at real model size: train on GSM8K, evaluate on MATH-500, AIME24, AMC23 "
        "(avg@4, pass@4); --model.path DIR is required; SGLang fleet, async, bf16 FSDP.",
        MATH_GPU,
    ),
}

# Presets whose model must come from --model.path (no embedded default at that size).
REQUIRES_MODEL_PATH = frozenset({"gsm8k_tools", "math"})


def preset(name: str, **changes) -> RunConfig:
    """A preset with top-level fields replaced (nested specs via dataclasses.replace)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name][1], **changes)
