"""The run directory: what every run writes, in one place.

::

    <run_dir>/
      config.json        the resolved RunConfig
      meta.json          git commit, versions, devices, start time
      metrics.jsonl      one JSON object per RL step: deterministic metrics only, so two
                         runs with the same config and seed write identical files
      timing.jsonl       one JSON object per RL step: wall-clock figures (time/*, throughput/*)
      tb/                tensorboard events (metrics and timing)
      wandb.json         the Weights & Biases run (id, url or offline path), with
                         logging.wandb=true; W&B's own files go to wandb/ unless
                         logging.wandb_dir says otherwise
      checkpoints/       orbax checkpoints (learner state + JSON side items)
      ring/              parameter-ring snapshots that go with checkpoints (intra switches)
      token_samples/     step_<n>.npz: per-token (log_ratio, entropy_mu, kept) samples
      eval/              <phase>.json evaluation results (init, before_rl, after_rl)
      sft.jsonl          supervised warm-start loss per step (when sft.steps > 0)
      sft_model/         the warm-started policy in the Hugging Face layout (sft.save_model)
      exports/           weight exports pushed to an SGLang fleet (sampler.kind=sglang)
      summary.json       the headline numbers, written when the run finishes
"""

from __future__ import annotations

import json
import math
import pathlib
import platform
import subprocess
import time
from typing import Any, Mapping

import numpy as np


def git_commit(cwd: str | pathlib.Path | None = None) -> str:
    """The current commit (with ``-dirty`` when the tree has changes), or ``unknown``."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=cwd, capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


class RunDir:
    """Files of one run (see the module docstring).

    Only process 0 writes (multi-host runs); on other processes the writers are no-ops.
    """

    def __init__(self, path: str | pathlib.Path):
        import jax

        self.path = pathlib.Path(path)
        self.writer = jax.process_index() == 0

    def __truediv__(self, name: str) -> pathlib.Path:
        return self.path / name

    @property
    def checkpoint_dir(self) -> pathlib.Path:
        return self.path / "checkpoints"

    def has_checkpoint(self) -> bool:
        d = self.checkpoint_dir
        return d.is_dir() and any(p.name.isdigit() for p in d.iterdir())

    def is_finished(self) -> bool:
        return (self.path / "summary.json").exists()

    def write_json(self, name: str, obj: Any) -> None:
        if not self.writer:
            return
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_jsonable))
        tmp.replace(target)  # atomic: a reader never sees half a file

    def read_json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text())

    def start(self, config_json: str) -> None:
        """Create the directory and write config.json and meta.json."""
        import jax

        if not self.writer:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "config.json").write_text(config_json)
        self.write_json("meta.json", {
            "git_commit": git_commit(pathlib.Path(__file__).parent),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "python": platform.python_version(),
            "jax": jax.__version__,
            "devices": [str(d) for d in jax.devices()],
            "process_count": jax.process_count(),
        })

    def append_jsonl(self, name: str, record: Mapping[str, Any]) -> None:
        if not self.writer:
            return
        with open(self.path / name, "a", encoding="utf-8") as f:
            f.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")

    def truncate_jsonl(self, name: str, keep_steps_below: int) -> None:
        """Drop records with ``step >= keep_steps_below`` (a resumed run redoes them)."""
        path = self.path / name
        if not self.writer or not path.exists():
            return
        kept = [line for line in path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] < keep_steps_below]
        path.write_text("".join(line + "\n" for line in kept))

    def read_jsonl(self, name: str) -> list[dict]:
        path = self.path / name
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
