"""Read an offline Weights & Biases run back (test helper): its logged rows and config, from
the run's ``.wandb`` transaction log, with ``wandb leet inspect --json`` (W&B's own reader)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

OFFLINE_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
DIR_ENV = ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")


def offline_env(mp: pytest.MonkeyPatch, root: Path) -> None:
    """Offline W&B, its settings and caches under ``root`` (nothing global, no network)."""
    for var, value in OFFLINE_ENV.items():
        mp.setenv(var, value)
    for var in DIR_ENV:
        mp.setenv(var, str(root / var.lower()))
    mp.delenv("WANDB_API_KEY", raising=False)


def read_run(run_path: str | Path) -> tuple[dict[int, dict], dict]:
    """``({step: logged row}, run config)`` of the offline run directory ``run_path``
    (``wandb.json``'s ``path``). Histograms appear as ``<key>.values`` / ``<key>.bins``."""
    (log,) = Path(run_path).glob("run-*.wandb")
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    rows = {r["history"]["step"]["num"]: r["history"]["item"]
            for r in records if r["type"] == "history"}
    updates = [r["run"]["config"]["update"] for r in records if r["type"] == "run"]
    updates += [r["config"]["update"] for r in records if r["type"] == "config"]
    return rows, {k: v for u in updates for k, v in u.items()}
