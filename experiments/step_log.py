"""One line per learner step in ``metrics.jsonl`` (deterministic values), ``timing.jsonl``
(wall-clock ones: ``time/*``, ``throughput/*``) and TensorBoard.

A step's line joins the loop's record of it (rollout metrics, timings) with the learner's
metrics of the step, which the learner hands over one step later (`Learner.train_on`
returns the previous step's), and the fleet's counters (`experiments.fleet`)."""

from __future__ import annotations

from typing import Any

from experiments import multiprocess as mp
from experiments.fleet import fleet_metrics
from experiments.rundir import RunDir

# metric keys that depend on wall-clock time; they go to timing.jsonl, not metrics.jsonl
TIMING_PREFIXES = ("time/", "throughput/")


def split_timing(record: dict[str, Any]) -> tuple[dict, dict]:
    """``(deterministic, timing)`` parts of a record (by `TIMING_PREFIXES`)."""
    timing = {k: v for k, v in record.items() if k.startswith(TIMING_PREFIXES)}
    return {k: v for k, v in record.items() if k not in timing}, timing


class StepLog:
    """Writes step lines (module docstring) to ``run``, TensorBoard ``logger`` and with
    the counters of ``sampler``."""

    def __init__(self, run: RunDir, logger: Any, sampler: Any):
        self.run, self.logger, self.sampler = run, logger, sampler
        self.pending: list[dict[str, Any]] = []  # records awaiting learner metrics

    def add(self, record: dict[str, Any], learner_metrics: dict[str, Any] | None) -> None:
        """Queue this step's ``record`` (with ``step`` and ``version``) and write the oldest
        queued one with ``learner_metrics`` (the previous step's; None: nothing yet)."""
        self.pending.append(record)
        self.write(learner_metrics)

    def write(self, learner_metrics: dict[str, Any] | None) -> None:
        """Write the oldest queued record with these learner metrics (None: nothing)."""
        if learner_metrics is None:
            return
        record = self.pending.pop(0)
        step, version = record.pop("step"), record.pop("version")
        merged = {**record, **mp.global_batch_stats(learner_metrics),
                  **fleet_metrics(self.sampler)}
        scalars = {k: v for k, v in merged.items() if not k.startswith("hist/")}
        metrics, timing = split_timing(scalars)
        self.run.append_jsonl("metrics.jsonl", {"step": step, "version": version, **metrics})
        self.run.append_jsonl("timing.jsonl", {"step": step, **timing})
        # tensorboard: scalars and hist/* bucket counts; the staleness histograms are lists
        self.logger.log(step, version, {k: v for k, v in merged.items()
                                        if k.startswith("hist/") or isinstance(v, (int, float))})
