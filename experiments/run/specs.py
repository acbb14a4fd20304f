"""The run configuration's sections: one frozen, typed dataclass per concern (the model,
the data, the task, the SFT warm start, the learner, checkpoints; the sampler, its fleet
and sampling are in `experiments.run.sampler_specs`), each validated when built with errors
that name the field (``task.eval_examples must be >= 0, got -1``).
`experiments.run.config.RunConfig` holds them."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

from learners.config import LearnerConfig, LearnerOptions
from learners.optim import OptimizerConfig


def require(ok: bool, field: str, value: Any, what: str) -> None:
    """Raise ``ValueError("<field> must be <what>, got <value>")`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{field} must be {what}, got {value!r}")


def variant(default: Any, *values: str) -> Any:
    """A field that only the variants ``values`` of its section read (the section's
    ``VARIANT_FIELD`` selects one, e.g. ``task.name``): stated here, at the field, and
    read back by `experiments.run.config.variant_rules`, which refuses the field on the
    command line for another variant."""
    return dataclasses.field(default=default, metadata={"variants": values})


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Which policy to train.

    Attributes:
      path: local Hugging Face directory (config.json, safetensors, tokenizer files);
        empty = the embedded tiny default (``entr_jax/assets/tiny``, weights from
        ``init_seed``).
      init_seed: seed of the random initialisation of the tiny default.
      dtype: learner compute dtype.
      param_dtype: parameter storage dtype.
      sampler_dtype: compute dtype of the embedded sampler (bfloat16 against a float32
        learner is a real train/inference mismatch).
      sha256: the expected sha256 of ``path``'s weights (hex; the ``*.safetensors`` files
        hashed one after the other in name order, so for one file it is
        ``sha256sum model.safetensors``); a run refuses other weights before any work.
        Freezes a warm start in an experiment's spec. Empty = not checked.
      remat: the learner's rematerialisation of each decoder layer in the backward pass
        (`entr_jax.model.layers.REMAT_POLICIES`): ``dots`` (default) keeps the weight
        matmuls' outputs and recomputes the rest, ``full`` recomputes the whole layer,
        ``none`` keeps everything. Same values; memory, step and compile time differ
        (`benchmarks/remat.py`, `docs/performance.md`).
      attention: the learner's attention implementation
        (`entr_jax.model.attention_impl`): ``auto`` (cuDNN on GPU in bf16, Pallas splash
        on TPU, the blocked XLA form otherwise), ``xla_blocked``, ``xla``, ``cudnn``,
        ``splash``. The same values to float rounding.
      scan_layers: the learner's decoder layers stacked and applied by ``lax.scan``
        (`entr_jax.model.Decoder`'s ``scan_layers``): a program of one layer, so a deep
        model compiles in a fraction of the time; False applies them one after the
        other, which is cheaper per step for a shallow model (the embedded 4-layer model:
        `benchmarks/quickstart_step.py`, `docs/performance.md`). The same values to float
        rounding; a checkpoint restores only into the layout it was saved from.
    """

    path: str = ""
    init_seed: int = 0
    dtype: Literal["float32", "bfloat16"] = "float32"
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    sampler_dtype: Literal["float32", "bfloat16"] = "float32"
    sha256: str = ""
    remat: Literal["none", "dots", "full"] = "dots"
    attention: Literal["auto", "xla_blocked", "xla", "cudnn", "splash"] = "auto"
    scan_layers: bool = True

    def __post_init__(self):
        require(not self.sha256 or (len(self.sha256) == 64 and all(
            c in "0123456789abcdef" for c in self.sha256)), "model.sha256", self.sha256,
            "64 lower-case hex digits (sha256sum's output), or empty")
        require(not self.sha256 or bool(self.path), "model.sha256", self.sha256,
                 "empty without model.path (the embedded default's weights are initialised "
                 "from model.init_seed, not read)")
        require(self.remat in ("none", "dots", "full"), "model.remat", self.remat,
                 "one of 'none', 'dots', 'full'")
        require(self.attention in ("auto", "xla_blocked", "xla", "cudnn", "splash"),
                 "model.attention", self.attention,
                 "one of 'auto', 'xla_blocked', 'xla', 'cudnn', 'splash'")


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """Where data files are found (`entr_jax.data.files.locate`).

    Attributes:
      dir: a data folder laid out as ``<dataset>/<split>.jsonl`` (``gsm8k/test.jsonl``,
        ``math500/test.jsonl``, ...), looked up first; empty = ``$ENTR_DATA_DIR`` when set.
        Files not found there come from the package (GSM8K train), the user cache, or a
        checksum-checked download of the pinned upstream (``entr-data fetch`` ahead of
        time, e.g. ``entr-data fetch --dir DIR`` for nodes without internet).
    """

    dir: str = ""


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What the policy is trained and evaluated on (data files: `DataSpec`).

    Attributes:
      name: ``arithmetic`` (the calculator annotations of GSM8K's training solutions,
        integer answers scored exactly, `entr_jax.tasks.exact.ExactNumberScorer`),
        ``chain_sum`` (chains of ``+``/``-`` answered with one worked step per line,
        long responses for the stress regime; `entr_jax.data.chains`),
        ``gsm8k`` (single turn), ``gsm8k_calculator`` (multi-turn with a calculator tool),
        ``math`` (MATH-style, evaluated on MATH-500/AIME24/AMC23), ``search`` (multi-hop
        questions over a local BM25 corpus).
      template: ``plain`` for base models, ``chat`` for instruct models.
      prompts_per_step: P prompts per rollout batch.
      samples_per_prompt: G samples per prompt (the GRPO group; >= 2, since every
        advantage estimator is group-relative and a group of one has advantage 0).
      max_new_tokens: generation budget per turn.
      max_turns: turns per episode (multi-turn tasks).
      max_total_tokens: bound on the response tokens of one episode, policy and
        environment tokens together, all turns (the prompt does not count;
        `entr_jax.tasks.rollout`); >= ``max_new_tokens``. Checked against the model's
        context (``max_position_embeddings``) with the task's longest prompt before any work.
      eval_examples: held-out examples per evaluation benchmark (0 = all).
      eval_samples: k samples per example for avg@k / pass@k (sampled evaluation).
      arithmetic_max_chars: ``arithmetic`` only: longest expression kept (characters,
        spaces removed; `entr_jax.data.sources.gsm8k_arithmetic`).
      arithmetic_ops: ``arithmetic`` only: keep expressions whose operators are all in
        this set (e.g. ``"+-"`` for sums and differences).
      chain_terms_min: ``chain_sum`` only: terms per chain (each problem
        draws one count in this range; `entr_jax.data.chains`).
      chain_terms_max: ``chain_sum`` only: terms per chain (each problem
        draws one count in this range; `entr_jax.data.chains`).
      chain_digits_min: ``chain_sum`` only: digits per term.
      chain_digits_max: ``chain_sum`` only: digits per term.
      chain_train_size: ``chain_sum`` only: training problems generated (held-out
        problems come from another seed; ``eval_examples`` of them are used, 0 = 1000).
      chain_style: ``chain_sum`` only: ``reduce`` (each line the new total and the rest
        of the chain) or ``running`` (each line ``total op term = new total``).
      chain_min_solution_chars: ``chain_sum`` only: drop problems whose worked solution
        is shorter (with the tiny tokenizer, ``c`` characters are ``c - 2`` response
        tokens with the EOS, ``c - 3`` for a negative answer (``" -"`` is one token): 67
        guarantees >= 64).
    """

    VARIANT_FIELD: ClassVar[str] = "name"  # arithmetic_* and chain_* belong to their task

    name: Literal["arithmetic", "chain_sum", "gsm8k", "gsm8k_calculator", "math",
                  "search"] = "arithmetic"
    template: Literal["plain", "chat"] = "plain"
    prompts_per_step: int = 16
    samples_per_prompt: int = 8
    max_new_tokens: int = 16
    max_turns: int = 1
    max_total_tokens: int = 256
    eval_examples: int = 256
    eval_samples: int = 4
    arithmetic_max_chars: int = variant(30, "arithmetic")
    arithmetic_ops: str = variant("+-*/", "arithmetic")
    chain_terms_min: int = variant(9, "chain_sum")
    chain_terms_max: int = variant(9, "chain_sum")
    chain_digits_min: int = variant(2, "chain_sum")
    chain_digits_max: int = variant(2, "chain_sum")
    chain_train_size: int = variant(20000, "chain_sum")
    chain_style: Literal["reduce", "running"] = variant("reduce", "chain_sum")
    chain_min_solution_chars: int = variant(0, "chain_sum")

    def __post_init__(self):
        for f in ("arithmetic_max_chars", "prompts_per_step", "samples_per_prompt", "max_new_tokens", "max_turns",
                  "max_total_tokens", "eval_samples"):
            require(getattr(self, f) >= 1, f"task.{f}", getattr(self, f), ">= 1")
        require(self.eval_examples >= 0, "task.eval_examples", self.eval_examples, ">= 0")
        require(self.max_total_tokens >= self.max_new_tokens, "task.max_total_tokens",
                 self.max_total_tokens, f">= task.max_new_tokens ({self.max_new_tokens}); the "
                 "episode budget counts response tokens only, so a smaller one would silently "
                 "cut every generation")
        require(bool(self.arithmetic_ops) and set(self.arithmetic_ops) <= set("+-*/"),
                 "task.arithmetic_ops", self.arithmetic_ops, "a non-empty subset of '+-*/'")
        require(self.chain_terms_min >= 2, "task.chain_terms_min", self.chain_terms_min, ">= 2")
        require(self.chain_terms_max >= self.chain_terms_min, "task.chain_terms_max",
                 self.chain_terms_max, f">= task.chain_terms_min ({self.chain_terms_min})")
        require(self.chain_digits_min >= 1, "task.chain_digits_min", self.chain_digits_min, ">= 1")
        require(self.chain_digits_max >= self.chain_digits_min, "task.chain_digits_max",
                 self.chain_digits_max, f">= task.chain_digits_min ({self.chain_digits_min})")
        require(self.chain_train_size >= 1, "task.chain_train_size", self.chain_train_size, ">= 1")
        require(self.chain_style in ("reduce", "running"), "task.chain_style", self.chain_style,
                 "'reduce' or 'running'")
        require(self.chain_min_solution_chars >= 0, "task.chain_min_solution_chars",
                 self.chain_min_solution_chars, ">= 0")


@dataclasses.dataclass(frozen=True)
class SFTSpec:
    """Supervised warm start on demonstrations before RL (0 steps disables it).

    Attributes:
      steps: optimizer steps of the supervised pass (AdamW, no weight decay, global-norm
        clipping at 1); 0 = no warm start.
      batch_size: demonstrations per step.
      learning_rate: peak learning rate of the supervised pass.
      warmup_steps: linear warmup steps from 0 to ``learning_rate``.
      schedule: ``"constant"`` keeps ``learning_rate`` after the warmup; ``"cosine"``
        decays it to 0 over the ``steps`` (warmup included; `learners.optim.make_schedule`).
      save_model: write the warm-started policy to ``<run_dir>/sft_model`` in the Hugging
        Face layout (config, safetensors, tokenizer), so later runs can start from it with
        ``--model.path <run_dir>/sft_model --sft.steps 0``.
    """

    steps: int = 0
    batch_size: int = 64
    learning_rate: float = 1e-3
    warmup_steps: int = 10
    schedule: Literal["constant", "cosine"] = "constant"
    save_model: bool = True

    def __post_init__(self):
        require(self.steps >= 0, "sft.steps", self.steps, ">= 0")
        require(self.batch_size >= 1, "sft.batch_size", self.batch_size, ">= 1")
        require(self.learning_rate > 0, "sft.learning_rate", self.learning_rate, "> 0")
        require(self.warmup_steps >= 0, "sft.warmup_steps", self.warmup_steps, ">= 0")
        require(self.schedule in ("constant", "cosine"), "sft.schedule", self.schedule,
                 "'constant' or 'cosine'")
        require(self.schedule == "constant" or self.steps == 0
                 or self.steps > self.warmup_steps, "sft.steps", self.steps,
                 f"> sft.warmup_steps ({self.warmup_steps}) with sft.schedule 'cosine'")

    def optimizer(self) -> OptimizerConfig:
        """The warm start's optimizer: AdamW at ``learning_rate`` after ``warmup_steps``,
        constant or cosine to 0 at ``steps``, no weight decay, clipping at global norm 1."""
        return OptimizerConfig(learning_rate=self.learning_rate, warmup_steps=self.warmup_steps,
                               schedule=self.schedule, total_steps=self.steps,
                               weight_decay=0.0, max_grad_norm=1.0)


# The fields, their defaults and checks are learners.config.LearnerOptions's (errors name
# learner.<field>); `build` makes the run's learners.config.LearnerConfig. The docstring is
# the --help text.
@dataclasses.dataclass(frozen=True)
class LearnerSpec(LearnerOptions):
    """Learner step layout.

    Attributes:
      microbatches: gradient-accumulation microbatches per optimizer update, a memory
        knob: loss, gradients and metrics are the same for any value (the normalisers and
        batch-level statistics are those of the whole optimizer batch).
      minibatches: optimizer updates per pass over a rollout batch (PPO mini-batches; at
        most the rollout batch's rows, ``task.prompts_per_step * task.samples_per_prompt``;
        with N processes ``task.prompts_per_step`` must be divisible by N times it, checked
        when the job starts: `experiments.run.multiprocess.Share.chunk_indices`).
      epochs: passes over each rollout batch (PPO epochs). With ``minibatches * epochs > 1``
        the proximal policy of decoupled objectives (``logp_prox``, computed once per
        rollout batch before its first update) differs from the current one.
      mesh: mesh shape (``data``, ``fsdp``, ``tensor``; ``data = -1`` takes the devices
        left over). A single device is the 1x1x1 mesh.
      max_bad_steps: stop after this many consecutive non-finite steps.
      logprob_chunk: sequence chunk of the memory-lean log-prob computation.
    """

    FIELD_PREFIX: ClassVar[str] = "learner."

    def build(self, *, optimizer: OptimizerConfig, sampling: Any, pad_id: int,
              seed: int, max_length: int | None = None) -> LearnerConfig:
        """The learner's configuration: these options, the optimizer, the sampling
        distribution the learner scores (``sampling``, the run's
        `experiments.run.sampler_specs.SamplingSpec`: its temperature and filters), the
        tokenizer's ``pad_id``, the run's ``seed`` and the longest sequence
        (``max_length``, None = unbounded)."""
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(LearnerOptions)}
        return LearnerConfig(**options, optimizer=optimizer, temperature=sampling.temperature,
                             top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p,
                             pad_id=pad_id, max_length=max_length, seed=seed)


@dataclasses.dataclass(frozen=True)
class CheckpointSpec:
    """Checkpointing of the RL steps and of the supervised warm start.

    Attributes:
      every: an RL checkpoint every this many RL steps and at the end (0 = only at the end).
      sft_every: a warm-start checkpoint every this many SFT steps and at its end (0 =
        never: a resume before the first RL checkpoint redoes the warm start).
      keep: how many of the newest checkpoints of each kind are kept.
    """

    every: int = 10
    sft_every: int = 200
    keep: int = 3

    def __post_init__(self):
        require(self.every >= 0, "checkpoint.every", self.every, ">= 0")
        require(self.sft_every >= 0, "checkpoint.sft_every", self.sft_every, ">= 0")
        require(self.keep >= 1, "checkpoint.keep", self.keep, ">= 1")
