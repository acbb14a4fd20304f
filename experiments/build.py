"""The parts of a job built from its config: the policy module, the learner's config and
the sampler (`experiments.job.Job.setup` wires them together)."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from entr_jax.model import Decoder, ModelConfig, from_pretrained, save_pretrained
from experiments import multiprocess as mp
from experiments.config import RunConfig
from learners.learner import LearnerConfig
from learners.optim import OptimizerConfig
from samplers.jax_sampler import JaxSampler, JaxSamplerConfig

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
        from experiments.fleet import fleet_config
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
