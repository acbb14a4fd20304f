"""Checkpoints of the RL loop: what is saved at a step, and how a resume restores it.

A checkpoint (every ``checkpoint.every`` steps and at the end, `experiments.loop`) holds
the learner state (orbax, `learners.checkpoint.CheckpointManager`), every process's
data-iterator position and delay line (the rollout source's generated, not yet consumed
batches), and the job's bookkeeping (``book``: next step, elapsed time, evaluations,
phase clock); the parameter ring goes to ``ring/<step>.npz`` (written atomically, before
the checkpoint, so a checkpoint never lacks its ring; its size and versions are stored in
the checkpoint, `experiments.state_io`). A checkpoint whose weights or ring file cannot be
read falls back to the next older one. A restore drops metric lines past the checkpoint,
so a killed run loses and repeats no batch.
"""

from __future__ import annotations

import json
import time
from typing import Any

from entr_jax.staleness import DelayLine, ParamRing
from experiments import multiprocess as mp
from experiments import resume as resume_policy
from experiments import state_io
from experiments.config import RunConfig
from experiments.errors import RunError
from experiments.phases import PhaseClock
from experiments.rundir import RunDir


def save(cfg: RunConfig, run: RunDir, learner: Any, data: Any, source: Any,
         book: dict[str, Any], next_step: int, clock: PhaseClock) -> None:
    """Save everything needed to continue at ``next_step``: ``book`` (updated here with
    ``start_step``; the caller sets the elapsed times and ``phases``), the learner, the
    data position, and the rollout ``source``'s parked batches and ring, with the source
    held still (`experiments.sources.RolloutSource.hold`).

    Raises:
      RunError: orbax skipped the step because it already exists.
    """
    start = time.perf_counter()
    with source.hold():
        book["start_step"] = next_step
        queue = {"delay_line": mp.per_process(
                     state_io.delay_line_json(source.line, source.pending(), next_step)),
                 "book": book, "ring": None}
        if run.writer:  # the ring first: a checkpoint never lacks its ring file
            queue["ring"] = state_io.save_ring(run / "ring" / f"{next_step}.npz", source.ring)
        saved = learner.save(data_state=mp.per_process(data.get_state()), queue_state=queue,
                             config=json.loads(cfg.to_json()))
        if not saved:  # orbax skips a step that already exists: never silently
            raise RunError(f"checkpoint step {next_step} was not saved: "
                           f"{run.checkpoint_dir / str(next_step)} already exists")
        learner.checkpoint.wait()
    if run.writer:
        state_io.prune_rings(run / "ring", learner.checkpoint.all_steps())
    clock.add("rl/checkpoint_s", time.perf_counter() - start)


def load_ring(run: RunDir, cfg: RunConfig, restored: dict[str, Any], template: Any) -> ParamRing:
    """The parameter ring saved with a restored checkpoint, read and checked against the
    record in it (the ``verify`` of `learners.checkpoint.CheckpointManager`); raising
    makes the restore fall back to an older checkpoint."""
    queue = restored["queue_state"]
    return state_io.load_ring(run / "ring" / f"{queue['book']['start_step']}.npz",
                              cfg.staleness.ring_size, template=template,
                              expect=queue.get("ring"))


def restore(run: RunDir, learner: Any, data: Any, line: DelayLine, plan: Any
            ) -> tuple[dict[str, Any], ParamRing] | None:
    """Restore the newest readable checkpoint into ``learner``, ``data`` and ``line``;
    returns its ``(book, ring)``, or None (said on stderr) when there is none. Metric
    lines past the checkpoint are dropped; the resume is announced
    (`experiments.resume.announce`, with ``plan``)."""
    items = learner.restore_latest()
    if items is None:
        resume_policy.say(run, f"no checkpoint in {run.checkpoint_dir}: starting fresh")
        return None
    queue = items["queue_state"]
    book = queue["book"]
    data_state = mp.own(items["data_state"], "data_state")
    data.set_state(data_state)
    state_io.load_delay_line(line, mp.own(queue["delay_line"], "delay_line"))
    for name in ("metrics.jsonl", "timing.jsonl"):
        run.truncate_jsonl(name, book["start_step"])
    resume_policy.announce(run, plan, book["start_step"], items["path"],
                           data_state["batch_index"])
    return book, items["verified"]
