"""The RL loop: one learner step per rollout batch.

Every step ``n``:

1. the rollout source hands over batch ``n`` (`experiments.sources.RolloutSource`;
   how stale it is, is the source's business: a seeded plan, or a sampler thread);
2. its rollout metrics are recorded against the learner's current version;
3. advantages from every process's rewards (`Job.advantages`);
4. ``learner.train_on``: ``learner.minibatches x learner.epochs`` optimizer updates and
   one new policy version (``docs/learner.md``);
5. the new weights are published to the source;
6. the hooks whose cadence has come run: the step's line in ``metrics.jsonl`` (every
   step, `experiments.step_log`), a checkpoint (every ``checkpoint.every`` steps and at
   the end, `experiments.checkpointing`).

The job around it (`experiments.job`) builds the parts, evaluates before and after, and
writes the summary.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from experiments import multiprocess as mp
from experiments.progress import progress_bar
from experiments.rollouts import RolloutBatch
from experiments.sources import RolloutSource


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a hook sees after step ``step``: ``record`` (the loop's metrics of it, with
    ``step`` and ``version``), ``learner_metrics`` (the learner's metrics of the
    *previous* step, None on the first: the learner hands them over one step late) and
    ``batch``."""

    step: int
    record: dict[str, Any]
    learner_metrics: dict[str, Any] | None
    batch: RolloutBatch


@dataclasses.dataclass(frozen=True)
class Hook:
    """``fn(info)`` after every step ``n`` with ``(n + 1) % every == 0`` (``every`` 0:
    never), and after the last step when ``at_end``."""

    fn: Callable[[StepInfo], None]
    every: int = 1
    at_end: bool = False

    def due(self, done: int, steps: int) -> bool:
        return bool(self.every and done % self.every == 0) or (self.at_end and done == steps)


def run_rl(job: Any, source: RolloutSource, hooks: Sequence[Hook], start: int, steps: int,
           show_progress: bool = True) -> None:
    """Learner steps ``start .. steps - 1`` of ``job`` (a `experiments.job.Job`) on the
    batches of ``source`` (see the module docstring)."""
    learner, clock = job.learner, job.clock
    name = "RL async" if source.mode == "async" else "RL"
    bar = progress_bar(range(start, steps), desc=f"{name} ({job.cfg.objective.name})",
                       show=show_progress)
    for n in bar:
        version = learner.version
        batch, timing = source.next_batch()
        record = {"step": n, "version": version,
                  **mp.global_rollout_metrics(batch, version), **timing}
        job.token_samples(n, batch)  # scored by the weights about to train on it
        start_s = time.perf_counter()
        previous = learner.train_on(batch.trajectories, job.advantages(batch))
        version = learner.version  # waits for the step: the sampler needs its weights
        learn_s = time.perf_counter() - start_s
        clock.add("rl/learn_s", learn_s)
        tokens = sum(int(np.sum(t.loss_mask)) for t in batch.trajectories)
        record.update({"time/learn_s": learn_s,
                       "throughput/trained_tokens_per_s": tokens / max(learn_s, 1e-9)})
        source.publish(job.published(), version)
        postfix = dict(reward=f"{record['reward/mean']:.3f}",
                       inter=record["staleness/inter_mean"],
                       intra=record["staleness/intra_mean"])
        if source.mode == "async":
            postfix["wait"] = f"{timing['time/wait_s']:.2f}s"
        bar.set_postfix(**postfix)
        info = StepInfo(n, record, previous, batch)
        for hook in hooks:
            if hook.due(n + 1, steps):
                hook.fn(info)
