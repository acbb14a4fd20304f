"""The RL job: policy + sampler + task + staleness queue + learner, wired together.

Phases of a fresh run: evaluation of the initial policy (``eval/init.json``; read instead
from ``shared_eval_dir`` when another run stored the same one, `experiments.shared_eval`),
the optional supervised warm start (``sft.jsonl``), evaluation before RL (``eval/before_rl.json``),
``rl_steps`` learner steps (each consumes one rollout batch: ``learner.minibatches x
learner.epochs`` optimizer updates and one new policy version, ``docs/learner.md``),
evaluation after RL (``eval/after_rl.json``) and ``summary.json``. Files are described in
`experiments.rundir`; when the objective has a KL term, the frozen reference policy (the
policy RL starts from) is ``reference.npz`` (`experiments.reference`).

Staleness modes (`entr_jax.staleness`):

* ``sync`` / ``simulated``: one thread. Before learner step ``n`` the loop generates, with
  the current weights, every batch the delay line says is due, replaying intra-trajectory
  switches from the parameter ring; then step ``n`` consumes batch ``n``. Everything is a
  function of the config and seed, so two runs write identical ``metrics.jsonl`` files.
* ``async``: `experiments.async_loop` runs the sampler in a thread that overlaps the
  learner; staleness is measured.

A checkpoint (every ``checkpoint.every`` steps and at the end) holds the learner state,
the data-iterator position, the delay line contents and the loop's bookkeeping; the
parameter ring goes to ``ring/<step>.npz`` (written atomically; its size and versions
are stored in the checkpoint). ``--resume`` restores all of it and drops metric lines past
the checkpoint, so a killed run loses and repeats no batch; a checkpoint whose weights or
ring file cannot be read falls back to the next older one. What a resume may change is
decided by `experiments.resume`; bad input is refused before any work by
`experiments.preflight`.

With several processes (`learners.distributed`), each process generates its share of
every global batch and the checkpoint holds every process's data position and delay
line; what each knob means then is in `experiments.multiprocess`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import time
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from entr_jax.advantages import compute_advantages
from entr_jax.assets import tiny_dir
from entr_jax.data import PromptBatchIterator, PromptDataConfig
from entr_jax.evaluation import benchmark_metrics
from entr_jax.interfaces import SamplingParams
from entr_jax.model import Decoder, from_pretrained, save_pretrained
from entr_jax.staleness import DelayLine, ParamRing, full_lag_steps
from entr_jax.tasks.rollout import run_episodes
from entr_jax.tokenizer import Tokenizer
from experiments import preflight, reference, resume as resume_policy, shared_eval
from experiments import multiprocess as mp
from experiments import rollouts as ro
from experiments import state_io
from experiments.config import RunConfig
from experiments.decomposition import logp_at_token_version
from experiments.errors import RunError
from experiments.fleet import fleet_metrics
from experiments.objective import build_objective
from experiments.phases import PhaseClock
from experiments.rundir import RunDir
from experiments.tasks import TaskBundle, build_task, demo_trajectory
from learners.checkpoint import CheckpointManager
from learners.learner import Learner, LearnerConfig
from learners.logging import MetricsLogger, make_logger
from learners.optim import OptimizerConfig
from samplers.jax_sampler import JaxSampler, JaxSamplerConfig

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# metric keys that depend on wall-clock time; they go to timing.jsonl, not metrics.jsonl
_TIMING_PREFIXES = ("time/", "throughput/")


class RunExistsError(RunError, FileExistsError):
    """The run directory already holds a run and ``--resume`` was not given."""


def _split_timing(record: dict[str, Any]) -> tuple[dict, dict]:
    timing = {k: v for k, v in record.items() if k.startswith(_TIMING_PREFIXES)}
    return {k: v for k, v in record.items() if k not in timing}, timing


class Job:
    """One run of `RunConfig` (see the module docstring)."""

    def __init__(self, cfg: RunConfig, *, resume: bool = False, resume_override: bool = False,
                 show_progress: bool = True):
        """Check everything that can be checked before any work (run directory, resume
        policy, devices, model config); raises `experiments.errors.RunError` subclasses,
        `RunExistsError`."""
        self.cfg = cfg
        run_dir = cfg.run_dir or f"runs/{cfg.name}"
        preflight.check_run_dir(run_dir, "run_dir" if cfg.run_dir else "name")
        self.run = RunDir(run_dir)
        self.resume = resume
        self.show_progress = show_progress
        self.clock = PhaseClock()  # wall/CPU time per phase, compilation apart
        self.startup_s: float | None = None  # set by the command line (experiments.run)
        if not resume and self.run.holds_run():
            raise RunExistsError(
                f"{self.run.path} already holds a run: pass --resume to continue it, or "
                "choose another --run_dir"
            )
        self.plan = (resume_policy.plan_resume(self.run, cfg.to_json(), resume_override)
                     if resume else None)
        preflight.check_devices(cfg)
        if (note := preflight.lag_horizon(cfg)) is not None:
            warnings.warn(note, stacklevel=2)
        self.model_cfg = preflight.read_model_config(cfg.model.path or tiny_dir())
        preflight.check_weights_sha256(cfg)

    # ------------------------------------------------------------------ construction
    def _policy(self):
        spec = self.cfg.model
        model_cfg = self.model_cfg
        dtype, pdtype = _DTYPES[spec.dtype], _DTYPES[spec.param_dtype]
        seed = spec.init_seed

        def module_fn():
            return Decoder(model_cfg, rngs=nnx.Rngs(seed), dtype=dtype, param_dtype=pdtype,
                           remat=spec.remat, attention=spec.attention)

        weights = None
        if spec.path:
            loaded = from_pretrained(spec.path, dtype=dtype, param_dtype=pdtype,
                                     remat=spec.remat, attention=spec.attention)
            weights = nnx.split(loaded, nnx.Param, ...)[1]
        return module_fn, weights

    def _learner_config(self, optimizer: OptimizerConfig, pad_id: int,
                        max_length: int | None = None) -> LearnerConfig:
        return self.cfg.learner.build(optimizer=optimizer, sampling=self.cfg.sampling,
                                      pad_id=pad_id, seed=self.cfg.seed, max_length=max_length)

    def _sampling(self, batch_id: int, stream: int = 0, offset: int = 0,
                  **overrides) -> SamplingParams:
        s, t = self.cfg.sampling, self.cfg.task
        kw = dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                  max_new_tokens=t.max_new_tokens,
                  stop_token_ids=tuple(self.tokenizer.eos_token_ids),
                  seed=ro.sampling_seed(self.cfg.seed, batch_id, stream, offset))
        kw.update(overrides)
        return SamplingParams(**kw)

    def _episodes(self, sampler, examples, params, num_samples, group_ids=None):
        return run_episodes(sampler, self.tokenizer, self.task.env_factory, examples, params,
                            num_samples, self.task.rollout, group_ids)

    # ------------------------------------------------------------------ phases
    def evaluate(self, phase: str, weights: Any, version: int) -> dict[str, Any]:
        """avg@k / pass@k (sampled, k = ``task.eval_samples``) and greedy accuracy on every
        evaluation set; written to ``eval/<phase>.json``. With several processes each
        evaluates its share of the examples (`experiments.multiprocess`)."""
        with self.clock.phase("eval"):
            return self._evaluate(phase, weights, version)

    def _evaluate(self, phase: str, weights: Any, version: int) -> dict[str, Any]:
        self.sampler.update_weights(weights, version)
        k = self.cfg.task.eval_samples
        if self.show_progress:
            sizes = ", ".join(f"{n}: {len(e)}" for n, e in self.task.eval_sets.items())
            tqdm.write(f"evaluating ({phase}; {sizes} examples; greedy and {k} samples each)")
        out: dict[str, Any] = {"phase": phase, "version": version, "benchmarks": {}}
        for name, examples in self.task.eval_sets.items():
            # greedy: top-1 on the embedded sampler; SGLang refuses filters (its log-probs
            # would not describe the filtered distribution), so a near-zero temperature there
            argmax = (dict(temperature=1e-5) if self.cfg.sampler.kind == "sglang"
                      else dict(top_k=1, top_p=1.0, min_p=0.0))
            lo, hi = self.share.split(len(examples))  # this process's examples
            greedy, sampled = [], []
            if hi > lo:
                mine = examples[lo:hi]
                greedy = self._episodes(self.sampler, mine, self._sampling(0, 1, lo, **argmax), 1)
                sampled = self._episodes(self.sampler, mine, self._sampling(0, 2, lo), k)
                self.clock.count("eval_episodes", len(greedy) + len(sampled))
            greedy, flags = mp.concat([ro.is_correct(t) for t in greedy],
                                      [ro.is_correct(t) for t in sampled])
            per_example = [flags[i * k:(i + 1) * k] for i in range(len(examples))]
            ks = sorted({1, k})
            out["benchmarks"][name] = benchmark_metrics(per_example, ks=ks, greedy=greedy)
            out["benchmarks"][name].update(self._reference_logp(examples, weights))
        self.run.write_json(f"eval/{phase}.json", out)
        self._log_eval(out)
        return out

    def _reference_logp(self, examples: list[dict], weights: Any) -> dict[str, float]:
        """Teacher-forced log-likelihood of the examples' reference solutions under
        ``weights``: ``ref_logp`` (mean log-prob per reference token, nats; the tempered,
        filtered distribution the learner scores) and ``ref_tokens`` (their count); {} when
        the task has no reference solutions. No sampling: the same weights give the same
        value. Every process scores every example (a collective on equal shapes), in
        batches of the rollout batch's rows."""
        if self.task.reference_demos is None:
            return {}
        trajs = [demo_trajectory(d, self.tokenizer) for d in self.task.reference_demos(examples)]
        rows = max(1, self.cfg.task.prompts_per_step * self.cfg.task.samples_per_prompt
                   // self.share.count)
        total, count = 0.0, 0
        for i in range(0, len(trajs), rows):
            scored = self.learner.token_logprobs(trajs[i:i + rows], weights=weights)
            mask = scored["loss_mask"].astype(bool)
            total += float(np.sum(scored["logp_pi"][mask], dtype=np.float64))
            count += int(mask.sum())
        return {"ref_logp": total / max(count, 1), "ref_tokens": count}

    def _replay_eval(self, out: dict[str, Any]) -> None:
        """``eval/<phase>.json`` and its TensorBoard scalars from an evaluation already
        computed (the initial one as the one before RL, or one `experiments.shared_eval`
        stored)."""
        self.run.write_json(f"eval/{out['phase']}.json", out)
        self._log_eval(out)

    def _log_eval(self, out: dict[str, Any]) -> None:
        """TensorBoard ``eval/<phase>/<benchmark>/{avg_at_k, pass_at_k, greedy}`` at the RL
        step (the policy version) the phase evaluates (TensorBoard tags cannot hold "@")."""
        k = str(self.cfg.task.eval_samples)
        scalars = {f"eval/{out['phase']}/{bench}/{key.replace('@n', '@' + k).replace('@', '_at_')}":
                   value for bench, m in out["benchmarks"].items() for key, value in m.items()
                   if key not in ("num_examples", "num_samples", "ref_tokens")}
        self.logger.log(out["version"], None, scalars)

    def warm_start(self, module_fn, params) -> Any:
        """Supervised warm start on the task's demonstrations, from ``params`` (the policy's
        weights: ``model.path``'s, or the random init of ``model.init_seed``; they are
        trained in place, so the caller must not use them afterwards); returns the params."""
        with self.clock.phase("sft"):
            return self._warm_start(module_fn, params)

    def _warm_start(self, module_fn, params) -> Any:
        sft, demos = self.cfg.sft, self.task.demos
        if not demos:
            raise ValueError(f"sft.steps > 0 but task {self.cfg.task.name!r} has no demonstrations")
        opt = sft.optimizer()
        trajs = [demo_trajectory(d, self.tokenizer) for d in demos]
        # every demonstration is known: batches are padded to at most the longest one, not
        # to the next power of two (the quickstart's: 11 tokens, not 16)
        longest = max(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
        learner = Learner(module_fn, self._learner_config(opt, self.tokenizer.pad_token_id,
                                                          max_length=longest), params=params)
        rng = np.random.default_rng([self.cfg.seed, 3])
        order = np.concatenate([rng.permutation(len(trajs))
                                for _ in range(sft.steps * sft.batch_size // len(trajs) + 1)])
        records = []
        bar = tqdm(range(sft.steps), desc="SFT warm start", disable=not self.show_progress,
                   dynamic_ncols=True)
        for step in bar:
            idx = order[step * sft.batch_size:(step + 1) * sft.batch_size]
            m = learner.sft_on([trajs[i] for i in self.share.take(idx, "sft.batch_size")])
            self.clock.count("sft_steps")
            if m is not None:
                records.append({"step": step - 1, "loss": m["loss"]})
                bar.set_postfix(loss=f"{m['loss']:.3f}")
        m = learner.flush()
        records.append({"step": sft.steps - 1, "loss": m["loss"]})
        # its own TensorBoard run (tb/sft): a resume purges RL steps of tb/, not SFT's
        sft_tb = MetricsLogger(self.run / "tb" / "sft", jsonl=False, purge_step=0)
        for r in records:
            self.run.append_jsonl("sft.jsonl", r)
            sft_tb.log(r["step"], None, {"sft/loss": r["loss"]})
        sft_tb.close()
        params = learner.state.params
        learner.close()
        return params

    def export(self, path) -> None:
        """Write the current policy in the Hugging Face layout, with the tokenizer files
        (every process calls it; process 0 writes)."""
        model = mp.local_model(self.learner.state)
        if not self.run.writer:
            return
        save_pretrained(model, path)
        source = pathlib.Path(self.cfg.model.path or tiny_dir())
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (source / name).exists():
                shutil.copy(source / name, pathlib.Path(path) / name)

    # ------------------------------------------------------------------ main
    def prepare_task(self) -> None:
        """Tokenizer and task, checked (`preflight.check_task`) before anything is written."""
        cfg = self.cfg
        self.tokenizer = Tokenizer.from_pretrained(cfg.model.path or str(tiny_dir()))
        self.task: TaskBundle = build_task(cfg.task, cfg.verifier, data_dir=cfg.data.dir)
        preflight.check_task(cfg, self.task, self.tokenizer, self.model_cfg,
                             max_prompt_len=(JaxSamplerConfig().max_prompt_len
                                             if cfg.sampler.kind == "jax" else None))

    def setup(self) -> None:
        cfg = self.cfg
        self.share = mp.Share.current()
        self.prompt_indices = self.share.chunk_indices(
            cfg.task.prompts_per_step, cfg.learner.minibatches, "task.prompts_per_step",
            "learner.minibatches")
        self.prompt_offset = self.prompt_indices[0]
        if cfg.sft.steps > 0:
            self.share.bounds(cfg.sft.batch_size, "sft.batch_size")
        if not hasattr(self, "task"):
            self.prepare_task()
        self.module_fn, weights = self._policy()
        self.objective = build_objective(cfg)
        self.learner = Learner(
            self.module_fn,
            self._learner_config(cfg.optim, self.tokenizer.pad_token_id),
            objective=self.objective,
            checkpoint=CheckpointManager(self.run.checkpoint_dir, max_to_keep=cfg.checkpoint.keep,
                                         log_file=self.run / "logs" / "checkpoint.log",
                                         verify=self._restore_ring),
            params=weights,  # model.path's weights: no random init to replace
        )
        del weights
        self.sampler = self._make_sampler()
        self.data = PromptBatchIterator(
            self.task.train, PromptDataConfig(batch_size=cfg.task.prompts_per_step, seed=cfg.seed))
        self.line = DelayLine(cfg.staleness)
        self.ring: ParamRing = ParamRing(cfg.staleness.ring_size)
        self._pending: list[dict[str, Any]] = []  # loop records awaiting learner metrics

    def _make_sampler(self):
        cfg = self.cfg
        if cfg.sampler.kind == "sglang":
            from experiments.fleet import fleet_config
            from samplers.sglang_fleet import SGLangFleet

            graphdef = self.learner.state.graphdef

            def export(weights, path):
                save_pretrained(nnx.merge(graphdef, weights), path)

            export_dir = cfg.sampler.export_dir or str(self.run / "exports")
            if self.share.count > 1:  # every process exports its own copy for its fleet client
                export_dir = f"{export_dir}/process_{self.share.index}"
            return SGLangFleet(fleet_config(
                cfg, vocab_size=self.learner.state.model().config.vocab_size,
                export_dir=export_dir, export_fn=export))
        rows = cfg.task.prompts_per_step * cfg.task.samples_per_prompt // self.share.count
        # a copy of the starting weights: the learner's own buffers are donated by its
        # first update, and the sampler serves version 0 until it is given another
        graphdef, _ = nnx.split(mp.local_model(self.learner.state))
        return JaxSampler(
            nnx.merge(graphdef, self.published()), version=0,
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

    def generate(self, batch_id: int) -> ro.RolloutBatch:
        """Generate the rollout batch ``batch_id`` with the newest weights in the ring (and
        the intra-trajectory switches the staleness plan gives it)."""
        versions, steps = ro.intra_versions(self.cfg.staleness, batch_id, self.ring)
        batch = ro.generate_batch(
            self.sampler, self._episodes, batch_id, self.local_prompts(), versions, steps,
            self.ring, self._sampling(batch_id, offset=self.prompt_offset),
            self.cfg.task.samples_per_prompt, self.group_ids(batch_id))
        self.clock.count("rl_episodes", len(batch.trajectories))
        if self.decomposes(batch_id):  # while the ring still holds every version it used
            batch.logp_version = logp_at_token_version(self.learner, batch.trajectories,
                                                       self.ring, versions)
        return batch

    def decomposes(self, batch_id: int) -> bool:
        """Whether batch ``batch_id`` gets token samples with the mismatch/staleness
        decomposition: every ``token_samples_every`` steps, in ``sync`` and ``simulated``
        mode (in ``async`` mode the versions a batch used may have left the ring before
        it is consumed; its token samples have no ``logp_version``)."""
        every = self.cfg.token_samples_every
        return bool(every) and batch_id % every == 0 and self.cfg.staleness.mode != "async"

    def local_prompts(self) -> list[dict]:
        """This process's share of the next global prompt batch (`Share.chunk_indices`)."""
        batch = next(self.data)
        return [batch[i] for i in self.prompt_indices]

    def group_ids(self, batch_id: int) -> list[int]:
        """Global group ids of this process's prompts of batch ``batch_id``: each prompt's
        index in the global stream."""
        return [batch_id * self.cfg.task.prompts_per_step + i for i in self.prompt_indices]

    def published(self) -> Any:
        """The learner's current weights as this process's copy (`mp.process_local`)."""
        return mp.process_local(self.learner.published_weights())

    def advantages(self, batch: ro.RolloutBatch) -> np.ndarray:
        """Advantages of this process's rows, computed from every process's rewards."""
        t = self.cfg.task
        (rewards,) = mp.concat([float(tr.reward) for tr in batch.trajectories])
        rewards = np.array(rewards, np.float32)
        adv = compute_advantages(rewards.reshape(t.prompts_per_step, t.samples_per_prompt),
                                 self.cfg.advantages)
        rows = len(batch.trajectories)
        return np.asarray(adv, np.float32).reshape(-1)[self.share.index * rows:][:rows]

    def learn(self, batch: ro.RolloutBatch, record: dict[str, Any]) -> None:
        """One learner step on ``batch``; ``record`` (loop metrics of this step) is logged
        together with the learner's metrics once they are fetched (one step later)."""
        n = record["step"]
        every = self.cfg.token_samples_every
        if every and n % every == 0:  # every process's rows, written by process 0
            start = time.perf_counter()
            arrays = self.learner.token_logprobs(batch.trajectories)
            if batch.logp_version is not None:
                arrays["logp_version"] = batch.logp_version
            arrays = mp.gather_rows(arrays)
            if self.run.writer:
                (self.run / "token_samples").mkdir(exist_ok=True)
                np.savez_compressed(self.run / "token_samples" / f"step_{n}.npz", **arrays)
            self.clock.add("rl/token_samples_s", time.perf_counter() - start)
        start = time.perf_counter()
        previous = self.learner.train_on(batch.trajectories, self.advantages(batch))
        version = self.learner.version  # waits for the step: the sampler needs its weights
        learn_s = time.perf_counter() - start
        self.clock.add("rl/learn_s", learn_s)
        tokens = sum(int(np.sum(t.loss_mask)) for t in batch.trajectories)
        record.update({"time/learn_s": learn_s,
                       "throughput/trained_tokens_per_s": tokens / max(learn_s, 1e-9)})
        self._pending.append(record)
        self._log(previous)
        if version not in self.ring.versions:
            self.ring.push(version, self.published())

    def _log(self, learner_metrics: dict[str, Any] | None) -> None:
        if learner_metrics is None:
            return
        record = self._pending.pop(0)
        step, version = record.pop("step"), record.pop("version")
        merged = {**record, **mp.global_batch_stats(learner_metrics),
                  **fleet_metrics(self.sampler)}
        scalars = {k: v for k, v in merged.items() if not k.startswith("hist/")}
        metrics, timing = _split_timing(scalars)
        self.run.append_jsonl("metrics.jsonl", {"step": step, "version": version, **metrics})
        self.run.append_jsonl("timing.jsonl", {"step": step, **timing})
        # tensorboard: scalars and hist/* bucket counts; the staleness histograms are lists
        self.logger.log(step, version, {k: v for k, v in merged.items()
                                        if k.startswith("hist/") or isinstance(v, (int, float))})

    def flush(self) -> None:
        """Fetch and log the last dispatched step's learner metrics."""
        self._log(self.learner.flush())

    def _run_simulated(self, book: dict[str, Any]) -> None:
        cfg = self.cfg
        bar = tqdm(range(book["start_step"], cfg.rl_steps), desc=f"RL ({cfg.objective.name})",
                   disable=not self.show_progress, dynamic_ncols=True)
        for n in bar:
            version = self.learner.version
            sample_s, sampled = 0.0, 0
            for m in self.line.due(n):
                if m >= cfg.rl_steps:  # the last steps' lookahead: no step would read it
                    continue
                made = self.generate(m)
                self.line.put(m, made)
                sample_s += made.sample_s
                sampled += sum(int(np.sum(t.loss_mask)) for t in made.trajectories)
            batch = self.line.pop(n)
            self.clock.add("rl/sample_s", sample_s)
            record = {"step": n, "version": version,
                      **mp.global_rollout_metrics(batch, version),
                      "time/sample_s": sample_s, "time/wait_s": 0.0,
                      "throughput/sampled_tokens_per_s": sampled / max(sample_s, 1e-9)}
            self.learn(batch, record)
            bar.set_postfix(reward=f"{record['reward/mean']:.3f}",
                            inter=record["staleness/inter_mean"],
                            intra=record["staleness/intra_mean"])
            every = cfg.checkpoint.every
            if (every and (n + 1) % every == 0) or n + 1 == cfg.rl_steps:
                self.checkpoint(book, n + 1)

    def elapsed_s(self) -> float:
        """Wall seconds of this run, including the time before a resume."""
        return self._elapsed_base + time.perf_counter() - self._t0

    def rl_wall_s(self) -> float:
        """Wall seconds of the RL phase, including the RL time before a resume."""
        return self._rl_base + time.perf_counter() - self._rl_start

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, book: dict[str, Any], next_step: int,
                   pending: list[ro.RolloutBatch] | None = None) -> None:
        """Save everything needed to continue at ``next_step`` (metrics flushed first).

        ``pending``: generated, not yet consumed batches (default: the delay line's)."""
        start = time.perf_counter()
        self.flush()
        book["start_step"] = next_step
        book["elapsed_s"] = self.elapsed_s()
        book["rl_wall_s"] = self.rl_wall_s()
        book["phases"] = self.clock.state_dict(book["elapsed_s"])
        if pending is None:
            pending = list(self.line.state_dict()["pending"].values())
        queue = {"delay_line": mp.per_process(
                     state_io.delay_line_json(self.line, pending, next_step)),
                 "book": book, "ring": None}
        if self.run.writer:  # the ring first: a checkpoint never lacks its ring file
            queue["ring"] = state_io.save_ring(self.run / "ring" / f"{next_step}.npz", self.ring)
        saved = self.learner.save(data_state=mp.per_process(self.data.get_state()), queue_state=queue,
                                  config=json.loads(self.cfg.to_json()))
        if not saved:  # orbax skips a step that already exists: never silently
            raise RunError(f"checkpoint step {next_step} was not saved: "
                           f"{self.run.checkpoint_dir / str(next_step)} already exists")
        self.learner.checkpoint.wait()
        if self.run.writer:
            state_io.prune_rings(self.run / "ring", self.learner.checkpoint.all_steps())
        self.clock.add("rl/checkpoint_s", time.perf_counter() - start)

    def _restore_ring(self, step: int, restored: dict[str, Any]) -> ParamRing:
        """The parameter ring saved with checkpoint ``step``, read and checked against the
        record in the checkpoint; raising makes the restore fall back to an older one."""
        queue = restored["queue_state"]
        return state_io.load_ring(self.run / "ring" / f"{queue['book']['start_step']}.npz",
                                  self.cfg.staleness.ring_size,
                                  template=self.learner.published_weights(),
                                  expect=queue.get("ring"))

    def _restore(self) -> dict[str, Any] | None:
        items = self.learner.restore_latest()
        if items is None:
            resume_policy.say(self.run, f"no checkpoint in {self.run.checkpoint_dir}: "
                                        "starting fresh")
            return None
        queue = items["queue_state"]
        book = queue["book"]
        data_state = mp.own(items["data_state"], "data_state")
        self.data.set_state(data_state)
        state_io.load_delay_line(self.line, mp.own(queue["delay_line"], "delay_line"))
        self.ring = items["verified"]
        for name in ("metrics.jsonl", "timing.jsonl"):
            self.run.truncate_jsonl(name, book["start_step"])
        resume_policy.announce(self.run, self.plan, book["start_step"], items["path"],
                               data_state["batch_index"])
        return book

    # ------------------------------------------------------------------ main
    def run_job(self) -> dict[str, Any]:
        """Run (or resume) the job; returns the summary."""
        self._t0 = time.perf_counter()
        self.clock.start()
        try:
            return self._run_job()
        finally:
            self.clock.stop()

    def _run_job(self) -> dict[str, Any]:
        cfg = self.cfg
        if self.plan is not None and self.plan.action == "finished":
            resume_policy.say(self.run, f"{self.run.path} already finished (summary.json): "
                                        "nothing to resume; showing its summary")
            return self.run.read_json("summary.json")
        if self.plan is not None and self.plan.action == "fresh":
            resume_policy.say(self.run, f"nothing to resume in {self.run.path} (no checkpoint)"
                                        ": starting fresh")
        self.prepare_task()  # bad data is refused before the run directory is written
        self.run.start(cfg.to_json())
        self.setup()
        book = self._restore() if self.plan is not None and self.plan.action == "continue" else None
        self.clock.load_state_dict(book.get("phases") if book is not None else None)
        # a run rewrites steps >= its start (0 when fresh): TensorBoard drops earlier
        # sessions' events there, so curves never hold duplicate or out-of-order steps
        self.logger = make_logger(self.run / "tb", cfg.logging, run_dir=self.run.path,
                                  name=cfg.name, resume=book is not None, jsonl=False,
                                  purge_step=0 if book is None else book["start_step"])
        fresh = book is None  # RL starts now: its current weights become the reference
        if fresh:
            for name in ("metrics.jsonl", "timing.jsonl", "sft.jsonl"):
                if self.run.writer:
                    (self.run / name).unlink(missing_ok=True)
            book = {"start_step": 0, "elapsed_s": 0.0, "evals": {}}
            book["evals"]["init"] = shared_eval.initial_evaluation(
                json.loads(cfg.to_json()), lambda: self.evaluate("init", self.published(), 0),
                self._replay_eval, lambda src: self.run.write_json("eval/init_source.json", src))
            if cfg.sft.steps > 0:
                self.learner.load_params(
                    self.warm_start(self.module_fn, self.learner.hand_over_params()))
                if cfg.sft.save_model:
                    self.export(self.run / "sft_model")
                book["evals"]["before_rl"] = self.evaluate(
                    "before_rl", self.published(), 0)
            else:  # same weights: the initial evaluation is the one before RL
                book["evals"]["before_rl"] = dict(book["evals"]["init"], phase="before_rl")
                self._replay_eval(book["evals"]["before_rl"])
            self.ring.push(0, self.published())
            self.logger.log_hparams(json.loads(cfg.to_json()))
        reference.attach(self.learner, self.run.path, fresh=fresh, write=self.run.writer)
        self._elapsed_base = book["elapsed_s"]
        self._rl_base, self._rl_start = book.get("rl_wall_s", 0.0), time.perf_counter()
        with self.clock.phase("rl"):
            if cfg.staleness.mode == "async":
                from experiments.async_loop import run_async

                run_async(self, book)
            else:
                self._run_simulated(book)
            self.flush()
        book["rl_wall_s"] = self.rl_wall_s()
        version = self.learner.version
        book["evals"]["after_rl"] = self.evaluate("after_rl", self.published(), version)
        book["elapsed_s"] = self.elapsed_s()
        summary = self._summary(book)
        self.run.write_json("summary.json", summary)
        self.learner.close()
        self.logger.close()
        self.task.verifier.close()
        return summary

    def _time_split(self, total_s: float) -> dict[str, Any]:
        """``time/phases`` (wall seconds: sft_s + eval_s + rl_s + compile_s + other_s =
        total_s = ``wall_clock_s``), ``time/phases_cpu`` (process CPU seconds per phase),
        ``time/rl_split`` (RL sub-phases, compilation included), ``time/startup_s``
        (imports and parsing before the job, when run from the command line) and
        ``time/counts`` (SFT steps, episodes, verifier checks, compilations); see
        `experiments.phases`."""
        split = self.clock.split(total_s)
        v = self.task.verifier
        counts = dict(split["counts"], compilations=split["compiles"],
                      verifier_checks=v.num_checks, verifier_fast_path=v.num_fast_path,
                      verifier_math_verify=v.num_worker_checks)
        return {"time/phases": split["wall"], "time/phases_cpu": split["cpu"],
                "time/rl_split": split["sub"], "time/startup_s": self.startup_s,
                "time/counts": counts,
                "time/compilations_by_function": split["compiles_by_function"]}

    def _summary(self, book: dict[str, Any]) -> dict[str, Any]:
        primary = next(iter(self.task.eval_sets))
        k = self.cfg.task.eval_samples

        def bench(phase):
            return book["evals"][phase]["benchmarks"][primary]

        records = self.run.read_jsonl("metrics.jsonl")
        rewards = [r["reward/mean"] for r in records]
        w = max(1, min(10, len(rewards)))
        realised = {k: [r[f"staleness/{k}_mean"] for r in records if f"staleness/{k}_mean" in r]
                    for k in ("inter", "intra")}
        realised = {k: float(np.mean(v)) if v else None for k, v in realised.items()}
        return {
            "primary_benchmark": primary,
            "eval_metric": f"avg@{k} (sampled at temperature {self.cfg.sampling.temperature})",
            "eval_accuracy_init": bench("init")["avg@n"],
            "eval_accuracy_before": bench("before_rl")["avg@n"],
            "eval_accuracy_after": bench("after_rl")["avg@n"],
            "eval_ref_logp_before": bench("before_rl").get("ref_logp"),
            "eval_ref_logp_after": bench("after_rl").get("ref_logp"),
            "eval_greedy_before": bench("before_rl")["greedy"],
            "eval_greedy_after": bench("after_rl")["greedy"],
            f"eval_pass@{k}_before": bench("before_rl")[f"pass@{k}"],
            f"eval_pass@{k}_after": bench("after_rl")[f"pass@{k}"],
            "rl_steps": self.cfg.rl_steps,
            "sft_steps": self.cfg.sft.steps,
            "reward_first": float(np.mean(rewards[:w])) if rewards else None,
            "final_reward": float(np.mean(rewards[-w:])) if rewards else None,
            "wall_clock_s": book["elapsed_s"],
            "rl_wall_clock_s": book["rl_wall_s"],
            "objective": self.cfg.objective.name,
            "objective_config": dataclasses.asdict(self.objective.config),
            "staleness_mode": self.cfg.staleness.mode,
            # what the lag realised over all steps (measured; the delay line fills first)
            # and how many steps the schedule gives the configured lag in full (planned;
            # None in async mode; preflight.lag_horizon)
            "staleness_realised_inter_mean": realised["inter"],
            "staleness_realised_intra_mean": realised["intra"],
            "staleness_full_lag_steps": full_lag_steps(self.cfg.staleness, self.cfg.rl_steps),
            **self._time_split(book["elapsed_s"]),
            "evals": {phase: book["evals"][phase]["benchmarks"] for phase in book["evals"]},
        }
