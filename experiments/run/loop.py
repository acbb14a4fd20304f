"""The RL loop: one learner step per rollout batch, and the hooks that watch it.

`run_rl` takes what it uses and nothing else: the learner, the rollout source, the
advantage function and the hooks. Every step ``n``:

1. the rollout source hands over batch ``n`` (`experiments.run.sources.RolloutSource`;
   how stale it is, is the source's business: a seeded plan, or a sampler thread), with
   the sampler's counters at that moment;
2. its rollout metrics are recorded against the learner's current version;
3. hooks of phase ``"before_update"`` see the batch (token samples: scored by the
   weights about to train on it);
4. advantages of this process's rows (``advantages(batch)``);
5. ``learner.train_on``: ``learner.minibatches x learner.epochs`` optimizer updates and
   one new policy version (``docs/learner.md``);
6. the new weights are published to the source;
7. hooks of phase ``"after_update"`` (progress, clock);
8. hooks of phase ``"logged"`` receive every step whose learner metrics have arrived.
   The learner hands a step's metrics over one call late (`Learner.train_on` returns the
   previous call's, so dispatching the next step does not wait for them); this loop is
   the one place that pairs a step's record with its metrics, so a ``logged`` hook always
   sees one complete step (the step log, `experiments.run.step_log`);
9. hooks of phase ``"barrier"`` whose cadence has come (a checkpoint) run after the
   learner is flushed and step ``n`` has been logged, so nothing is pending.

After the last step the learner is flushed and the last step logged.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Literal, Sequence

import numpy as np

from experiments.run import multiprocess as mp
from experiments.run.rollouts import RolloutBatch
from experiments.run.sources import RolloutSource

Phase = Literal["before_update", "after_update", "logged", "barrier"]


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """One learner step as the hooks see it.

    Attributes:
      step: the step ``n``.
      record: the loop's metrics of it (with ``step`` and ``version``: the learner
        version that trained on it); ``time/learn_s`` and the throughput from phase
        ``"after_update"`` on.
      batch: the rollout batch.
      counters: the sampler's cumulative counters after the batch was handed over
        (``sglang/*``; empty for the embedded sampler).
      learner_metrics: the learner's host metrics of this step (phase ``"logged"``
        only; None before).
    """

    step: int
    record: dict[str, Any]
    batch: RolloutBatch
    counters: dict[str, float]
    learner_metrics: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Hook:
    """``fn(info)`` in ``phase`` (module docstring) of every step ``n`` with
    ``(n + offset) % every == 0`` (``every`` 0: never; the default ``offset`` 1 counts
    steps done: a checkpoint every 50 steps after steps 49, 99, ...; ``offset`` 0 counts
    step indices: token samples at steps 0, 10, ...), and of the last step when
    ``at_end``. A ``"logged"`` hook sees every step."""

    fn: Callable[[StepInfo], None]
    phase: Phase = "logged"
    every: int = 1
    at_end: bool = False
    offset: int = 1

    def due(self, step: int, steps: int) -> bool:
        """Whether the hook runs at step ``step`` of a run of ``steps``."""
        return (bool(self.every and (step + self.offset) % self.every == 0)
                or (self.at_end and step == steps - 1))


def run_rl(learner: Any, source: RolloutSource,
           advantages: Callable[[RolloutBatch], np.ndarray], hooks: Sequence[Hook],
           start: int, steps: int) -> None:
    """Learner steps ``start .. steps - 1`` of ``learner`` (a `learners.learner.Learner`)
    on the batches of ``source`` (started here and closed at the end, also on error),
    with ``advantages(batch)`` (``[rows] float32``, this process's rows) and ``hooks``
    (see the module docstring)."""
    def run(phase: Phase, info: StepInfo, n: int) -> None:
        for hook in hooks:
            if hook.phase == phase and (phase == "logged" or hook.due(n, steps)):
                hook.fn(info)

    def log(info: StepInfo, metrics: dict[str, Any]) -> None:
        run("logged", dataclasses.replace(info, learner_metrics=metrics), info.step)

    source.start()
    try:
        pending: StepInfo | None = None  # the step whose learner metrics have not arrived
        for n in range(start, steps):
            version = learner.version
            batch, timing = source.next_batch()
            record = {"step": n, "version": version,
                      **mp.global_rollout_metrics(batch, version), **timing}
            info = StepInfo(n, record, batch, source.counters())
            run("before_update", info, n)
            start_s = time.perf_counter()
            previous = learner.train_on(batch.trajectories, advantages(batch))
            version = learner.version  # waits for the step: the sampler needs its weights
            learn_s = time.perf_counter() - start_s
            tokens = sum(int(np.sum(t.loss_mask)) for t in batch.trajectories)
            record.update({"time/learn_s": learn_s,
                           "throughput/trained_tokens_per_s": tokens / max(learn_s, 1e-9)})
            source.publish(mp.process_local(learner.published_weights()), version)
            run("after_update", info, n)
            if previous is not None and pending is not None:
                log(pending, previous)
            pending = info
            barrier = any(h.phase == "barrier" and h.due(n, steps) for h in hooks)
            if barrier or n == steps - 1:
                metrics = learner.flush()
                if metrics is not None:
                    log(pending, metrics)
                pending = None
            run("barrier", info, n)
    finally:
        source.close()
