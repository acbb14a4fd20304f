"""The RL job from the command line: preflight, the phases of a run, the summary.

Phases of a fresh run: evaluation of the initial policy (``eval/init.json``; read instead
from ``shared_eval_dir`` when another run stored the same one, `experiments.run.shared_eval`),
the optional supervised warm start (``sft.jsonl``, `experiments.run.warm_start`), evaluation
before RL (``eval/before_rl.json``, `experiments.run.evaluation`), ``rl_steps`` learner steps
(`experiments.run.loop`), evaluation after RL (``eval/after_rl.json``) and ``summary.json``
(`experiments.run.summary`). Files are described in `experiments.run.rundir`; when the objective
has a KL term, the frozen reference policy (the policy RL starts from) is
``reference.npz`` (`experiments.run.reference`).

The parts (learner, sampler, rollout source, advantage function...) are built in one
place (`experiments.run.build.build`); the RL loop (`experiments.run.loop.run_rl`) takes the ones it
uses and the hooks of this module: token samples (before the update), the step log, a
checkpoint, progress and the phase clock.

Staleness is made by the rollout source (`experiments.run.sources`): ``sync`` / ``simulated``
mode is a seeded plan (two runs write identical ``metrics.jsonl`` files), ``async`` a
sampler thread that overlaps the learner (`experiments.run.async_source`; staleness measured).

``--resume`` restores the newest checkpoint (`experiments.run.checkpointing`), so a killed run
loses and repeats no batch. What a resume may change is decided by `experiments.run.resume`;
bad input is refused before any work by `experiments.run.preflight`. With several processes
(`learners.distributed`), each process generates its share of every global batch; what
each knob means then is in `experiments.run.multiprocess`.
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from entr_jax.assets import tiny_dir
from experiments.run import build, checkpointing, preflight, reference, shared_eval
from experiments.run import multiprocess as mp
from experiments.run import resume as resume_policy
from experiments.run.checkpointing import Book
from experiments.run.config import RunConfig
from experiments.run.errors import RunError
from experiments.run.evaluation import Evaluator
from experiments.run.export import export_policy
from experiments.run.loop import Hook, StepInfo, run_rl
from experiments.run.phases import PhaseClock
from experiments.run.progress import progress_bar
from experiments.run.rollouts import RolloutBatch
from experiments.run.rundir import RunDir
from experiments.run.step_log import StepLog
from experiments.run.summary import summary, time_split
from experiments.run.warm_start import warm_start
from learners.logging import make_logger


class RunExistsError(RunError, FileExistsError):
    """The run directory already holds a run and ``--resume`` was not given."""


def token_samples_hook(cfg: RunConfig, run: RunDir, learner: Any, clock: PhaseClock) -> Hook:
    """Every ``token_samples_every`` steps, before the update: every process's rows of the
    batch scored by the weights about to train on it (with ``logp_version`` when the source
    scored them at their own versions), written by process 0 to
    ``token_samples/step_<n>.npz``."""
    def write(info: StepInfo) -> None:
        start = time.perf_counter()
        arrays = learner.token_logprobs(info.batch.trajectories)
        if info.batch.logp_version is not None:
            arrays["logp_version"] = info.batch.logp_version
        arrays = mp.gather_rows(arrays)
        if run.writer:
            (run / "token_samples").mkdir(exist_ok=True)
            np.savez_compressed(run / "token_samples" / f"step_{info.step}.npz", **arrays)
        clock.add("rl/token_samples_s", time.perf_counter() - start)

    return Hook(write, phase="before_update", every=cfg.token_samples_every, offset=0)


def clock_hook(clock: PhaseClock) -> Hook:
    """After every update: its learner seconds and episodes to the phase clock."""
    def add(info: StepInfo) -> None:
        clock.add("rl/learn_s", info.record["time/learn_s"])
        clock.count("rl_episodes", len(info.batch.trajectories))

    return Hook(add, phase="after_update")


def progress_hook(bar: Any, async_mode: bool) -> Hook:
    """After every update: the progress bar's step, reward and staleness (and the wait
    for the sampler in ``async`` mode)."""
    def show(info: StepInfo) -> None:
        r = info.record
        postfix = dict(reward=f"{r['reward/mean']:.3f}", inter=r["staleness/inter_mean"],
                       intra=r["staleness/intra_mean"])
        if async_mode:
            postfix["wait"] = f"{r['time/wait_s']:.2f}s"
        bar.set_postfix(**postfix, refresh=False)
        bar.update(1)

    return Hook(show, phase="after_update")


class Job:
    """One run of `RunConfig` from the command line (see the module docstring).

    Args:
      cfg: the run.
      resume, resume_override: ``--resume`` / ``--resume-override``.
      show_progress: progress bars on stderr.
      hooks: more hooks for the RL loop (`experiments.run.loop.Hook`), run before the job's
        own in each phase (e.g. a test's crash at a given step).
      advantages: replaces the advantage function: called with the built
        `experiments.run.build.Parts`, returns the function (e.g. a test's synthetic signal).
    """

    def __init__(self, cfg: RunConfig, *, resume: bool = False, resume_override: bool = False,
                 show_progress: bool = True, hooks: Sequence[Hook] = (),
                 advantages: Callable[[build.Parts], build.AdvantageFn] | None = None):
        """Check everything that can be checked before any work (run directory, resume
        policy, devices, model config); raises `experiments.run.errors.RunError` subclasses,
        `RunExistsError`."""
        self.cfg = cfg
        run_dir = cfg.run_dir or f"runs/{cfg.name}"
        preflight.check_run_dir(run_dir, "run_dir" if cfg.run_dir else "name")
        preflight.check_output_dirs(cfg)
        self.run = RunDir(run_dir)
        self.show_progress = show_progress
        self.hooks, self.advantages = tuple(hooks), advantages
        self.clock = PhaseClock()  # wall/CPU time per phase, compilation apart
        self.startup_s: float | None = None  # set by the command line (experiments.run.cli)
        self.parts: build.Parts | None = None  # once built (`run_job`)
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

    def build_parts(self) -> build.Parts:
        """The run's parts (`experiments.run.build.build`), built without running anything
        (for benchmarks that use them directly)."""
        prepared = build.prepare_task(self.cfg, self.model_cfg)
        self.parts = build.build(self.cfg, self.run, prepared, self.model_cfg, self.clock)
        return self.parts

    @property
    def reuses_phases(self) -> bool:
        """Resumed before its first RL checkpoint with a configuration that computes the
        same (`experiments.run.resume`): the phases it finished are reused, not redone."""
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

    def _finished_eval(self, phase: str, evaluator: Evaluator) -> dict[str, Any] | None:
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
            evaluator.replay(found)
        return found

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

    def _before_rl(self, parts: build.Parts, evaluator: Evaluator, book: Book) -> Book:
        """A fresh run's phases before RL: initial evaluation, warm start, evaluation.
        Resumed before its first RL checkpoint with the same configuration, a run reuses
        the evaluations it finished and continues its warm start from its checkpoint."""
        cfg, run, ev, learner = self.cfg, self.run, evaluator, parts.learner
        for name in ("metrics.jsonl", "timing.jsonl"):
            if run.writer:
                (run / name).unlink(missing_ok=True)
        book = book.with_eval("init", self._finished_eval("init", ev)
                              or shared_eval.initial_evaluation(
            json.loads(cfg.to_json()), lambda: ev.evaluate("init", parts.published(), 0),
            ev.replay, lambda src: run.write_json("eval/init_source.json", src)))
        if cfg.sft.steps > 0:
            learner.load_params(warm_start(
                cfg, parts.task, parts.tokenizer, parts.module_fn, learner.hand_over_params(),
                lambda *a, **k: build.learner_config(cfg, *a, **k), parts.share, run,
                self.clock, self.show_progress, resume=self.reuses_phases))
            if cfg.sft.save_model:
                export_policy(learner.state, run / "sft_model", cfg.model.path, run.writer)
            before = self._finished_eval("before_rl", ev)
            if before is None:
                before = ev.evaluate("before_rl", parts.published(), 0)
            else:  # the sampler serves the warm-started weights, as after an evaluation
                parts.sampler.update_weights(parts.published(), 0)
            book = book.with_eval("before_rl", before)
        else:  # same weights: the initial evaluation is the one before RL
            book = book.with_eval("before_rl", dict(book.evals["init"], phase="before_rl"))
            ev.replay(book.evals["before_rl"])
        return book

    def _run_job(self) -> dict[str, Any]:
        cfg, run, clock = self.cfg, self.run, self.clock
        if self.plan is not None and self.plan.action == "finished":
            resume_policy.say(run, f"{run.path} already finished (summary.json): "
                                   "nothing to resume; showing its summary")
            return run.read_json("summary.json")
        if self.plan is not None and self.plan.action == "fresh":
            resume_policy.say(run, self._fresh_resume_note())
        prepared = build.prepare_task(cfg, self.model_cfg)  # bad data: refused before writing
        run.start(cfg.to_json())
        if self.plan is not None and self.plan.action == "fresh":
            resume_policy.record_changes(run, self.plan, 0)
        parts = self.parts = build.build(cfg, run, prepared, self.model_cfg, clock)
        learner, source = parts.learner, parts.source
        restored = None
        if self.plan is not None and self.plan.action == "continue":
            restored = checkpointing.restore(run, learner, self.plan)
        book = None
        if restored is not None:
            book, source_state = restored
            source.load_state_dict(source_state)
        clock.load_state_dict(book.phases if book is not None else None)
        # a run rewrites steps >= its start (0 when fresh): TensorBoard drops earlier
        # sessions' events there, so curves never hold duplicate or out-of-order steps
        logger = make_logger(run / "tb", cfg.logging, run_dir=run.path, name=cfg.name,
                             resume=book is not None, jsonl=False,
                             purge_step=0 if book is None else book.start_step)
        evaluator = Evaluator(cfg, run, logger, parts.sampler, learner, parts.episodes,
                              parts.share, clock, self.show_progress)
        fresh = book is None  # RL starts now: its current weights become the reference
        if fresh:
            book = self._before_rl(parts, evaluator, Book())
            source.publish(parts.published(), 0)
            logger.log_hparams(json.loads(cfg.to_json()))
            # a warm start continued from its checkpoint brings the time before it
            book = dataclasses.replace(book, elapsed_s=clock.restored_total_s)
        reference.attach(learner, run.path, fresh=fresh, write=run.writer)
        self._elapsed_base = book.elapsed_s
        self._rl_base, self._rl_start = book.rl_wall_s, time.perf_counter()
        start = book.start_step
        step_log = StepLog(run, logger)

        def checkpoint(info: StepInfo) -> None:
            nonlocal book
            elapsed = self.elapsed_s()
            book = dataclasses.replace(book, start_step=info.step + 1, elapsed_s=elapsed,
                                       rl_wall_s=self.rl_wall_s(),
                                       phases=clock.state_dict(elapsed))
            checkpointing.save(cfg, run, learner, parts.episodes.data, source, book, clock)
            run.drop_sft_checkpoints()  # RL resumes from its own now

        name = "RL async" if source.mode == "async" else "RL"
        bar = progress_bar(None, desc=f"{name} ({cfg.objective.name})", initial=start,
                           total=cfg.rl_steps, show=self.show_progress)
        hooks = [*self.hooks,
                 token_samples_hook(cfg, run, learner, clock),
                 clock_hook(clock),
                 progress_hook(bar, source.mode == "async"),
                 Hook(step_log.write, phase="logged"),
                 Hook(checkpoint, phase="barrier", every=cfg.checkpoint.every, at_end=True)]
        advantages = parts.advantages if self.advantages is None else self.advantages(parts)
        with clock.phase("rl"):
            try:
                run_rl(learner, source, advantages, hooks, start, cfg.rl_steps)
            finally:
                bar.close()
        book = dataclasses.replace(book, rl_wall_s=self.rl_wall_s())
        book = book.with_eval("after_rl", evaluator.evaluate("after_rl", parts.published(),
                                                             learner.version))
        book = dataclasses.replace(book, elapsed_s=self.elapsed_s())
        timing = time_split(clock, parts.task.verifier, book.elapsed_s, self.startup_s)
        out = summary(cfg, run, book, parts.task.eval_sets, parts.objective.config, timing)
        run.write_json("summary.json", out)
        run.drop_sft_checkpoints()  # a finished run is never continued
        learner.close()
        logger.close()
        parts.task.verifier.close()
        return out
