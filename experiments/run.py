"""The main job: ``entr-run PRESET [--field value ...] [--resume]``.

``PRESET`` names a complete configuration (``experiments.configs.PRESETS``); every field
can be overridden by its dotted name, e.g.::

    entr-run quickstart --rl_steps 20 --objective.name grpo --staleness.inter_lag 5
    entr-run quickstart --run_dir runs/qs --resume

The run directory (``runs/<name>`` unless ``--run_dir``) receives the resolved config,
git commit, metrics, tensorboard events, checkpoints, evaluation JSON and summary.json
(`experiments.rundir`). Also runnable as ``python -m experiments.run``.
"""

from __future__ import annotations

import json
import os
import sys

import tyro

from experiments.configs import PRESETS, REQUIRES_MODEL_PATH


def parse(argv: list[str] | None = None):
    """``(config, resume)`` from the command line; bad fields fail here, naming them."""
    argv = list(sys.argv[1:] if argv is None else argv)
    resume = "--resume" in argv
    argv = [a for a in argv if a != "--resume"]
    if not argv or argv[0] not in PRESETS:
        names = ", ".join(sorted(PRESETS))
        if argv and argv[0] in ("-h", "--help"):
            print(__doc__ + f"\nPresets: {names}\nUse `entr-run PRESET --help` for every field.")
            raise SystemExit(0)
        got = repr(argv[0]) if argv else "nothing"
        raise SystemExit(f"entr-run: first argument must be a preset ({names}), got {got}")
    name = argv[0]
    description, default = PRESETS[name]
    try:
        cfg = tyro.cli(type(default), default=default, args=argv[1:], prog=f"entr-run {name}",
                       description=description, use_underscores=True)
    except ValueError as e:  # a field's __post_init__ validation
        raise SystemExit(f"entr-run: invalid configuration: {e}") from None
    if name in REQUIRES_MODEL_PATH and not cfg.model.path:
        raise SystemExit(f"entr-run {name}: model.path is required (--model.path DIR, a local "
                         "Hugging Face checkpoint directory)")
    return cfg, resume


def main(argv: list[str] | None = None) -> int:
    """Run the job from the command line; prints the summary; returns the exit status 0."""
    cfg, resume = parse(argv)
    if cfg.model.path and not os.path.isfile(os.path.join(cfg.model.path, "config.json")):
        raise SystemExit(f"entr-run: model.path {cfg.model.path!r} has no config.json")
    from learners.distributed import initialize

    initialize()  # multi-host: reads ENTR_* variables; a no-op for one process
    from experiments.loop import Job, RunExistsError

    try:
        job = Job(cfg, resume=resume)
        summary = job.run_job()
    except (RunExistsError, FileNotFoundError) as e:
        raise SystemExit(f"entr-run: {e}") from None
    print(json.dumps({k: v for k, v in summary.items() if k != "evals"}, indent=2))
    print(f"run directory: {job.run.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
