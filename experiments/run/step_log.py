"""One line per learner step in ``metrics.jsonl`` (deterministic values), ``timing.jsonl``
(wall-clock ones: ``time/*``, ``throughput/*``) and TensorBoard.

A step's line joins the loop's record of it (rollout metrics, timings) with the learner's
metrics of the step (paired by the loop, `experiments.run.loop`) and the sampler's counters
taken when the step's batch was handed over (`experiments.run.sources.fleet_counters`)."""

from __future__ import annotations

from typing import Any

from experiments.run import multiprocess as mp
from experiments.run.loop import StepInfo
from experiments.run.rundir import RunDir

# metric keys that depend on wall-clock time; they go to timing.jsonl, not metrics.jsonl
TIMING_PREFIXES = ("time/", "throughput/")


def split_timing(record: dict[str, Any]) -> tuple[dict, dict]:
    """``(deterministic, timing)`` parts of a record (by `TIMING_PREFIXES`)."""
    timing = {k: v for k, v in record.items() if k.startswith(TIMING_PREFIXES)}
    return {k: v for k, v in record.items() if k not in timing}, timing


class StepLog:
    """Writes step lines (module docstring) to ``run`` and the TensorBoard ``logger``."""

    def __init__(self, run: RunDir, logger: Any):
        self.run, self.logger = run, logger

    def write(self, info: StepInfo) -> None:
        """Write one complete step (the ``"logged"`` phase of `experiments.run.loop`): its
        record, its learner metrics and the sampler's counters after its batch."""
        record = dict(info.record)
        step, version = record.pop("step"), record.pop("version")
        merged = {**record, **mp.global_batch_stats(info.learner_metrics), **info.counters}
        scalars = {k: v for k, v in merged.items() if not k.startswith("hist/")}
        metrics, timing = split_timing(scalars)
        self.run.append_jsonl("metrics.jsonl", {"step": step, "version": version, **metrics})
        self.run.append_jsonl("timing.jsonl", {"step": step, **timing})
        # tensorboard: scalars and hist/* bucket counts; the staleness histograms are lists
        self.logger.log(step, version, {k: v for k, v in merged.items()
                                        if k.startswith("hist/") or isinstance(v, (int, float))})
