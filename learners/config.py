"""The learner's configuration: the knobs a run sets (`LearnerOptions`, which
`experiments.run.config.LearnerSpec` is with the run's field prefix) and the whole
`LearnerConfig` the `learners.learner.Learner` is built from. Each knob has one name, one
default and one check, here."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from entr_jax.logprobs import CHUNK_SIZE
from entr_jax.sampling_filter import check_filter
from entr_jax.sharding import MeshConfig
from learners.optim import OptimizerConfig

__all__ = ["LearnerConfig", "LearnerOptions"]


@dataclasses.dataclass(frozen=True)
class LearnerOptions:
    """How the learner cuts a rollout batch into updates, where it runs, and when it stops.

    Attributes:
      microbatches: gradient-accumulation microbatches per optimizer update (>= 1); a
        memory knob: loss, gradient and metrics do not depend on it (the normalisers and
        batch-level statistics are those of the whole optimizer batch).
      minibatches: optimizer updates per pass over a rollout batch (>= 1; PPO's
        mini-batches, verl ``ppo_mini_batch_size``, AReaL ``ppo_n_minibatches``).
      epochs: passes over each rollout batch (>= 1; PPO epochs, verl ``ppo_epochs``,
        tunix ``num_iterations``). ``logp_prox`` is computed once per rollout batch before
        the first update, so with more than one update per rollout batch decoupled
        objectives see ``pi != prox``.
      mesh: device mesh shape (``data``, ``fsdp``, ``tensor``).
      max_bad_steps: stop after this many skipped (non-finite) steps in a row (>= 1;
        `learners.learner.NonFiniteGuard`).
      logprob_chunk: sequence chunk of the memory-lean log-prob computation (>= 1;
        `entr_jax.logprobs.chunked_logprobs_entropy`'s ``chunk_size``).

    Raises:
      ValueError: a count below 1, named with ``FIELD_PREFIX`` (``LearnerConfig.`` here,
        ``learner.`` for a run's `experiments.run.config.LearnerSpec`).
    """

    FIELD_PREFIX: ClassVar[str] = "LearnerConfig."

    microbatches: int = 1
    minibatches: int = 1
    epochs: int = 1
    mesh: MeshConfig = MeshConfig()
    max_bad_steps: int = 5
    logprob_chunk: int = CHUNK_SIZE

    def __post_init__(self):
        for name in ("microbatches", "minibatches", "epochs", "max_bad_steps", "logprob_chunk"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{self.FIELD_PREFIX}{name} must be >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class LearnerConfig(LearnerOptions):
    """Learner settings: `LearnerOptions` plus what the run fills in.

    Attributes:
      optimizer: AdamW / clipping / schedule.
      temperature: sampling temperature the behaviour log-probs were taken at (> 0).
      top_k, top_p, min_p: the sampler's filters (-1 / 1 / 0 = off, as in
        `entr_jax.interfaces.SamplingParams`); RL steps and `make_logprob_fn` score the
        same filtered, renormalised distribution the sampler drew from
        (`entr_jax.sampling_filter`), SFT steps the unfiltered tempered softmax.
      pad_id: padding token id (>= 0).
      min_length, max_length: sequence-length bucketing bounds (`bucket_length`;
        ``min_length`` >= 1).
      seed: seed of the parameter init and the state RNG key.
    """

    optimizer: OptimizerConfig = OptimizerConfig()
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    pad_id: int = 0
    min_length: int = 16
    max_length: int | None = None
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.min_length < 1:
            raise ValueError(f"LearnerConfig.min_length must be >= 1, got {self.min_length!r}")
        if not self.temperature > 0:
            raise ValueError(f"LearnerConfig.temperature must be > 0, got {self.temperature}")
        check_filter(self.top_k, self.top_p, self.min_p, prefix="LearnerConfig.")
        if self.pad_id < 0:
            raise ValueError(f"LearnerConfig.pad_id must be >= 0, got {self.pad_id}")
