"""Metrics logging: tensorboardX scalars/histograms + a JSONL file, process 0 only; optionally
also Weights & Biases (`learners.wandb_logger`, which also holds `LoggingConfig`, the run's
choice of backends), with the same metric names (`make_logger`).

`DeferredMetrics` implements "fetch step n-1's metrics to the host after dispatching step
n" (``docs/design.md``, "Jit and sharding"): the device arrays of a step are
held until the next step has been dispatched, so the host never waits for the device
between steps.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np

from learners.step import HISTOGRAM_EDGES
from learners.wandb_logger import LoggingConfig, WandbLogger, import_wandb

__all__ = ["DeferredMetrics", "LoggingConfig", "Loggers", "MetricsLogger", "make_logger"]


class DeferredMetrics:
    """Holds one step's device metrics until the next step is dispatched.

    Usage::

        deferred = DeferredMetrics()
        for batch in batches:
            state, metrics = step(state, batch)          # dispatched, not awaited
            previous = deferred.push(int_step, metrics)   # host copy of the step before
            if previous is not None: logger.log(*previous)
        last = deferred.flush()
    """

    def __init__(self):
        self._pending: tuple[int, int | None, Any] | None = None

    def push(
        self, step: int, metrics: Mapping[str, Any], version: int | None = None
    ) -> tuple[int, int | None, dict[str, Any]] | None:
        """Store ``metrics`` of ``step``; return ``(step, version, host metrics)`` of the
        previously pushed step (None on the first push)."""
        previous = self.flush()
        self._pending = (step, version, metrics)
        return previous

    def flush(self) -> tuple[int, int | None, dict[str, Any]] | None:
        """Fetch and return the pending step's metrics (None if nothing is pending)."""
        if self._pending is None:
            return None
        step, version, metrics = self._pending
        self._pending = None
        return step, version, to_host(metrics)


def to_host(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Device metrics -> Python floats (scalars) and numpy arrays (histogram counts)."""
    host = jax.device_get(dict(metrics))
    return {k: (float(v) if np.ndim(v) == 0 else np.asarray(v)) for k, v in host.items()}


class MetricsLogger:
    """Writes scalars (tagged with step and version), histograms and hparams.

    Only process 0 writes (``enabled`` defaults to ``jax.process_index() == 0``); on other
    processes every method is a no-op. Files under ``logdir``: tensorboard event files and
    ``metrics.jsonl`` (one JSON object per logged step: ``step``, ``version`` and every
    scalar metric; ``jsonl=False`` leaves it to the caller).

    ``purge_step``: a run resumed at step ``s`` passes ``s``: tensorboardX records a
    ``SessionLog.START`` at ``s`` and TensorBoard drops the earlier files' events with
    step >= ``s`` (they are rewritten by the resumed run), so curves have no duplicate or
    out-of-order steps.
    """

    def __init__(self, logdir: str | Path, *, enabled: bool | None = None, jsonl: bool = True,
                 purge_step: int | None = None):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.logdir = Path(logdir)
        self._writer = None
        self._jsonl = None
        if self.enabled:
            from tensorboardX import SummaryWriter

            self.logdir.mkdir(parents=True, exist_ok=True)
            # tensorboardX names files by the second and opens them with "wb": the ns
            # suffix keeps a second writer in the same second from overwriting the first
            # one's file, and sorts after it (TensorBoard reads files in name order)
            self._writer = SummaryWriter(str(self.logdir), purge_step=purge_step,
                                         filename_suffix=f".{time.time_ns()}")
            if jsonl:
                self._jsonl = open(self.logdir / "metrics.jsonl", "a", encoding="utf-8")

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Record the (flattened) hyper-parameters once, at step 0."""
        if not self.enabled:
            return
        flat = {
            k: (v if isinstance(v, (int, float, str, bool)) else str(v))
            for k, v in _flatten(hparams).items()
        }
        self._writer.add_hparams(flat, {"hparams/logged": 1.0}, name="hparams", global_step=0)
        self._writer.add_text("config", "```\n" + json.dumps(flat, indent=1) + "\n```", 0)

    def log(self, step: int, version: int | None, metrics: Mapping[str, Any]) -> None:
        """Write host ``metrics`` of ``step``: scalars at ``global_step=step`` (plus
        ``version``, the name ``metrics.jsonl`` gives it), ``hist/*`` bucket counts as
        histograms, one JSONL line. ``version`` is the caller's (the main job: the policy
        version of the step's batch); a learner metric ``train/version`` (the version after
        the step) keeps its own name."""
        if not self.enabled:
            return
        record: dict[str, Any] = {"step": int(step)}
        if version is not None:
            record["version"] = int(version)
            self._writer.add_scalar("version", float(version), step)
        for key, value in metrics.items():
            if key in HISTOGRAM_EDGES:
                self._add_hist(key, np.asarray(value, np.float64), step)
                continue
            value = float(value)
            self._writer.add_scalar(key, value, step)
            record[key] = value if math.isfinite(value) else str(value)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()

    def _add_hist(self, key: str, counts: np.ndarray, step: int) -> None:
        edges = HISTOGRAM_EDGES[key].astype(np.float64)
        total = float(counts.sum())
        if total <= 0:
            return
        centers = 0.5 * (edges[1:] + edges[:-1])
        nonzero = np.nonzero(counts)[0]
        self._writer.add_histogram_raw(
            key,
            min=float(edges[nonzero[0]]),
            max=float(edges[nonzero[-1] + 1]),
            num=total,
            sum=float(np.sum(counts * centers)),
            sum_squares=float(np.sum(counts * centers**2)),
            bucket_limits=edges[1:].tolist(),
            bucket_counts=counts.tolist(),
            global_step=step,
        )

    def close(self) -> None:
        if self.enabled:
            self._writer.close()
            if self._jsonl is not None:
                self._jsonl.close()


class Loggers:
    """Fan-out: every call goes to each logger in turn (same ``log_hparams`` / ``log`` /
    ``close`` interface as `MetricsLogger`), so every backend gets the same names and values."""

    def __init__(self, *loggers):
        self.loggers = loggers

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        for logger in self.loggers:
            logger.log_hparams(hparams)

    def log(self, step: int, version: int | None, metrics: Mapping[str, Any]) -> None:
        for logger in self.loggers:
            logger.log(step, version, metrics)

    def close(self) -> None:
        """Close every logger (all of them, even when one fails; the first error is raised)."""
        error = None
        for logger in self.loggers:
            try:
                logger.close()
            except Exception as e:  # noqa: BLE001 - closed the others first, then re-raised
                error = error or e
        if error is not None:
            raise error


def make_logger(logdir: str | Path, config: LoggingConfig, *, run_dir: str | Path, name: str,
                resume: bool = False, enabled: bool | None = None,
                jsonl: bool = True, purge_step: int | None = None) -> MetricsLogger | Loggers:
    """The run's logger: `MetricsLogger` at ``logdir``, fanned out to a
    `learners.wandb_logger.WandbLogger` when ``config.wandb``.

    Args:
      logdir: TensorBoard directory.
      config: `LoggingConfig`.
      run_dir: the run directory (``wandb.json`` and, by default, W&B's files go there).
      name: run name shown in W&B.
      resume: continue the W&B run recorded in ``run_dir/wandb.json``, if any.
      enabled, jsonl, purge_step: as in `MetricsLogger`.

    Raises:
      RuntimeError: ``config.wandb`` without the ``wandb`` package (names the extra), before
        anything is written.
    """
    if not config.wandb:
        return MetricsLogger(logdir, enabled=enabled, jsonl=jsonl, purge_step=purge_step)
    import_wandb()  # fail before creating any file
    tensorboard = MetricsLogger(logdir, enabled=enabled, jsonl=jsonl, purge_step=purge_step)
    return Loggers(tensorboard, WandbLogger(run_dir, config, name=name, resume=resume,
                                            enabled=enabled))


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "/"))
        else:
            out[name] = value
    return out
