"""The checks of the pre-registered study command line (`experiments.multirun.study`): each option
against the stage it applies to, ``--out``, and ``OUT/choice.json``; every refusal is one
ValueError naming the fix, raised before any run starts."""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any

STAGE_OPTIONS = {"workers": ("tune", "test"), "only": ("tune", "test"), "set": ("tune", "test"),
                 "warm_start": ("tune", "test"), "record_diff": ("tune", "test"), "to": ("archive",),
                 "figures": ("report",)}


def check_args(args: argparse.Namespace) -> None:
    """Refuse, naming the fix, an option the stage would ignore, ``--workers`` below 1, and
    an ``--out`` that is a file or (for the stages that read runs) holds no ``tune/``."""
    for name, stages in STAGE_OPTIONS.items():
        if getattr(args, name) not in (None, []) and args.stage not in stages:
            raise ValueError(f"--{name.replace('_', '-')} applies to the {'/'.join(stages)} "
                             f"stage{'s' * (len(stages) > 1)}, not {args.stage}: drop it")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers {args.workers}: give at least 1")
    if args.stage == "plan":
        return
    if not args.out:
        raise ValueError(f"{args.stage} needs --out DIR")
    out = pathlib.Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: pass the study's folder, e.g. results/stress_fp8")
    if args.stage in ("status", "choose", "archive") and not (out / "tune").is_dir():
        raise ValueError(f"--out {out} holds no tune/ folder: pass the folder the tune stage "
                         "wrote, e.g. results/stress_fp8")


def load_choice(study: dict[str, Any], out: str | pathlib.Path) -> dict[str, Any]:
    """``OUT/choice.json`` as `choose` wrote it; ValueError naming the fix when it is
    missing, not JSON, or lacks ``chosen`` (or ``rule`` with a ``rule_arm``)."""
    path = pathlib.Path(out) / "choice.json"
    if not path.exists():
        raise ValueError(f"{path} is missing: run the choose stage first")
    try:
        choice = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not JSON ({err}): rerun the choose stage") from None
    need = ["chosen"] + ["rule"] * bool(study["preregistration"].get("rule_arm"))
    if not isinstance(choice, dict) or any(k not in choice for k in need):
        raise ValueError(f"{path} lacks {need}: it is not the choose stage's; rerun it")
    return choice
