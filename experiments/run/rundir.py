"""The run directory: what every run writes, in one place.

::

    <run_dir>/
      config.json        the resolved RunConfig
      meta.json          git commit, versions, devices, machine (CPU model, cores), start time
      metrics.jsonl      one JSON object per RL step: deterministic metrics only, so two
                         runs with the same config and seed write identical files
      timing.jsonl       one JSON object per RL step: wall-clock figures (time/*, throughput/*)
      tb/                tensorboard events (metrics and timing)
      wandb.json         the Weights & Biases run (id, url or offline path), with
                         logging.wandb=true; W&B's own files go to wandb/ unless
                         logging.wandb_dir says otherwise
      checkpoints/       orbax checkpoints (learner state + JSON side items)
      sft_checkpoints/   the warm start's checkpoints (checkpoint.sft_every), until the
                         first RL checkpoint
      ring/              parameter-ring snapshots that go with checkpoints (intra switches)
      token_samples/     step_<n>.npz: per-token (log_ratio, entropy_mu, kept) samples
      eval/              <phase>.json evaluation results (init, before_rl, after_rl);
                         init_source.json with shared_eval_dir (experiments.run.shared_eval)
      sft.jsonl          supervised warm-start loss per step (when sft.steps > 0)
      sft_model/         the warm-started policy in the Hugging Face layout (sft.save_model)
      exports/           weight exports pushed to an SGLang fleet (sampler.kind=sglang)
      summary.json       the headline numbers, written when the run finishes
      resume_overrides.jsonl  fields changed on resume with --resume-override (old -> new)
      logs/              run.log (one line per start/resume), checkpoint.log (why a
                         checkpoint could not be restored), error.log (tracebacks)

Writes never leave a partial file: JSON files and rewritten JSONL files go through a
temporary file and `os.replace`; JSONL records are appended whole (`experiments.run.jsonl`).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import platform
import shutil
import subprocess
import time
from typing import Any, Mapping

import numpy as np

from experiments.run import jsonl


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


def machine() -> dict[str, Any]:
    """``{"cpu": model name, "cores": logical CPU count}`` of this machine (``/proc/cpuinfo``
    where it exists, else `platform.processor`)."""
    cpu = ""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu or platform.processor() or platform.machine() or "unknown",
            "cores": os.cpu_count()}


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

    @property
    def sft_checkpoint_dir(self) -> pathlib.Path:
        """The warm start's checkpoints (`experiments.run.warm_start`)."""
        return self.path / "sft_checkpoints"

    def has_checkpoint(self) -> bool:
        return bool(checkpoint_steps(self.checkpoint_dir))

    def drop_sft_checkpoints(self) -> None:
        """Delete the warm start's checkpoints (RL's own, or the finished run, supersede
        them; a warm start started over replaces them)."""
        if self.writer and self.sft_checkpoint_dir.exists():
            shutil.rmtree(self.sft_checkpoint_dir)

    def is_finished(self) -> bool:
        return (self.path / "summary.json").exists()

    def reusable_phases(self) -> list[pathlib.Path]:
        """What a resume before the first RL checkpoint reuses: the finished evaluations
        (``eval/init.json``, ``eval/before_rl.json``) and the newest warm-start checkpoint
        (``sft_checkpoints/<step>``)."""
        found = [self.path / "eval" / f"{phase}.json" for phase in ("init", "before_rl")
                 if (self.path / "eval" / f"{phase}.json").is_file()]
        sft = self.sft_checkpoint_dir
        return found + [sft / str(step) for step in checkpoint_steps(sft)[-1:]]

    def holds_run(self) -> bool:
        """A run has written here (metrics, a checkpoint of RL or of its warm start, or a
        summary): starting another needs ``--resume``, which continues from the last
        checkpoint or, with no RL checkpoint, reuses the phases the run finished."""
        return ((self.path / "metrics.jsonl").exists() or self.has_checkpoint()
                or self.is_finished() or bool(self.reusable_phases()))

    def write_json(self, name: str, obj: Any) -> None:
        if not self.writer:
            return
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(target, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable))

    def read_json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text())

    def start(self, config_json: str) -> None:
        """Create the directory and write config.json and meta.json."""
        import jax

        if not self.writer:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.path / "config.json", config_json)
        self.write_json("meta.json", {
            "git_commit": git_commit(pathlib.Path(__file__).parent),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "python": platform.python_version(),
            "jax": jax.__version__,
            "devices": [str(d) for d in jax.devices()],
            "process_count": jax.process_count(),
            "machine": machine(),
        })

    def append_jsonl(self, name: str, record: Mapping[str, Any]) -> None:
        """Append one record as a whole line (never a partial one, `jsonl.append_line`)."""
        if not self.writer:
            return
        jsonl.append_line(self.path / name, {k: _jsonable(v) for k, v in record.items()})

    def truncate_jsonl(self, name: str, keep_steps_below: int) -> None:
        """Drop records with ``step >= keep_steps_below`` (a resumed run redoes them) and
        a partial last line (with a warning); the file is replaced atomically."""
        path = self.path / name
        if not self.writer or not path.exists():
            return
        kept = [r for r in jsonl.read_records(path) if r["step"] < keep_steps_below]
        jsonl.rewrite_lines(path, [json.dumps(r) for r in kept])

    def read_jsonl(self, name: str) -> list[dict]:
        """The records of a JSONL file (`jsonl.read_records`: a partial last line is
        dropped with a warning)."""
        return jsonl.read_records(self.path / name)

    def log(self, name: str, text: str) -> pathlib.Path:
        """Append ``text`` (a line or a block, e.g. a traceback) with a timestamp to
        ``logs/<name>.log``; returns that path. Best effort: a failing write is ignored."""
        path = self.path / "logs" / f"{name}.log"
        if self.writer:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "a", encoding="utf-8") as f:
                    f.write(f"[{time.strftime('%Y-%m-%dT%H:%M:%S%z')}] {text.rstrip()}\n")
            except OSError:
                pass
        return path


def checkpoint_steps(directory: pathlib.Path) -> list[int]:
    """The step numbers of the orbax step folders in ``directory``, ascending ([] when it
    does not exist)."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _atomic_write(target: pathlib.Path, text: str) -> None:
    """Write ``text`` to ``target`` through ``<target>.tmp`` + `os.replace`: a reader never
    sees half a file, and a failed write (full disk) leaves neither a partial target nor
    the temporary file."""
    tmp = target.with_name(target.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as err:
        _remove(tmp)
        if isinstance(err, OSError) and err.filename is None:
            err.filename = str(target)
        raise


def _remove(path: pathlib.Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
