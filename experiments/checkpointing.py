"""Checkpoints of the RL loop: what is saved at a step, and how a resume restores it.

A checkpoint (every ``checkpoint.every`` steps and at the end, `experiments.loop`) holds
the learner state (orbax, `learners.checkpoint.CheckpointManager`), every process's
data-iterator position and delay line (the rollout source's generated, not yet consumed
batches), and the job's bookkeeping (``book``: next step, elapsed time, evaluations,
phase clock); the parameter ring goes to ``ring/<step>.npz`` (written atomically, before
the checkpoint, so a checkpoint never lacks its ring; its size and versions are stored in
the checkpoint, `experiments.state_io`). A checkpoint whose weights, ring file, data
position or delay line cannot be read, or whose steps ``metrics.jsonl`` does not hold
each once, falls back to the next older one (`verify`). A restore drops metric lines past
the checkpoint, so a killed run loses and repeats no batch, and ``metrics.jsonl`` holds
every step exactly once.
"""

from __future__ import annotations

import json
import time
from typing import Any

from entr_jax.staleness import DelayLine, ParamRing
from experiments import jsonl
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


class MetricsGapError(RuntimeError):
    """``metrics.jsonl`` lacks (or repeats) a step that a checkpoint has already done."""


def verify(run: RunDir, cfg: RunConfig, restored: dict[str, Any], template: Any, data: Any
           ) -> dict[str, Any]:
    """Everything a restored checkpoint needs besides the learner state, read and checked
    (the ``verify`` of `learners.checkpoint.CheckpointManager`; raising makes the restore
    fall back to the next older checkpoint, which redoes the steps after it):

    * the parameter ring saved with it, against the record in it (`state_io.load_ring`);
    * this process's data position, set into ``data`` (a state it refuses, e.g. one
      lacking a key, raises);
    * this process's delay line (`state_io.load_delay_line`);
    * ``metrics.jsonl``: its lines start with steps ``0 .. start_step - 1``, each once (a
      missing, partial or repeated line is a gap a resume from here would keep).

    Returns ``{"ring", "line", "metrics"}`` (the ring, the loaded `DelayLine`, the metric
    records to keep).
    """
    queue = restored["queue_state"]
    start = queue["book"]["start_step"]
    ring = state_io.load_ring(run / "ring" / f"{start}.npz", cfg.staleness.ring_size,
                              template=template, expect=queue.get("ring"))
    data.set_state(mp.own(restored["data_state"], "data_state"))
    line = DelayLine(cfg.staleness)
    state_io.load_delay_line(line, mp.own(queue["delay_line"], "delay_line"))
    metrics = jsonl.leading_steps(run / "metrics.jsonl", start, error=MetricsGapError)
    return {"ring": ring, "line": line, "metrics": metrics}


def restore(run: RunDir, learner: Any, plan: Any
            ) -> tuple[dict[str, Any], ParamRing, DelayLine] | None:
    """Restore the newest checkpoint that restores and passes `verify` (which also sets
    the data position) into ``learner``; returns its ``(book, ring, delay line)``, or
    None (said on stderr) when there is none. Metric lines past the checkpoint are
    dropped; the resume is announced (`experiments.resume.announce`, with ``plan``)."""
    items = learner.restore_latest()
    if items is None:
        resume_policy.say(run, f"no checkpoint in {run.checkpoint_dir}: starting fresh")
        return None
    book, verified = items["queue_state"]["book"], items["verified"]
    if run.writer:
        jsonl.rewrite_lines(run / "metrics.jsonl", map(json.dumps, verified["metrics"]))
    run.truncate_jsonl("timing.jsonl", book["start_step"])
    resume_policy.announce(run, plan, book["start_step"], items["path"],
                           mp.own(items["data_state"], "data_state")["batch_index"])
    return book, verified["ring"], verified["line"]
