"""Archive a pre-registered study's finished runs (`experiments.multirun.study`, stage ``archive``):
the small files of every run, and the token samples of the baseline's runs, in the same
layout, a folder to commit as the study goes."""

from __future__ import annotations

import pathlib
import shutil
from typing import Any

ARCHIVED = ("config.json", "meta.json", "summary.json", "metrics.jsonl", "timing.jsonl",
            "eval", "reused_from.json")


def archive(study: dict[str, Any], out: str | pathlib.Path, to: str | pathlib.Path) -> int:
    """Copy the small files of every finished run of ``out`` (`ARCHIVED`; and the token
    samples of the baseline's runs, which the decomposition and the rule read) to ``to``
    in the same layout, with ``choice.json``: a folder to commit as the study goes, and
    to pass as ``--out`` to continue it elsewhere (finished runs are skipped there).
    Returns the number of runs copied."""
    out, to = pathlib.Path(out), pathlib.Path(to)
    base = study["preregistration"]["baseline"]
    n = 0
    for summary in sorted(out.glob("*/*/*/summary.json")):
        run = summary.parent
        dest = to / run.relative_to(out)
        names = ARCHIVED + (("token_samples",) if run.name.startswith(f"method={base}_") else ())
        for name in names:
            src = run / name
            if src.is_dir():
                shutil.copytree(src, dest / name, dirs_exist_ok=True)
            elif src.exists():
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)
        n += 1
    for extra in sorted(out.glob("*/*/sweep_spec.json")) + [out / "choice.json"]:
        if extra.exists():
            (to / extra.relative_to(out)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(extra, to / extra.relative_to(out))
    return n
