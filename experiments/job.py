"""The RL job: policy + sampler + task + rollout source + learner, wired together.

Phases of a fresh run: evaluation of the initial policy (``eval/init.json``; read instead
from ``shared_eval_dir`` when another run stored the same one, `experiments.shared_eval`),
the optional supervised warm start (``sft.jsonl``, `experiments.warm_start`), evaluation
before RL (``eval/before_rl.json``, `experiments.evaluation`), ``rl_steps`` learner steps
(`experiments.loop`), evaluation after RL (``eval/after_rl.json``) and ``summary.json``
(`experiments.summary`). Files are described in `experiments.rundir`; when the objective
has a KL term, the frozen reference policy (the policy RL starts from) is
``reference.npz`` (`experiments.reference`).

Staleness is made by the rollout source (`experiments.sources`): ``sync`` / ``simulated``
mode is a seeded plan (two runs write identical ``metrics.jsonl`` files), ``async`` a
sampler thread that overlaps the learner (`experiments.async_source`; staleness measured).

``--resume`` restores the newest checkpoint (`experiments.checkpointing`), so a killed run
loses and repeats no batch. What a resume may change is decided by `experiments.resume`;
bad input is refused before any work by `experiments.preflight`. With several processes
(`learners.distributed`), each process generates its share of every global batch; what
each knob means then is in `experiments.multiprocess`.
"""

from __future__ import annotations

import json
import time
import warnings
from typing import Any

import numpy as np

from entr_jax.advantages import compute_advantages
from entr_jax.assets import tiny_dir
from entr_jax.data import PromptBatchIterator, PromptDataConfig
from entr_jax.staleness import DelayLine, ParamRing
from entr_jax.tokenizer import Tokenizer
from experiments import build, checkpointing, preflight, reference, shared_eval
from experiments import multiprocess as mp
from experiments import resume as resume_policy
from experiments.config import RunConfig
from experiments.decomposition import logp_at_token_version
from experiments.episodes import Episodes
from experiments.errors import RunError
from experiments.evaluation import Evaluator
from experiments.export import export_policy
from experiments.loop import Hook, run_rl
from experiments.objective import build_objective
from experiments.phases import PhaseClock
from experiments.rollouts import RolloutBatch
from experiments.rundir import RunDir
from experiments.sources import RolloutSource, SimulatedSource
from experiments.step_log import StepLog
from experiments.summary import summary, time_split
from experiments.tasks import TaskBundle, build_task
from experiments.warm_start import warm_start
from learners.checkpoint import CheckpointManager
from learners.learner import Learner, LearnerConfig
from learners.logging import make_logger
from learners.optim import OptimizerConfig
from samplers.jax_sampler import JaxSamplerConfig


class RunExistsError(RunError, FileExistsError):
    """The run directory already holds a run and ``--resume`` was not given."""


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
        preflight.check_output_dirs(cfg)
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
        finished = self.plan is not None and self.plan.action == "finished"
        if not finished and (note := preflight.lag_horizon(cfg)) is not None:
            warnings.warn(note, stacklevel=2)
        self.model_cfg = preflight.read_model_config(cfg.model.path or tiny_dir())
        preflight.check_weights_sha256(cfg)

    # ------------------------------------------------------------------ construction
    def learner_config(self, optimizer: OptimizerConfig, pad_id: int,
                       max_length: int | None = None) -> LearnerConfig:
        """The learner's config (`experiments.build.learner_config`)."""
        return build.learner_config(self.cfg, optimizer, pad_id, max_length)

    def prepare_task(self) -> None:
        """Tokenizer and task, checked (`preflight.check_task`) before anything is written."""
        cfg = self.cfg
        self.tokenizer = Tokenizer.from_pretrained(cfg.model.path or str(tiny_dir()))
        self.task: TaskBundle = build_task(cfg.task, cfg.verifier, data_dir=cfg.data.dir)
        preflight.check_task(cfg, self.task, self.tokenizer, self.model_cfg,
                             max_prompt_len=(JaxSamplerConfig().max_prompt_len
                                             if cfg.sampler.kind == "jax" else None))

    def setup(self) -> None:
        """Build the policy, learner, sampler and data stream (the task first if
        `prepare_task` was not called)."""
        cfg = self.cfg
        self.share = mp.Share.current()
        prompt_indices = self.share.chunk_indices(
            cfg.task.prompts_per_step, cfg.learner.minibatches, "task.prompts_per_step",
            "learner.minibatches")
        if cfg.sft.steps > 0:
            self.share.bounds(cfg.sft.batch_size, "sft.batch_size")
        if not hasattr(self, "task"):
            self.prepare_task()
        self.module_fn, weights = build.policy(cfg, self.model_cfg)
        self.objective = build_objective(cfg)
        self.learner = Learner(
            self.module_fn,
            self.learner_config(cfg.optim, self.tokenizer.pad_token_id),
            objective=self.objective,
            checkpoint=CheckpointManager(
                self.run.checkpoint_dir, max_to_keep=cfg.checkpoint.keep,
                log_file=self.run / "logs" / "checkpoint.log",
                verify=lambda step, restored: checkpointing.verify(
                    self.run, cfg, restored, self.learner.published_weights(),
                    self.episodes.data)),
            params=weights,  # model.path's weights: no random init to replace
        )
        del weights
        self.sampler = build.sampler(cfg, self.learner, self.share, self.published(),
                                     cfg.sampler.export_dir or str(self.run / "exports"))
        data = PromptBatchIterator(
            self.task.train, PromptDataConfig(batch_size=cfg.task.prompts_per_step, seed=cfg.seed))
        self.episodes = Episodes(cfg, self.tokenizer, self.task, data, prompt_indices)
        self.line = DelayLine(cfg.staleness)
        self.ring: ParamRing = ParamRing(cfg.staleness.ring_size)

    def source(self, start: int) -> RolloutSource:
        """The rollout source of ``staleness.mode``, continuing the delay line and ring."""
        cfg, episodes = self.cfg, self.episodes.train_batch
        if cfg.staleness.mode == "async":
            from experiments.async_source import AsyncSource

            return AsyncSource(cfg.staleness, cfg.rl_steps, self.sampler, episodes, self.line,
                               self.ring, start, add_time=self.clock.add)
        return SimulatedSource(cfg.staleness, cfg.rl_steps, self.sampler, episodes, self.line,
                               self.ring, start, on_batch=self._annotate, add_time=self.clock.add)

    def _annotate(self, batch: RolloutBatch, ring: ParamRing, versions: list[int],
                  switch_steps: tuple[int, ...]) -> None:
        """Count a simulated batch's episodes; every ``token_samples_every`` batches, score
        its tokens at their own versions (`experiments.decomposition`; in ``async`` mode
        the versions a batch used may have left the ring before it is consumed, so its
        token samples have no ``logp_version``)."""
        self.clock.count("rl_episodes", len(batch.trajectories))
        every = self.cfg.token_samples_every
        if every and batch.batch_id % every == 0:
            batch.logp_version = logp_at_token_version(self.learner, batch.trajectories,
                                                       ring, versions)

    # ------------------------------------------------------------------ the loop's parts
    def published(self) -> Any:
        """The learner's current weights as this process's copy (`mp.process_local`)."""
        return mp.process_local(self.learner.published_weights())

    def advantages(self, batch: RolloutBatch) -> np.ndarray:
        """Advantages of this process's rows, computed from every process's rewards."""
        t = self.cfg.task
        (rewards,) = mp.concat([float(tr.reward) for tr in batch.trajectories])
        rewards = np.array(rewards, np.float32)
        adv = compute_advantages(rewards.reshape(t.prompts_per_step, t.samples_per_prompt),
                                 self.cfg.advantages)
        rows = len(batch.trajectories)
        return np.asarray(adv, np.float32).reshape(-1)[self.share.index * rows:][:rows]

    def token_samples(self, step: int, batch: RolloutBatch) -> None:
        """Every ``token_samples_every`` steps: every process's rows of ``batch`` scored by
        the current weights, written by process 0 to ``token_samples/step_<n>.npz``."""
        every = self.cfg.token_samples_every
        if not (every and step % every == 0):
            return
        start = time.perf_counter()
        arrays = self.learner.token_logprobs(batch.trajectories)
        if batch.logp_version is not None:
            arrays["logp_version"] = batch.logp_version
        arrays = mp.gather_rows(arrays)
        if self.run.writer:
            (self.run / "token_samples").mkdir(exist_ok=True)
            np.savez_compressed(self.run / "token_samples" / f"step_{step}.npz", **arrays)
        self.clock.add("rl/token_samples_s", time.perf_counter() - start)

    def checkpoint(self, book: dict[str, Any], next_step: int, source: RolloutSource) -> None:
        """Save everything needed to continue at ``next_step`` (metrics flushed first)."""
        self.flush()
        book["elapsed_s"] = self.elapsed_s()
        book["rl_wall_s"] = self.rl_wall_s()
        book["phases"] = self.clock.state_dict(book["elapsed_s"])
        checkpointing.save(self.cfg, self.run, self.learner, self.episodes.data, source, book,
                           next_step, self.clock)
        self.run.drop_sft_checkpoints()  # RL resumes from its own now

    def flush(self) -> None:
        """Fetch and log the last dispatched step's learner metrics."""
        self.step_log.write(self.learner.flush())

    def warm_start(self, module_fn, params) -> Any:
        """The supervised warm start from ``params`` (`experiments.warm_start`; continued
        from its checkpoint when `reuses_phases`)."""
        return warm_start(self.cfg, self.task, self.tokenizer, module_fn, params,
                          self.learner_config, self.share, self.run, self.clock,
                          self.show_progress, resume=self.reuses_phases)

    @property
    def reuses_phases(self) -> bool:
        """Resumed before its first RL checkpoint with a configuration that computes the
        same (`experiments.resume`): the phases it finished are reused, not redone."""
        return self.plan is not None and self.plan.action == "fresh" and not self.plan.overrides

    def _fresh_resume_note(self) -> str:
        """What a resume without an RL checkpoint does, in one line."""
        where, reused = self.run.path, self.run.reusable_phases()
        if self.plan.overrides:
            return (f"no RL checkpoint in {where} yet: starting over with the new "
                    f"{', '.join(c.field for c in self.plan.overrides)}"
                    + (f" (redoing {', '.join(map(str, reused))})" if reused else ""))
        if reused:
            return (f"no RL checkpoint in {where} yet: reusing the phases it finished "
                    f"({', '.join(map(str, reused))})")
        return f"nothing to resume in {where} (no checkpoint): starting fresh"

    def _finished_eval(self, phase: str) -> dict[str, Any] | None:
        """``eval/<phase>.json`` of the interrupted run this one resumes (replayed to the
        logs and said on stderr), or None when there is none to reuse."""
        path, found = self.run / "eval" / f"{phase}.json", None
        if self.reuses_phases and self.run.writer and path.is_file():
            try:
                found = json.loads(path.read_text())
            except (OSError, ValueError):
                found = None
            if not (isinstance(found, dict) and found.get("phase") == phase
                    and isinstance(found.get("benchmarks"), dict)):
                found = None
        found = mp.allgather_json(found)[0]
        if found is not None:
            resume_policy.say(self.run, f"reusing the finished evaluation {path}")
            self.evaluator.replay(found)
        return found

    def export(self, path) -> None:
        """The current policy in the Hugging Face layout (`experiments.export`)."""
        export_policy(self.learner.state, path, self.cfg.model.path, self.run.writer)

    def elapsed_s(self) -> float:
        """Wall seconds of this run, including the time before a resume."""
        return self._elapsed_base + time.perf_counter() - self._t0

    def rl_wall_s(self) -> float:
        """Wall seconds of the RL phase, including the RL time before a resume."""
        return self._rl_base + time.perf_counter() - self._rl_start

    # ------------------------------------------------------------------ main
    def run_job(self) -> dict[str, Any]:
        """Run (or resume) the job; returns the summary."""
        self._t0 = time.perf_counter()
        self.clock.start()
        try:
            return self._run_job()
        finally:
            self.clock.stop()

    def _begin(self) -> dict[str, Any] | None:
        """Restore the newest checkpoint when resuming; its book, or None (fresh)."""
        if self.plan is None or self.plan.action != "continue":
            return None
        restored = checkpointing.restore(self.run, self.learner, self.plan)
        if restored is None:
            return None
        book, self.ring, self.line = restored
        return book

    def _before_rl(self, book: dict[str, Any]) -> None:
        """A fresh run's phases before RL: initial evaluation, warm start, evaluation.
        Resumed before its first RL checkpoint with the same configuration, a run reuses
        the evaluations it finished and continues its warm start from its checkpoint."""
        cfg = self.cfg
        for name in ("metrics.jsonl", "timing.jsonl"):
            if self.run.writer:
                (self.run / name).unlink(missing_ok=True)
        ev = self.evaluator
        book["evals"]["init"] = self._finished_eval("init") or shared_eval.initial_evaluation(
            json.loads(cfg.to_json()), lambda: ev.evaluate("init", self.published(), 0),
            ev.replay, lambda src: self.run.write_json("eval/init_source.json", src))
        if cfg.sft.steps > 0:
            self.learner.load_params(
                self.warm_start(self.module_fn, self.learner.hand_over_params()))
            if cfg.sft.save_model:
                self.export(self.run / "sft_model")
            book["evals"]["before_rl"] = self._finished_eval("before_rl")
            if book["evals"]["before_rl"] is None:
                book["evals"]["before_rl"] = ev.evaluate("before_rl", self.published(), 0)
            else:  # the sampler serves the warm-started weights, as after an evaluation
                self.sampler.update_weights(self.published(), 0)
        else:  # same weights: the initial evaluation is the one before RL
            book["evals"]["before_rl"] = dict(book["evals"]["init"], phase="before_rl")
            ev.replay(book["evals"]["before_rl"])
        self.ring.push(0, self.published())
        self.logger.log_hparams(json.loads(cfg.to_json()))

    def _run_job(self) -> dict[str, Any]:
        cfg = self.cfg
        if self.plan is not None and self.plan.action == "finished":
            resume_policy.say(self.run, f"{self.run.path} already finished (summary.json): "
                                        "nothing to resume; showing its summary")
            return self.run.read_json("summary.json")
        if self.plan is not None and self.plan.action == "fresh":
            resume_policy.say(self.run, self._fresh_resume_note())
        self.prepare_task()  # bad data is refused before the run directory is written
        self.run.start(cfg.to_json())
        if self.plan is not None and self.plan.action == "fresh":
            resume_policy.record_changes(self.run, self.plan, 0)
        self.setup()
        book = self._begin()
        self.clock.load_state_dict(book.get("phases") if book is not None else None)
        # a run rewrites steps >= its start (0 when fresh): TensorBoard drops earlier
        # sessions' events there, so curves never hold duplicate or out-of-order steps
        self.logger = make_logger(self.run / "tb", cfg.logging, run_dir=self.run.path,
                                  name=cfg.name, resume=book is not None, jsonl=False,
                                  purge_step=0 if book is None else book["start_step"])
        self.step_log = StepLog(self.run, self.logger, self.sampler)
        self.evaluator = Evaluator(cfg, self.run, self.logger, self.sampler, self.learner,
                                   self.episodes, self.share, self.clock, self.show_progress)
        fresh = book is None  # RL starts now: its current weights become the reference
        if fresh:
            book = {"start_step": 0, "elapsed_s": 0.0, "evals": {}}
            self._before_rl(book)
            # a warm start continued from its checkpoint brings the time before it
            book["elapsed_s"] = self.clock.restored_total_s
        reference.attach(self.learner, self.run.path, fresh=fresh, write=self.run.writer)
        self._elapsed_base = book["elapsed_s"]
        self._rl_base, self._rl_start = book.get("rl_wall_s", 0.0), time.perf_counter()
        with self.clock.phase("rl"):
            source = self.source(book["start_step"])
            hooks = [Hook(lambda info: self.step_log.add(info.record, info.learner_metrics)),
                     Hook(lambda info: self.checkpoint(book, info.step + 1, source),
                          every=cfg.checkpoint.every, at_end=True)]
            try:
                run_rl(self, source, hooks, book["start_step"], cfg.rl_steps,
                       self.show_progress)
            finally:
                source.close()
            self.flush()
        book["rl_wall_s"] = self.rl_wall_s()
        version = self.learner.version
        book["evals"]["after_rl"] = self.evaluator.evaluate("after_rl", self.published(), version)
        book["elapsed_s"] = self.elapsed_s()
        timing = time_split(self.clock, self.task.verifier, book["elapsed_s"], self.startup_s)
        out = summary(cfg, self.run, book, self.task.eval_sets, self.objective.config, timing)
        self.run.write_json("summary.json", out)
        self.run.drop_sft_checkpoints()  # a finished run is never continued
        self.learner.close()
        self.logger.close()
        self.task.verifier.close()
        return out

