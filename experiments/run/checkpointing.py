"""Checkpoints of the RL loop: what is saved at a step, and how a resume restores it.

A checkpoint (every ``checkpoint.every`` steps and at the end, `experiments.run.loop`) holds
the learner state (orbax, `learners.checkpoint.CheckpointManager`), every process's
data-iterator position and the rollout source's state (`RolloutSource.state_dict`: its
delay line, the generated, not yet consumed batches, and its parameter ring), and the
job's bookkeeping (`Book`: next step, elapsed time, evaluations, phase clock); the
parameter ring goes to ``ring/<step>.npz`` (written atomically, before
the checkpoint, so a checkpoint never lacks its ring; its size and versions are stored in
the checkpoint, `experiments.run.state_io`). A checkpoint whose weights, ring file, data
position or delay line cannot be read, or whose steps ``metrics.jsonl`` does not hold
each once, falls back to the next older one (`verify`). A restore drops metric lines past
the checkpoint, so a killed run loses and repeats no batch, and ``metrics.jsonl`` holds
every step exactly once.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from entr_jax.staleness import DelayLine
from experiments.run import jsonl
from experiments.run import multiprocess as mp
from experiments.run import resume as resume_policy
from experiments.run import state_io
from experiments.run.config import RunConfig
from experiments.run.errors import RunError
from experiments.run.phases import PhaseClock
from experiments.run.rundir import RunDir
from experiments.run.sources import load_line


@dataclasses.dataclass(frozen=True)
class Book:
    """The job's bookkeeping, stored in every RL checkpoint (``queue_state["book"]``).

    Attributes:
      start_step: the first RL step still to do.
      elapsed_s: wall seconds of the run so far, including the time before a resume.
      evals: the evaluations done, by phase (``init``, ``before_rl``, ``after_rl``):
        what `experiments.run.evaluation.Evaluator.evaluate` returned.
      rl_wall_s: wall seconds of the RL phase so far.
      phases: the phase clock's state (`experiments.run.phases.PhaseClock.state_dict`), or
        None before the first checkpoint.
    """

    start_step: int = 0
    elapsed_s: float = 0.0
    evals: dict[str, Any] = dataclasses.field(default_factory=dict)
    rl_wall_s: float = 0.0
    phases: dict[str, Any] | None = None

    def with_eval(self, phase: str, result: dict[str, Any]) -> "Book":
        """This book with the evaluation of ``phase``."""
        return dataclasses.replace(self, evals={**self.evals, phase: result})

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Book":
        """Inverse of `to_json`; a checkpoint saved before ``rl_wall_s`` or ``phases``
        were stored takes their defaults."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def save(cfg: RunConfig, run: RunDir, learner: Any, data: Any, source: Any, book: Book,
         clock: PhaseClock) -> None:
    """Save everything needed to continue at ``book.start_step``: ``book``, the learner,
    the data position and the rollout ``source``'s state (`RolloutSource.state_dict`: its
    parked batches and ring), with the source held still (`RolloutSource.hold`).

    Raises:
      RunError: orbax skipped the step because it already exists.
    """
    start = time.perf_counter()
    next_step = book.start_step
    with source.hold():
        state = source.state_dict()
        queue = {"delay_line": mp.per_process(state["delay_line"]),
                 "book": book.to_json(), "ring": None}
        if run.writer:  # the ring first: a checkpoint never lacks its ring file
            queue["ring"] = state_io.save_ring(run / "ring" / f"{next_step}.npz", state["ring"])
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
    * this process's delay line (`experiments.run.sources.load_line`);
    * ``metrics.jsonl``: its lines start with steps ``0 .. start_step - 1``, each once (a
      missing, partial or repeated line is a gap a resume from here would keep).

    Returns ``{"source", "metrics"}``: the rollout source's state to load
    (`RolloutSource.load_state_dict`: ``{"ring", "delay_line"}``) and the metric records
    to keep.
    """
    queue = restored["queue_state"]
    start = queue["book"]["start_step"]
    ring = state_io.load_ring(run / "ring" / f"{start}.npz", cfg.staleness.ring_size,
                              template=template, expect=queue.get("ring"))
    data.set_state(mp.own(restored["data_state"], "data_state"))
    line = mp.own(queue["delay_line"], "delay_line")
    load_line(DelayLine(cfg.staleness), line)  # a line that cannot be read falls back here
    metrics = jsonl.leading_steps(run / "metrics.jsonl", start, error=MetricsGapError)
    return {"source": {"ring": ring, "delay_line": line}, "metrics": metrics}


def restore(run: RunDir, learner: Any, plan: Any) -> tuple[Book, dict[str, Any]] | None:
    """Restore the newest checkpoint that restores and passes `verify` (which also sets
    the data position) into ``learner``; returns its `Book` and the rollout source's
    state (for `RolloutSource.load_state_dict`), or
    None (said on stderr) when there is none. Metric lines past the checkpoint are
    dropped; the resume is announced (`experiments.run.resume.announce`, with ``plan``)."""
    items = learner.restore_latest()
    if items is None:
        resume_policy.say(run, f"no checkpoint in {run.checkpoint_dir}: starting fresh")
        return None
    book, verified = Book.from_json(items["queue_state"]["book"]), items["verified"]
    if run.writer:
        jsonl.rewrite_lines(run / "metrics.jsonl", map(json.dumps, verified["metrics"]))
    run.truncate_jsonl("timing.jsonl", book.start_step)
    resume_policy.announce(run, plan, book.start_step, items["path"],
                           mp.own(items["data_state"], "data_state")["batch_index"])
    return book, verified["source"]
