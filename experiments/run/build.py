"""The parts of a run, built from its config in one place.

`prepare_task` reads the tokenizer and the task and checks them before anything is
written; `build` makes the rest and returns them as one frozen `Parts` record: the policy
module, the objective, the learner (with its checkpoint manager), the sampler, the
episodes (prompt stream and sampling), the advantage function and the rollout source of
``staleness.mode``. The RL loop (`experiments.run.loop.run_rl`) takes the parts it uses.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from entr_jax.advantages import compute_advantages
from entr_jax.assets import tiny_dir
from entr_jax.data import PromptBatchIterator, PromptDataConfig
from entr_jax.model import Decoder, ModelConfig, from_pretrained, save_pretrained
from entr_jax.tokenizer import Tokenizer
from experiments.run import checkpointing, preflight
from experiments.run import multiprocess as mp
from experiments.run.config import RunConfig
from experiments.run.episodes import Episodes
from experiments.run.objective import build_objective
from experiments.run.phases import PhaseClock
from experiments.run.rollouts import RolloutBatch
from experiments.run.rundir import RunDir
from experiments.run.sources import RolloutSource, SimulatedSource
from experiments.run.tasks import TaskBundle, build_task
from learners.checkpoint import CheckpointManager
from learners.learner import Learner, LearnerConfig
from learners.optim import OptimizerConfig
from samplers.jax_sampler import JaxSampler, JaxSamplerConfig

# advantages(batch) -> [rows] float32: this process's rows of a rollout batch
AdvantageFn = Callable[[RolloutBatch], np.ndarray]

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def policy(cfg: RunConfig, model_cfg: ModelConfig) -> tuple[Callable[[], Any], Any]:
    """``(module_fn, weights)``: a function building the `entr_jax.model.Decoder` (random
    init of ``model.init_seed``), and ``model.path``'s weights (`nnx.Param` state), or
    None without a path."""
    spec = cfg.model
    dtype, pdtype = DTYPES[spec.dtype], DTYPES[spec.param_dtype]
    seed = spec.init_seed

    def module_fn():
        return Decoder(model_cfg, rngs=nnx.Rngs(seed), dtype=dtype, param_dtype=pdtype,
                       remat=spec.remat, attention=spec.attention, scan_layers=spec.scan_layers)

    weights = None
    if spec.path:
        loaded = from_pretrained(spec.path, dtype=dtype, param_dtype=pdtype,
                                 remat=spec.remat, attention=spec.attention,
                                 scan_layers=spec.scan_layers)
        weights = nnx.split(loaded, nnx.Param, ...)[1]
    return module_fn, weights


def learner_config(cfg: RunConfig, optimizer: OptimizerConfig, pad_id: int,
                   max_length: int | None = None) -> LearnerConfig:
    """The learner's config: ``learner.*`` knobs, the sampling filters the learner must
    score with, the run's seed."""
    return cfg.learner.build(optimizer=optimizer, sampling=cfg.sampling, pad_id=pad_id,
                             seed=cfg.seed, max_length=max_length)


def sampler(cfg: RunConfig, learner: Any, share: mp.Share, weights: Any,
            export_dir: str) -> Any:
    """The rollout sampler: an SGLang fleet (``sampler.kind=sglang``; new weights are
    exported under ``export_dir``) or the embedded `samplers.jax_sampler.JaxSampler`
    serving ``weights`` (a copy of the learner's starting weights: the learner's own
    buffers are donated by its first update) as version 0."""
    if cfg.sampler.kind == "sglang":
        from experiments.run.fleet import fleet_config
        from samplers.sglang_fleet import SGLangFleet

        graphdef = learner.state.graphdef

        def export(weights, path):
            save_pretrained(nnx.merge(graphdef, weights), path)

        if share.count > 1:  # every process exports its own copy for its fleet client
            export_dir = f"{export_dir}/process_{share.index}"
        return SGLangFleet(fleet_config(
            cfg, vocab_size=learner.state.model().config.vocab_size,
            export_dir=export_dir, export_fn=export))
    rows = cfg.task.prompts_per_step * cfg.task.samples_per_prompt // share.count
    graphdef, _ = nnx.split(mp.local_model(learner.state))
    return JaxSampler(
        nnx.merge(graphdef, weights), version=0,
        config=JaxSamplerConfig(max_batch_size=min(cfg.sampler.max_batch_size, rows),
                                min_prompt_bucket=cfg.sampler.min_prompt_bucket,
                                dtype=cfg.model.sampler_dtype,
                                logit_noise_std=cfg.sampler.logit_noise_std,
                                weight_quant=cfg.sampler.weight_quant,
                                recompute_kv_on_swap=cfg.sampler.recompute_kv_on_swap,
                                scan_layers=cfg.sampler.scan_layers,
                                num_devices=(len(jax.local_devices())
                                             if cfg.sampler.num_devices == -1
                                             else cfg.sampler.num_devices)),
    )


@dataclasses.dataclass(frozen=True)
class Prepared:
    """The tokenizer and the task of a run, read and checked (`prepare_task`)."""

    tokenizer: Tokenizer
    task: TaskBundle


def prepare_task(cfg: RunConfig, model_cfg: ModelConfig) -> Prepared:
    """Tokenizer and task, checked (`preflight.check_task`) before anything is written."""
    tokenizer = Tokenizer.from_pretrained(cfg.model.path or str(tiny_dir()))
    task = build_task(cfg.task, cfg.verifier, data_dir=cfg.data.dir)
    preflight.check_task(cfg, task, tokenizer, model_cfg,
                         max_prompt_len=(JaxSamplerConfig().max_prompt_len
                                         if cfg.sampler.kind == "jax" else None))
    return Prepared(tokenizer, task)


@dataclasses.dataclass(frozen=True)
class Parts:
    """Everything a run is made of (`build`).

    Attributes:
      cfg: the run's config.
      share: this process's share of every global batch (`experiments.run.multiprocess`).
      tokenizer, task: `prepare_task`'s.
      module_fn: builds the policy module (`policy`).
      objective: the loss (`experiments.run.objective.build_objective`).
      learner: the `learners.learner.Learner` (its checkpoint manager verifies a restore
        with `experiments.run.checkpointing.verify`).
      sampler: the rollout sampler (`sampler`).
      episodes: prompts to trajectories (`experiments.run.episodes.Episodes`).
      advantages: this process's advantages of a rollout batch (`advantage_fn`).
      source: the rollout source of ``staleness.mode`` (`rollout_source`), holding no
        state yet: publish version 0 or load a checkpoint's state into it.
    """

    cfg: RunConfig
    share: mp.Share
    tokenizer: Tokenizer
    task: TaskBundle
    module_fn: Callable[[], Any]
    objective: Any
    learner: Learner
    sampler: Any
    episodes: Episodes
    advantages: AdvantageFn
    source: RolloutSource

    def published(self) -> Any:
        """The learner's current weights as this process's copy (`mp.process_local`)."""
        return mp.process_local(self.learner.published_weights())


def advantage_fn(cfg: RunConfig, share: mp.Share) -> AdvantageFn:
    """Advantages of this process's rows of a batch, computed from every process's
    rewards (``advantages.*``, groups of ``task.samples_per_prompt``)."""
    t = cfg.task

    def advantages(batch: RolloutBatch) -> np.ndarray:
        (rewards,) = mp.concat([float(tr.reward) for tr in batch.trajectories])
        rewards = np.array(rewards, np.float32)
        adv = compute_advantages(rewards.reshape(t.prompts_per_step, t.samples_per_prompt),
                                 cfg.advantages)
        rows = len(batch.trajectories)
        return np.asarray(adv, np.float32).reshape(-1)[share.index * rows:][:rows]

    return advantages


def rollout_source(cfg: RunConfig, sampler: Any, episodes: Episodes, learner: Learner,
                   clock: PhaseClock) -> RolloutSource:
    """The rollout source of ``staleness.mode``: `experiments.run.async_source.AsyncSource`
    for ``async``, else `experiments.run.sources.SimulatedSource` with the decomposition
    option on (tokens scored at their own versions every ``token_samples_every`` batches;
    in ``async`` mode the versions a batch used may have left the ring before it is
    consumed, so its token samples have no ``logp_version``)."""
    if cfg.staleness.mode == "async":
        from experiments.run.async_source import AsyncSource

        return AsyncSource(cfg.staleness, cfg.rl_steps, sampler, episodes.train_batch,
                           add_time=clock.add)
    return SimulatedSource(cfg.staleness, cfg.rl_steps, sampler, episodes.train_batch,
                           scorer=learner, score_every=cfg.token_samples_every,
                           add_time=clock.add)


def build(cfg: RunConfig, run: RunDir, prepared: Prepared, model_cfg: ModelConfig,
          clock: PhaseClock) -> Parts:
    """Build the parts of ``cfg``'s run in ``run`` (module docstring).

    Raises:
      experiments.run.errors.RunError: ``task.prompts_per_step`` or ``sft.batch_size`` does
        not split over the processes.
    """
    share = mp.Share.current()
    prompt_indices = share.chunk_indices(
        cfg.task.prompts_per_step, cfg.learner.minibatches, "task.prompts_per_step",
        "learner.minibatches")
    if cfg.sft.steps > 0:
        share.bounds(cfg.sft.batch_size, "sft.batch_size")
    tokenizer, task = prepared.tokenizer, prepared.task
    module_fn, weights = policy(cfg, model_cfg)
    objective = build_objective(cfg)
    data = PromptBatchIterator(
        task.train, PromptDataConfig(batch_size=cfg.task.prompts_per_step, seed=cfg.seed))
    episodes = Episodes(cfg, tokenizer, task, data, prompt_indices)
    learner = Learner(
        module_fn,
        learner_config(cfg, cfg.optim, tokenizer.pad_token_id),
        objective=objective,
        checkpoint=CheckpointManager(
            run.checkpoint_dir, max_to_keep=cfg.checkpoint.keep,
            log_file=run / "logs" / "checkpoint.log",
            verify=lambda step, restored: checkpointing.verify(
                run, cfg, restored, learner.published_weights(), data)),
        params=weights,  # model.path's weights: no random init to replace
    )
    del weights
    published = mp.process_local(learner.published_weights())
    smp = sampler(cfg, learner, share, published,
                  cfg.sampler.export_dir or str(run / "exports"))
    del published
    return Parts(cfg=cfg, share=share, tokenizer=tokenizer, task=task, module_fn=module_fn,
                 objective=objective, learner=learner, sampler=smp, episodes=episodes,
                 advantages=advantage_fn(cfg, share),
                 source=rollout_source(cfg, smp, episodes, learner, clock))
