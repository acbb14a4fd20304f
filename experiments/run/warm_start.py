"""The supervised warm start (``sft.steps > 0``): the policy trained on the task's
demonstrations before RL, its losses in ``sft.jsonl`` and TensorBoard's ``tb/sft``.

``sft.steps`` batches of ``sft.batch_size`` demonstrations, drawn by epochs of a seeded
permutation (``[seed, 3]``), each one learner update of the SFT loss
(`learners.learner.Learner.sft_on`) with ``sft.optimizer()``. With several processes each
trains on its share of every batch (`experiments.run.multiprocess.Share.take`).

Every ``checkpoint.sft_every`` steps and at its end the warm start is checkpointed in
``sft_checkpoints/`` (weights, optimizer state, and the data position: the number of
steps done, since the batches are a fixed function of the seed); a resume before the
first RL checkpoint continues from the newest one that restores and whose steps
``sft.jsonl`` holds once each (else the next older one), bit for bit as if never stopped.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Callable

import numpy as np

from experiments.run import jsonl
from experiments.run import multiprocess as mp
from experiments.run.config import RunConfig
from experiments.run.errors import RunError
from experiments.run.phases import PhaseClock
from experiments.run.progress import progress_bar
from experiments.run.resume import say
from experiments.run.rundir import RunDir
from experiments.run.tasks import TaskBundle, demo_trajectory
from learners.checkpoint import (CheckpointFallbackWarning, CheckpointManager,
                                 CheckpointRestoreError)
from learners.learner import Learner, LearnerConfig
from learners.logging import MetricsLogger
from learners.optim import OptimizerConfig


def warm_start(cfg: RunConfig, task: TaskBundle, tokenizer: Any, module_fn: Callable[[], Any],
               params: Any,
               learner_config: Callable[[OptimizerConfig, int, int | None], LearnerConfig],
               share: mp.Share, run: RunDir, clock: PhaseClock,
               show_progress: bool = True, resume: bool = False) -> Any:
    """Train ``params`` (the policy's weights: ``model.path``'s, or the random init of
    ``model.init_seed``; they are trained in place, so the caller must not use them
    afterwards) on ``task.demos``; returns the trained params.

    ``learner_config(optimizer, pad_id, max_length)`` gives the SFT learner's config.
    ``resume``: continue from the newest checkpoint in ``sft_checkpoints/`` (said on
    stderr); otherwise start at step 0, removing any earlier warm start's checkpoints.

    Raises:
      ValueError: the task has no demonstrations.
      RunError: a checkpoint step exists already (never skipped silently).
    """
    sft, demos = cfg.sft, task.demos
    if not demos:
        raise ValueError(f"sft.steps > 0 but task {cfg.task.name!r} has no demonstrations")
    with clock.phase("sft"):
        opt = sft.optimizer()
        trajs = [demo_trajectory(d, tokenizer) for d in demos]
        # every demonstration is known: batches are padded to at most the longest one, not
        # to the next power of two (the quickstart's: 11 tokens, not 16)
        longest = max(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
        every = cfg.checkpoint.sft_every
        if not resume:
            run.drop_sft_checkpoints()  # an earlier warm start's, now started over
        checkpoint = None
        if every:
            checkpoint = CheckpointManager(
                run.sft_checkpoint_dir, max_to_keep=cfg.checkpoint.keep,
                log_file=run / "logs" / "checkpoint.log",
                verify=lambda step, restored: _verify(run, restored))
        learner = Learner(module_fn, learner_config(opt, tokenizer.pad_token_id, longest),
                          params=params, checkpoint=checkpoint)
        start = (_restore(run, learner, sft.steps, clock) if resume and checkpoint is not None
                 else 0)
        if start == 0 and run.writer:
            (run / "sft.jsonl").unlink(missing_ok=True)
        rng = np.random.default_rng([cfg.seed, 3])
        order = np.concatenate([rng.permutation(len(trajs))
                                for _ in range(sft.steps * sft.batch_size // len(trajs) + 1)])
        # its own TensorBoard run (tb/sft): a resume purges RL steps of tb/, not SFT's
        sft_tb = MetricsLogger(run / "tb" / "sft", jsonl=False, purge_step=start)

        def record(step: int, m: dict[str, float]) -> None:
            run.append_jsonl("sft.jsonl", {"step": step, "loss": m["loss"]})
            sft_tb.log(step, None, {"sft/loss": m["loss"]})

        bar = progress_bar(range(start, sft.steps), desc="SFT warm start", initial=start,
                           total=sft.steps, show=show_progress)
        for step in bar:
            idx = order[step * sft.batch_size:(step + 1) * sft.batch_size]
            m = learner.sft_on([trajs[i] for i in share.take(idx, "sft.batch_size")])
            clock.count("sft_steps")
            if m is not None:
                record(step - 1, m)
                bar.set_postfix(loss=f"{m['loss']:.3f}")
            if checkpoint is not None and ((step + 1) % every == 0 or step + 1 == sft.steps):
                record(step, learner.flush())  # the saved steps' losses are on file first
                _save(run, learner, step + 1, clock)
        if start < sft.steps and (m := learner.flush()) is not None:
            record(sft.steps - 1, m)
        sft_tb.close()
        params = learner.state.params
        learner.close()
        return params


def _save(run: RunDir, learner: Learner, done: int, clock: PhaseClock) -> None:
    """Checkpoint the warm start after ``done`` steps, with the run's time figures so far
    (a resume continues them); waits for the write."""
    if not learner.save(data_state={"sft_step": done, "phases": clock.state_dict()}, force=True):
        raise RunError(f"warm-start checkpoint after SFT step {done} was not saved: a "
                       f"checkpoint of its step exists in {run.sft_checkpoint_dir}")
    learner.checkpoint.wait()


def _verify(run: RunDir, restored: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``verify`` of the warm start's checkpoints: ``sft.jsonl`` must start with steps
    ``0 .. done - 1`` each once (else the checkpoint falls back to an older one); returns
    those records."""
    return jsonl.leading_steps(run / "sft.jsonl", int(restored["data_state"]["sft_step"]),
                               "SFT steps", RunError)


def _restore(run: RunDir, learner: Learner, steps: int, clock: PhaseClock) -> int:
    """Restore the newest good warm-start checkpoint into ``learner`` and its time figures
    into ``clock``; the number of steps it has done, and ``sft.jsonl`` keeps exactly those
    steps. 0 (said on stderr) when
    there is none, or when none can be restored: those are moved to
    ``sft_checkpoints_unrestorable/`` with a one-line warning, and the warm start, a
    function of the configuration, is redone from step 0."""
    try:
        items = learner.restore_latest()
    except CheckpointRestoreError as err:
        manager = learner.checkpoint
        manager.set_aside(manager.all_steps())
        warnings.warn(f"no warm-start checkpoint in {run.sft_checkpoint_dir} can be restored "
                      f"(the newest: {err.newest}; details: {err.log_file}): moved to "
                      f"{manager.unrestorable_dir}; the warm start starts over at step 0",
                      CheckpointFallbackWarning, stacklevel=2)
        return 0
    if items is None:
        say(run, f"no warm-start checkpoint in {run.sft_checkpoint_dir}: the warm start starts "
                 "at step 0")
        return 0
    done = int(items["data_state"]["sft_step"])
    clock.load_state_dict(items["data_state"].get("phases"))
    if run.writer:
        jsonl.rewrite_lines(run / "sft.jsonl", map(json.dumps, items["verified"]))
    say(run, (f"reusing the finished warm start ({done} SFT steps) from {items['path']}"
              if done == steps else
              f"continuing the warm start at SFT step {done} from {items['path']}"))
    return done
