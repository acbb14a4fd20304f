"""Archive a pre-registered study's finished runs (`experiments.multirun.study`, stage ``archive``):
the small files of every run, and the token samples of the baseline's runs, in the same
layout, a folder to commit as the study goes."""

from __future__ import annotations

import pathlib
import shutil
from typing import Any

ARCHIVED = ("config.json", "meta.json", "summary.json", "metrics.jsonl", "timing.jsonl",
            "eval", "reused_from.json")


def archive_runs(runs: list[pathlib.Path], root: str | pathlib.Path, to: str | pathlib.Path,
                 with_tokens=lambda run: False) -> int:
    """Copy the small files (`ARCHIVED`) of each finished run directory in ``runs`` from
    under ``root`` to the same relative place under ``to``, and its ``token_samples``
    where ``with_tokens(run)``. Returns the number of runs copied."""
    root, to = pathlib.Path(root), pathlib.Path(to)
    n = 0
    for run in runs:
        if not (run / "summary.json").exists():
            continue
        dest = to / run.relative_to(root)
        for name in ARCHIVED + (("token_samples",) if with_tokens(run) else ()):
            src = run / name
            if src.is_dir():
                shutil.copytree(src, dest / name, dirs_exist_ok=True)
            elif src.exists():
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)
        n += 1
    return n


def archive(study: dict[str, Any], out: str | pathlib.Path, to: str | pathlib.Path) -> int:
    """Copy the small files of every finished run of ``out`` (`ARCHIVED`; and the token
    samples of the baseline's runs, which the decomposition and the rule read) to ``to``
    in the same layout, with ``choice.json``: a folder to commit as the study goes, and
    to pass as ``--out`` to continue it elsewhere (finished runs are skipped there).
    Returns the number of runs copied."""
    out, to = pathlib.Path(out), pathlib.Path(to)
    base = study["preregistration"]["baseline"]
    n = archive_runs([s.parent for s in sorted(out.glob("*/*/*/summary.json"))], out, to,
                     lambda run: run.name.startswith(f"method={base}_"))
    for extra in sorted(out.glob("*/*/sweep_spec.json")) + [out / "choice.json"]:
        if extra.exists():
            (to / extra.relative_to(out)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(extra, to / extra.relative_to(out))
    return n
