"""Weights & Biases logging (optional extra ``wandb``), process 0 only.

Gets exactly what TensorBoard gets from `learners.logging.Loggers`: every scalar under its
TensorBoard name at ``step`` = the learner step, ``version`` (as in ``metrics.jsonl``: in the
main job the policy version of the step's batch), and each ``hist/*`` bucket-count vector as
a ``wandb.Histogram`` over its
`learners.step.HISTOGRAM_EDGES` (skipped when empty, as in TensorBoard). The resolved run
config goes to the W&B run config.

``<run_dir>/wandb.json`` records the run: ``id``, ``project``, ``entity``, ``group``,
``name``, ``mode``, ``url`` (online; None offline) and ``path`` (the local run directory W&B
writes, ``<dir>/wandb/<mode>-run-<time>-<id>``; an offline run is uploaded later with
``wandb sync <path>``). A resumed job continues the same W&B run (``resume="allow"`` with
the recorded id). W&B keeps the first value logged at a step: steps a resumed job redoes
keep the values of the interrupted run (identical in the deterministic modes).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Literal, Mapping

import jax
import numpy as np

from learners.step import HISTOGRAM_EDGES

RECORD = "wandb.json"


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    """Where step metrics go besides ``metrics.jsonl``: TensorBoard always (``<run_dir>/tb``);
    Weights & Biases when ``wandb`` is true. Nothing here can change a run's results.

    Attributes:
      wandb: also log to W&B (``pip install -e '.[wandb]'``); same metric names as
        TensorBoard, step = learner step, the run's URL or offline path is recorded in
        ``<run_dir>/wandb.json``.
      wandb_project: W&B project.
      wandb_entity: W&B team or user; empty = the logged-in account's default.
      wandb_group: W&B run group (e.g. a sweep's name); empty = none.
      wandb_mode: ``online`` (upload while running) or ``offline`` (write files only;
        upload later with ``wandb sync <path>``, path in ``wandb.json``). Offline makes no
        network calls.
      wandb_dir: where W&B writes its files; empty = the run directory (``<run_dir>/wandb``).
    """

    wandb: bool = False
    wandb_project: str = "entr-jax"
    wandb_entity: str = ""
    wandb_group: str = ""
    wandb_mode: Literal["online", "offline"] = "online"
    wandb_dir: str = ""

    def __post_init__(self):
        if self.wandb_mode not in ("online", "offline"):
            raise ValueError(
                f"logging.wandb_mode must be 'online' or 'offline', got {self.wandb_mode!r}")
        if not self.wandb_project.strip():
            raise ValueError("logging.wandb_project must be a non-empty name")


def import_wandb():
    """The ``wandb`` module.

    Raises:
      RuntimeError: it is not installed; the message names the extra to install.
    """
    try:
        import wandb
    except ImportError as e:
        raise RuntimeError(
            "logging.wandb=true needs Weights & Biases: pip install -e '.[wandb]' "
            f"(wandb==0.31.0), or run with --logging.wandb false ({e})") from None
    return wandb


class WandbLogger:
    """``log_hparams`` / ``log`` / ``close`` to one W&B run (see module doc).

    Args:
      run_dir: the run directory (``wandb.json`` goes there; W&B's files too unless
        ``config.wandb_dir``).
      config: `LoggingConfig` (project, entity, group, mode, dir).
      name: run name shown in W&B.
      resume: continue the run recorded in ``run_dir/wandb.json`` (a fresh run otherwise).
      enabled: defaults to ``jax.process_index() == 0``; other processes log nothing.

    Raises:
      RuntimeError: ``wandb`` is not installed (`import_wandb`).
    """

    def __init__(self, run_dir: str | Path, config: LoggingConfig, *, name: str,
                 resume: bool = False, enabled: bool | None = None):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self._run = None
        if not self.enabled:
            return
        self._wandb = import_wandb()
        run_dir = Path(run_dir)
        record_path = run_dir / RECORD
        run_id = None
        if resume and record_path.exists():
            run_id = json.loads(record_path.read_text()).get("id")
        files_dir = Path(config.wandb_dir) if config.wandb_dir else run_dir
        files_dir.mkdir(parents=True, exist_ok=True)
        self._run = self._wandb.init(
            project=config.wandb_project, entity=config.wandb_entity or None,
            group=config.wandb_group or None, name=name, mode=config.wandb_mode,
            dir=str(files_dir), id=run_id, resume="allow" if run_id else None)
        self.record = {
            "id": self._run.id, "project": config.wandb_project,
            "entity": config.wandb_entity or None, "group": config.wandb_group or None,
            "name": name, "mode": config.wandb_mode,
            "url": self._run.url if config.wandb_mode == "online" else None,
            "path": str(Path(self._run.settings.sync_dir).resolve()),
        }
        tmp = record_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.record, indent=2, sort_keys=True))
        os.replace(tmp, record_path)

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Put the (nested) run config into the W&B run config."""
        if self._run is not None:
            self._run.config.update(dict(hparams), allow_val_change=True)

    def log(self, step: int, version: int | None, metrics: Mapping[str, Any]) -> None:
        """Log host ``metrics`` of ``step`` under their TensorBoard names (module doc)."""
        if self._run is None:
            return
        row: dict[str, Any] = {}
        if version is not None:
            row["version"] = float(version)
        for key, value in metrics.items():
            if key in HISTOGRAM_EDGES:
                counts = np.asarray(value, np.float64)
                if counts.sum() > 0:
                    row[key] = self._wandb.Histogram(
                        np_histogram=(counts.tolist(), HISTOGRAM_EDGES[key].astype(np.float64).tolist()))
                continue
            row[key] = float(value)
        self._run.log(row, step=int(step))

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
