"""Sweeps: a grid over any config fields x seeds, expanded to run directories.

A sweep spec is a TOML file::

    preset = "quickstart"             # a preset of experiments.run.configs
    seeds = [0, 1]
    [[grid]]                          # one or more grids; their runs are unioned
    "objective.name" = ["entr", "grpo"]
    "staleness.inter_lag" = [1, 5, 15, 20, 30]
    [[grid]]
    "objective.name" = ["entr", "grpo"]
    "staleness.intra_switches" = [1, 5, 7, 9]
    [fixed]                           # overrides shared by every run
    rl_steps = 40

Every run is ``python -m experiments.run PRESET --run_dir DIR --seed S --field value ...``
(the same overrides the CLI takes). A ``[fixed]`` field that only some selections read
(`experiments.run.config.SELECTED_FIELDS`: a staleness mode, a sampler kind, a task, an
objective) is passed only to the runs whose selection reads it: e.g.
``staleness.inter_lag`` is not passed to a ``sync`` run, which the CLI would refuse. A
grid point that names the selecting field itself (``staleness.mode``) gets every field it
names (a contradiction is the CLI's error to report); otherwise the fields its selection
(from a comparison method, ``[fixed]`` or the preset) does not read are dropped from that
run and its name, so a sync baseline in a lag grid runs once per remaining setting.
``run`` executes the runs on this machine with N worker processes, skipping finished runs
(``summary.json`` exists) and resuming interrupted ones (``--resume``: from the last
checkpoint, or afresh when one stopped before its first) and reporting a failed run with
the last error line of its log (``<run_dir>/sweep.log``; the message of an error box, not
its border); ``emit`` writes one command per
line for a cluster scheduler (e.g. a Slurm array reading line ``$SLURM_ARRAY_TASK_ID``);
``summarize`` prints a table across runs. ``run`` prints a line on stderr as each run ends
(name, status, its wall time, an ETA for the rest; `experiments.multirun.sweep_progress`), then the
records and the table; the table's wall-clock column is machine time under the sweep's own
load, labelled so, not a cost of the method.

Usage::

    python -m experiments.sweep run   SPEC.toml --out runs/sweep --workers 2
    python -m experiments.sweep emit  SPEC.toml --out runs/sweep > commands.txt
    python -m experiments.sweep summarize runs/sweep
    python -m experiments.sweep run   SPEC.toml --out runs/sweep --only REGEX  # a slice
    python -m experiments.sweep run   SPEC.toml --out runs/small --set rl_steps=10
    python -m experiments.sweep run   SPEC.toml --out runs/sweep --seeds 3 4  # more seeds
    python -m experiments.sweep run   SPEC.toml --out runs/sweep --reuse runs/other_sweep

``--only`` keeps the runs whose directory name matches the regular expression
(``re.search``). Names are ``[method=LABEL_]field=value_..._seed=S`` with each field's last
dotted part, e.g. one setting of ``stress_regime.toml`` with its sync baseline (which has no
lag fields), every seed::

    --only 'learning_rate=0.0003_(inter_lag=30_intra_switches=3_)?logit_noise_std=0.5_seed'

``--set KEY=VALUE`` (repeatable) replaces or adds one ``[fixed]`` entry for this invocation
(VALUE read as a TOML value, else as a string: ``--set model.path=runs/x/sft_model``),
e.g. a smaller copy of a spec; it is recorded in the comparison's ``sweep_spec.json``. A key
that a grid varies or a comparison method sets is refused (that value would win).
``--seeds S [S ...]`` replaces the spec's ``seeds`` for this invocation: more seeds of a
setting go into the same ``--out`` beside the finished ones (names end in ``seed=S``), so
the analyses read them all.
``run --reuse DIR`` (repeatable; a DIR that is not a directory is an error): a pending run
whose resolved config equals that of a finished run under DIR (every field but
`REUSE_IGNORED` = ``name``, ``run_dir``, ``shared_eval_dir``, ``logging.*``, which label a
run and change none of its values) is not run again: the
finished run's files are copied in (checkpoints and the parameter ring left behind) with a
``reused_from.json`` naming the source, e.g. the GRPO arms of a method comparison from the
regime search that ran the same configs.

Every run gets ``--shared_eval_dir OUT/shared_eval`` (unless ``[fixed]`` or ``--set`` gives
``shared_eval_dir``; ``--set shared_eval_dir=''`` turns it off): runs that start from the
same weights with the same evaluation settings and seed evaluate the start once between
them (`experiments.run.shared_eval`; a method comparison from one warm start: once per seed
instead of once per run), and write the same files as if each had evaluated it.

A method comparison adds a ``[comparison]`` table (one shared objective base, each
method's own parameters and declared differences; `experiments.multirun.comparison`): its methods
multiply the grid points, ``run``/``emit`` refuse a spec whose resolved runs differ in an
undeclared field, and ``summarize`` prints each method's differences from the base.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time
from typing import Any, Callable

from experiments.multirun import comparison
from experiments.multirun.sweep_progress import WALL_HEADER, WALL_NOTE, print_line, progress_line
from experiments.run.fields import LABEL_FIELDS, flatten
from experiments.run.rundir import RunDir
from experiments.multirun.sweep_spec import (SHARED_EVAL, SweepRun, apply_set, expand,  # noqa: F401
                                    load_spec, parse_set)


def is_finished(run: SweepRun) -> bool:
    return RunDir(run.run_dir).is_finished()


def has_started(run: SweepRun) -> bool:
    """The run's directory holds an interrupted run (`RunDir.holds_run`): it is started
    again with ``--resume``, from its last checkpoint, or afresh when it stopped before
    the first one (without ``--resume`` the CLI refuses the directory)."""
    return RunDir(run.run_dir).holds_run()


REUSE_IGNORED = LABEL_FIELDS + ("logging",)  # labels, locations, where it logs


def _identity(config: dict[str, Any]) -> dict[str, Any]:
    """The dotted fields of a ``config.json`` dict that decide a run's values; a field the
    dict lacks (written before the field existed) is its default
    (`experiments.run.config.with_field_defaults`)."""
    from experiments.run.config import with_field_defaults

    return {k: v for k, v in flatten(with_field_defaults(config)).items()
            if k.split(".")[0] not in REUSE_IGNORED}


def resolved_config(spec: dict[str, Any], run: SweepRun) -> dict[str, Any]:
    """The ``config.json`` dict the run would write: its command parsed by the job's own CLI
    (`experiments.run.cli.parse`), so every conversion the CLI makes is made here."""
    import contextlib
    import io

    from experiments.run.cli import parse

    with contextlib.redirect_stderr(io.StringIO()):  # its notes belong to the run's own log
        cfg, _ = parse(run.command(spec["preset"])[3:])
    return json.loads(cfg.to_json())


def reuse_finished(spec: dict[str, Any], runs: list[SweepRun],
                   sources: list[str | pathlib.Path]) -> list[dict]:
    """Fill each unfinished run from a finished run under ``sources`` with the same resolved
    config (all fields but `REUSE_IGNORED`): its files are copied in, except ``checkpoints/``
    and ``ring/``; ``config.json`` gets this run's name and run_dir; ``reused_from.json``
    names the source. Returns one record per reused run."""
    import shutil

    if not sources:
        return []
    found: dict[str, pathlib.Path] = {}
    for source in sources:
        for summary in sorted(pathlib.Path(source).glob("*/summary.json")):
            config = json.loads((summary.parent / "config.json").read_text())
            found.setdefault(json.dumps(_identity(config), sort_keys=True), summary.parent)
    records = []
    for run in runs:
        if is_finished(run):
            continue
        mine = resolved_config(spec, run)
        src = found.get(json.dumps(_identity(mine), sort_keys=True))
        if src is None:
            continue
        if run.run_dir.exists():
            shutil.rmtree(run.run_dir)  # a partial run of the same config: replaced whole
        shutil.copytree(src, run.run_dir, ignore=shutil.ignore_patterns("checkpoints", "ring"))
        saved = json.loads((run.run_dir / "config.json").read_text())
        saved.update(name=mine["name"], run_dir=mine["run_dir"])
        (run.run_dir / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True))
        (run.run_dir / "reused_from.json").write_text(json.dumps(
            {"source": str(src), "ignored_fields": list(REUSE_IGNORED)}, indent=1))
        records.append({"name": run.name, "status": f"reused ({src})"})
    return records


def select(runs: list[SweepRun], only: str | None) -> list[SweepRun]:
    """The runs whose name matches the regular expression ``only`` (``re.search``; None =
    all): one slice of a sweep, e.g. one setting of a grid over every seed.

    Raises:
      ValueError: ``only`` is not a valid regular expression, or it matches no run.
    """
    if only is None:
        return runs
    try:
        pattern = re.compile(only)
    except re.error as err:
        raise ValueError(f"--only {only!r} is not a regular expression: {err}") from None
    chosen = [r for r in runs if pattern.search(r.name)]
    if not chosen:
        raise ValueError(f"--only {only!r} matches none of the {len(runs)} run names, e.g. "
                         f"{runs[0].name if runs else '(none)'}")
    return chosen


def run_local(spec: dict[str, Any], out_dir: str | pathlib.Path, workers: int = 1,
              only: str | None = None, reuse: list[str] | None = None,
              progress: Callable[[str], None] | None = print_line) -> list[dict]:
    """Run every unfinished run (of the ``only`` slice, see `select`) with ``workers``
    processes, after filling those a finished run under ``reuse`` matches
    (`reuse_finished`); returns one record per run. ``progress`` gets one line per run as
    it ends (`run_runs`; default: stderr)."""
    runs = select(expand(spec, out_dir), only)
    reused = reuse_finished(spec, runs, reuse or [])
    done = {r["name"] for r in reused}
    return reused + run_runs(spec["preset"], [r for r in runs if r.name not in done], workers,
                             progress)


def run_runs(preset: str, runs: list[SweepRun], workers: int = 1,
             progress: Callable[[str], None] | None = print_line) -> list[dict]:
    """Run the unfinished ``runs`` of ``preset``, started in the order given, ``workers``
    at a time (a run that has started before resumes); one record per run, in the order
    given, finished ones first: ``status`` "skipped (finished)", "ok", or "rc=N" with its
    last ``error`` line and ``log``; a run started here also has ``wall_s`` (its wall
    seconds). ``progress`` (None: silent) gets `progress_line` as each run ends."""
    pending = [r for r in runs if not is_finished(r)]
    records = [{"name": r.name, "status": "skipped (finished)"} for r in runs if is_finished(r)]
    workers = max(1, workers)

    def _one(run: SweepRun) -> dict:
        start = time.monotonic()
        run.run_dir.mkdir(parents=True, exist_ok=True)
        cmd = run.command(preset, resume=has_started(run))
        log_path = run.run_dir / "sweep.log"
        with open(log_path, "a") as log:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env())
        wall = round(time.monotonic() - start, 1)
        if proc.returncode == 0:
            return {"name": run.name, "status": "ok", "wall_s": wall}
        return {"name": run.name, "status": f"rc={proc.returncode}", "wall_s": wall,
                "error": last_error_line(log_path), "log": str(log_path)}

    start = time.monotonic()
    ended: dict[int, dict] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_one, run): i for i, run in enumerate(pending)}
        for future in concurrent.futures.as_completed(futures):
            ended[futures[future]] = record = future.result()
            if progress is not None:
                progress(progress_line(record, len(ended), len(pending),
                                       time.monotonic() - start, workers))
    return records + [ended[i] for i in range(len(pending))]


def child_env() -> dict[str, str]:
    """The environment of a run's process: this one's, with its output in UTF-8 whatever
    the locale (so the command line's error boxes are the ones `last_error_line` reads)."""
    return {**os.environ, "PYTHONIOENCODING": "utf-8"}


def last_error_line(log_path: str | pathlib.Path) -> str:
    """The line of a run's log that says why it failed: the last ``entr-run: error``
    line; else the message of the last error box the command line printed (tyro's
    ``╭─ Value error ─╮`` boxes: its title and first paragraph, on one line); else the
    last line that is not a progress bar (e.g. a traceback's last line)."""
    try:
        lines = [ln.strip() for ln in pathlib.Path(log_path).read_text(
            errors="replace").replace("\r", "\n").splitlines() if ln.strip()]
    except OSError as e:
        return f"(log unreadable: {e})"
    errors = [ln for ln in lines if ln.startswith("entr-run: error") or
              ln.startswith("entr-run: unexpected error")]
    if errors:
        return errors[-1]
    tops = [i for i, ln in enumerate(lines) if ln.startswith("╭")]
    if tops:
        title = lines[tops[-1]].strip("╭╮─ ")
        body = []
        for ln in lines[tops[-1] + 1:]:
            text = ln.strip("│ ")
            if not text.strip("─") or ln.startswith("╰"):  # the box's separator or bottom
                break
            body.append(text)
        message = " ".join(body)
        return message if message.startswith(title) else f"{title}: {message}"
    plain = [ln for ln in lines if "it/s]" not in ln and "s/it]" not in ln]
    return plain[-1] if plain else "(empty log)"


def emit(spec: dict[str, Any], out_dir: str | pathlib.Path, only: str | None = None) -> list[str]:
    """One shell command per run of the ``only`` slice (see `select`; resuming is the job's
    own ``--resume`` flag)."""
    return [shlex.join(r.command(spec["preset"])) for r in select(expand(spec, out_dir), only)]


def summary_report(out_dir: str | pathlib.Path) -> str | None:
    """The per-method difference report of a comparison sweep directory (read from its
    ``sweep_spec.json`` and each started run's ``config.json``), or None when the
    directory holds no comparison sweep."""
    out_dir = pathlib.Path(out_dir)
    path = out_dir / "sweep_spec.json"
    if not path.exists():
        return None
    spec = json.loads(path.read_text())
    if "comparison" not in spec:
        return None
    runs = expand(spec, out_dir)
    configs = {r.name: json.loads((r.run_dir / "config.json").read_text())
               for r in runs if (r.run_dir / "config.json").exists()}
    checks = comparison.check_runs(spec, [r for r in runs if r.name in configs] or runs, configs)
    return comparison.format_report(checks)


SUMMARY_COLUMNS = (
    "eval_accuracy_before",
    "eval_accuracy_after",
    "final_reward",
    "rl_steps",
    "wall_clock_s",
)


def summarize(out_dir: str | pathlib.Path) -> list[dict[str, Any]]:
    """Rows ``{run, <overrides>, <summary columns>}`` for every finished run under a dir."""
    rows = []
    for summary_path in sorted(pathlib.Path(out_dir).glob("*/summary.json")):
        summary = json.loads(summary_path.read_text())
        row = {"run": summary_path.parent.name}
        row.update({c: summary.get(c) for c in SUMMARY_COLUMNS})
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of `summarize` rows; the wall-clock column is headed
    `WALL_HEADER` and explained by `WALL_NOTE` under the table."""
    if not rows:
        return "(no finished runs)"
    cols = list(rows[0])
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    heads = [WALL_HEADER if c == "wall_clock_s" else c for c in cols]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    if "wall_clock_s" in cols:
        lines += ["", WALL_NOTE]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("run", "emit"):
        p = sub.add_parser(name)
        p.add_argument("spec")
        p.add_argument("--out", required=True)
        p.add_argument("--only", metavar="REGEX", default=None,
                       help="only the runs whose name matches REGEX (re.search)")
        p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                       help="replace or add a [fixed] entry (repeatable)")
        p.add_argument("--seeds", metavar="S", type=int, nargs="+", default=None,
                       help="run these seeds instead of the spec's 'seeds'")
        if name == "run":
            p.add_argument("--workers", type=int, default=1)
            p.add_argument("--reuse", metavar="DIR", action="append", default=[],
                           help="copy in finished runs of DIR with the same resolved config")
    p = sub.add_parser("summarize")
    p.add_argument("out")
    args = parser.parse_args(argv)
    if args.cmd == "summarize":
        print(format_table(summarize(args.out)))
        report = summary_report(args.out)
        if report:
            print(report)
        return 0
    try:
        spec = apply_set(load_spec(args.spec), parse_set(args.set))
        if args.seeds is not None:
            spec["seeds"] = list(dict.fromkeys(args.seeds))
        select(expand(spec, args.out), args.only)
        if "comparison" in spec:  # also resolves every run: an unknown field is named here
            comparison.verify(spec, expand(spec, args.out))
        missing = [d for d in getattr(args, "reuse", []) if not pathlib.Path(d).is_dir()]
        if missing:
            raise ValueError(f"--reuse {', '.join(missing)}: not a directory")
    except (ValueError, TypeError) as err:
        if isinstance(err, TypeError):  # raised by a field's validation on a wrong-typed value
            err = f"a [fixed] or --set value has the wrong type for its field ({err})"
        print(f"sweep: error: {err}", file=sys.stderr)
        return 2
    if "comparison" in spec and args.cmd == "run":
        comparison.write_spec(spec, args.out)
    if args.cmd == "emit":
        print("\n".join(emit(spec, args.out, args.only)))
        return 0
    records = run_local(spec, args.out, args.workers, args.only, args.reuse)
    for rec in records:
        print(json.dumps(rec))
    print(format_table(summarize(args.out)))
    failed = [r for r in records if r["status"].startswith("rc=")]
    if failed:
        print(f"{len(failed)} run(s) failed: their last error line and log are in the "
              "'error' and 'log' fields above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
