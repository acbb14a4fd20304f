"""The main job: ``entr-run PRESET [--field value ...] [--resume [--resume-override]] [--debug]``.

``PRESET`` names a complete configuration (``experiments.run.configs.PRESETS``); every field
can be overridden by its dotted name, e.g.::

    entr-run quickstart --rl_steps 20 --objective.name grpo --staleness.inter_lag 5
    entr-run quickstart --run_dir runs/qs --resume

The run directory (``runs/<name>`` unless ``--run_dir``) receives the resolved config,
git commit, metrics, tensorboard events, checkpoints, evaluation JSON and summary.json
(`experiments.run.rundir`). Also runnable as ``python -m experiments.run``.

``--resume`` continues a run with the configuration it was started with (its
``config.json``: ``entr-run --run_dir DIR --resume`` needs no preset); a difference
that changes the experiment is refused (listing the fields) unless ``--resume-override``
is given, which records it in ``resume_overrides.jsonl`` (`experiments.run.resume`).

Errors: bad input (a field, a file, the devices, a run directory that cannot be
written, a resume that would change the experiment) is refused before any work with one
paragraph on stderr and exit status 2; an unexpected error exits with 1. Ctrl-C prints one
line (what is saved, the command that resumes) and exits with 130. The traceback
goes to ``<run_dir>/logs/error.log`` and, with ``--debug`` or ``ENTR_DEBUG=1``, to stderr.
Every failure exits: a background thread left waiting by the failure (orbax's save
threads wait forever on a save that failed) cannot keep the process alive (`entry`).
"""

from __future__ import annotations

import time

_STARTED = time.perf_counter()  # before the heavy imports: `Job.startup_s`

import dataclasses  # noqa: E402
import json
import os
import shlex
import sys
import threading
import traceback
import warnings
from typing import Any

import tyro

from experiments.run.config import RunConfig, dotted, selector_of
from experiments.run.configs import PRESETS, REQUIRES_MODEL_PATH
from experiments.run.errors import ConfigError, describe, disk_full, is_complete, is_user_error

_FLAGS = ("--resume", "--resume-override", "--debug")


@dataclasses.dataclass(frozen=True)
class CliOptions:
    """Command-line switches that are not config fields."""

    resume: bool = False
    resume_override: bool = False
    debug: bool = False


def _given_fields(argv: list[str]) -> set[str]:
    """Dotted field names given on the command line (``--a.b 1`` or ``--a.b=1``)."""
    return {a[2:].split("=", 1)[0].replace("-", "_") for a in argv if a.startswith("--")}


_STALENESS_READS = {
    "sync": "it trains on-policy (lag 0, no intra switches)",
    "async": "it measures staleness and bounds it with staleness.max_staleness ({})",
    "simulated": "it draws staleness from the seeded schedule (staleness.inter_lag, "
                 "staleness.intra_switches)",
}
_SELECTION_NOUNS = {"staleness.mode": "modes", "sampler.kind": "sampler kinds",
                    "task.name": "tasks", "objective.name": "objectives"}


def check_switch_values(fields: list[str], cfg: Any) -> None:
    """Refuse a value given to a switch (``--sft.save_model maybe``, ``--x.flag=true``),
    naming the field and both spellings, before tyro's own "Unrecognized options".

    Raises:
      ConfigError: a switch of ``cfg`` is followed by a value.
    """
    # tyro's switches (--a.b / --a.no_b): the bool fields, by their spellings
    spellings = {}
    for name in _leaves(cfg):
        if isinstance(dotted(cfg, name), bool):
            section, _, leaf = name.rpartition(".")
            no = f"{section}.no_{leaf}".lstrip(".")
            spellings[name] = spellings[no] = (name, no)
    for i, arg in enumerate(fields):
        name, eq, value = arg[2:].partition("=")
        found = spellings.get(name.replace("-", "_")) if arg.startswith("--") else None
        if found is None:
            continue
        if eq or (i + 1 < len(fields) and not fields[i + 1].startswith("-")):
            got = value if eq else fields[i + 1]
            on, no = found
            raise ConfigError(f"{on} is a switch and takes no value (got {got!r}): write "
                              f"--{on} to turn it on or --{no} to turn it off")


def _leaves(cfg: Any, prefix: str = ""):
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, prefix + f.name + ".")
        else:
            yield prefix + f.name


def check_selected_fields(cfg: RunConfig, given: set[str], preset: RunConfig) -> str | None:
    """Refuse fields given on the command line that the run's selection does not read
    (a staleness field of another mode, a sampler option of the other kind, a section of
    an objective or task not selected: `experiments.run.config.SELECTED_FIELDS`); return a
    note naming the preset's values the selection does not read (None when there are none).

    Raises:
      ConfigError: e.g. ``staleness.inter_lag only applies to staleness.mode=simulated``.
    """
    for name in sorted(given):
        rule = selector_of(name)
        if rule is None or dotted(cfg, rule[0]) in rule[1]:
            continue
        selector, values = rule
        value = dotted(cfg, selector)
        what = ""
        if selector == "staleness.mode":
            what = ": " + _STALENESS_READS[value].format(cfg.staleness.max_staleness)
        raise ConfigError(
            f"{name} only applies to {selector}={'/'.join(values)}; this run is "
            f"{selector}={value}{what}. Remove --{name} or set --{selector} {values[0]}")
    defaults, unread = RunConfig(), {}
    for name in _leaves(cfg):
        rule = selector_of(name)
        if rule is None or dotted(cfg, rule[0]) in rule[1] or name in given:
            continue
        if dotted(preset, name) != dotted(defaults, name) and \
                dotted(cfg, name) == dotted(preset, name):
            section, field = name.rsplit(".", 1)
            unread.setdefault(rule[0], {}).setdefault(section, []).append(
                f"{field}={dotted(cfg, name)}")
    notes = [f"{selector}={dotted(cfg, selector)} does not read the preset's "
             + "; ".join(f"{section} {', '.join(fields)}" for section, fields in sections.items())
             + f" (they apply to other {_SELECTION_NOUNS[selector]})"
             for selector, sections in unread.items()]
    return "; ".join(notes) or None


def parse(argv: list[str] | None = None) -> tuple[RunConfig, CliOptions]:
    """``(config, options)`` from the command line; bad fields fail here, naming them.

    Raises:
      ConfigError: a bad preset name or field (tyro's own parse errors exit with status 2
        after printing, like a refused field).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = CliOptions(resume="--resume" in argv, resume_override="--resume-override" in argv,
                      debug="--debug" in argv)
    if opts.resume_override and not opts.resume:
        raise ConfigError("--resume-override only makes sense with --resume")
    argv = [a for a in argv if a not in _FLAGS]
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__ + f"\nPresets: {', '.join(sorted(PRESETS))}\nUse `entr-run PRESET --help` "
              "for every field.")
        raise SystemExit(0)
    if argv and argv[0] in PRESETS:
        name, fields = argv[0], argv[1:]
    elif opts.resume and (not argv or argv[0].startswith("--")):
        name, fields = None, argv  # the run's own configuration, from its config.json
    else:
        got = repr(argv[0]) if argv else "nothing"
        raise ConfigError(f"the first argument must be a preset ({', '.join(sorted(PRESETS))}), "
                          f"got {got}")
    description, default = PRESETS[name] if name else ("Resume a run.", RunConfig())

    def cli(base: RunConfig) -> RunConfig:
        return tyro.cli(type(base), default=base, args=fields,
                        prog=f"entr-run {name}" if name else "entr-run",
                        description=description + " Run switches (not fields): --resume, "
                        "--resume-override, --debug; see `entr-run --help`.",
                        use_underscores=True)

    check_switch_values(fields, default)
    cfg = cli(default)
    saved_cfg = None
    if opts.resume:  # the run's own configuration, with only the fields given here changed
        saved = os.path.join(cfg.run_dir or f"runs/{cfg.name}", "config.json")
        if os.path.isfile(saved):
            try:
                with open(saved, encoding="utf-8") as f:
                    saved_json = json.load(f)
                saved_cfg = default.with_saved(saved_json)
            except (OSError, ValueError) as err:
                raise ConfigError(f"cannot resume from {saved}: {err}") from None
            if name:
                _note_unused_preset(name, default, saved_cfg, os.path.dirname(saved))
            default = saved_cfg
            cfg = cli(saved_cfg)
        elif name is None:
            raise ConfigError(f"cannot resume without a preset: {saved} does not exist; give "
                              "the run's --run_dir, or the preset it was started with")
    if name in REQUIRES_MODEL_PATH and not cfg.model.path and saved_cfg is None:
        raise ConfigError(f"preset {name!r} needs model.path (--model.path DIR, a local "
                          "Hugging Face checkpoint directory)")
    if cfg.sampler.kind == "sglang":  # a key that cannot be read is refused before work
        from samplers.sglang_config import read_api_key

        try:
            read_api_key(cfg.sampler.api_key, "sampler.api_key")
        except ValueError as err:
            raise ConfigError(str(err)) from None
    note = check_selected_fields(cfg, _given_fields(fields), default)
    if note:
        print(f"entr-run: note: {note}", file=sys.stderr)
    return cfg, opts


def _note_unused_preset(preset: str, base: RunConfig, saved: RunConfig, run_dir: str) -> None:
    """With ``--resume`` the run's own configuration wins over ``preset``: say so on stderr
    when the run is not that preset's own (started from another preset, under another name,
    or with another method), naming the stored run's method."""
    method = (saved.objective.name, saved.staleness.mode)
    if saved.name == preset and method == (base.objective.name, base.staleness.mode):
        return
    origin = (f"started from preset {saved.name!r}" if saved.name in PRESETS
              else f"run {saved.name!r}")
    print(f"entr-run: note: resuming {run_dir} with its own configuration ({origin}; its "
          f"method: objective.name={method[0]}, staleness.mode={method[1]}); preset "
          f"{preset!r} is not used", file=sys.stderr)


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"entr-run: warning: {message}\n"


def resume_command(argv: list[str]) -> str:
    """The command line that resumes the run ``argv`` started (``--resume`` once)."""
    kept = [a for a in argv if a not in ("--resume", "--resume-override")]
    return shlex.join(["entr-run", *kept, "--resume"])


def _fail(err: BaseException, debug: bool, run_dir: str | None,
          argv: list[str] | None = None) -> int:
    """Print ``err`` as one paragraph; the traceback to the run's error.log (unless the
    message says it all, `errors.is_complete`) and, in debug mode, to stderr. A fleet that
    cannot answer or take the weights (`FleetError`) also says what is saved and the
    command that resumes (`interrupted`); a full disk (`errors.disk_full`, also behind a
    library's own error) names the file and gives the command that resumes once space is
    freed. Returns the exit status (2: bad input or environment, 1: a bug)."""
    from samplers.sglang_routing import FleetError

    tb = "".join(traceback.format_exception(err))
    log_note = ""
    if run_dir and os.path.isdir(run_dir) and not is_complete(err):
        from experiments.run.rundir import RunDir

        log = RunDir(run_dir).log("error", tb)
        if log.is_file():
            log_note = f" Traceback: {log}."
    user = is_user_error(err)
    if debug:
        print(tb, file=sys.stderr, end="")
    full = disk_full(err)
    if is_complete(err):  # the message says it all
        resume = ""
        if isinstance(err, FleetError) and argv is not None:
            resume = "; " + interrupted(run_dir, argv).removeprefix("interrupted; ")
        print(f"entr-run: error: {describe(err)}{resume}", file=sys.stderr)
    elif full is not None:  # also behind a library's own error (orbax, safetensors)
        where = os.fsdecode(full.filename) if full.filename is not None else (
            f"a file under {run_dir}" if run_dir else "a file")
        started = run_dir is not None and os.path.isfile(os.path.join(run_dir, "config.json"))
        again = (f"resume with: {resume_command(argv or [])}" if started else "run again: "
                 + shlex.join(["entr-run", *[a for a in argv or []
                                             if a not in ("--resume", "--resume-override")]]))
        print(f"entr-run: error: the disk is full: writing {where} failed (No space left on "
              f"device). Free space on that disk, then {again}.{log_note}", file=sys.stderr)
        return 2
    else:
        head = "error" if user else f"unexpected error ({type(err).__name__}; a bug?)"
        hint = "" if debug else " Run with --debug (or ENTR_DEBUG=1) for the traceback."
        print(f"entr-run: {head}: {describe(err).rstrip('.')}.{log_note}{hint}",
              file=sys.stderr)
    return 2 if user else 1


def interrupted(run_dir: str | None, argv: list[str]) -> str:
    """One line for an interrupted run (Ctrl-C): what is saved (the newest checkpoint's
    RL step; before it, the finished evaluations and the warm start's checkpoints) and
    the command that resumes it."""
    if run_dir is None:
        return "interrupted before the run started: nothing saved"
    from experiments.run.rundir import RunDir, checkpoint_steps

    run = RunDir(run_dir)
    kept = [a for a in argv if a not in ("--resume", "--resume-override")]
    if not (run / "config.json").is_file() and not run.holds_run():  # --resume is refused
        return ("interrupted before the run wrote anything: nothing saved; start it again "
                f"with: {shlex.join(['entr-run', *kept])}")
    ckpt = run.checkpoint_dir
    steps = checkpoint_steps(ckpt)
    if steps:
        saved = f"saved up to RL step {steps[-1]} ({ckpt / str(steps[-1])})"
    elif reused := run.reusable_phases():
        saved = f"no RL checkpoint yet; a resume reuses {', '.join(map(str, reused))}"
    else:
        saved = "no checkpoint yet, a resume starts over"
    return f"interrupted; {saved}; resume with: {resume_command(argv)}"


def main(argv: list[str] | None = None) -> int:
    """Run the job from the command line; prints the summary; returns the exit status
    (0 done, 2 refused or failed on bad input/environment, 1 an unexpected error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("ENTR_DEBUG", "") not in ("", "0")
    warnings.formatwarning = _one_line_warning
    run_dir = None
    try:
        cfg, opts = parse(argv)
        run_dir = cfg.run_dir or f"runs/{cfg.name}"
        from learners.distributed import initialize

        initialize()  # multi-host: reads ENTR_* variables; a no-op for one process
        from experiments.run.compile_cache import enable

        enable()  # persistent compilation cache in the user cache (ENTR_JAX_CACHE=0: off)
        from experiments.run.job import Job

        job = Job(cfg, resume=opts.resume, resume_override=opts.resume_override)
        job.startup_s = time.perf_counter() - _STARTED
        summary = job.run_job()
    except KeyboardInterrupt:
        print(f"entr-run: {interrupted(run_dir, argv)}", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except Exception as err:  # noqa: BLE001 - every failure becomes one paragraph
        return _fail(err, debug, run_dir, argv)
    print(json.dumps({k: v for k, v in summary.items()
                      if k not in ("evals", "time/compilations_by_function")}, indent=2))
    if "time/phases" in summary:
        from experiments.run.phases import format_split

        print(format_split(summary["time/phases"], summary["time/counts"]["compilations"],
                           summary["time/phases_cpu"]["total_s"])
              + f"; start-up before the job {summary.get('time/startup_s') or 0:.0f} s")
    print(f"run directory: {job.run.path}")
    return 0


EXIT_GRACE_S = 60.0  # seconds a failed run waits for its background threads


def entry() -> None:
    """The ``entr-run`` command: `main`, then exit with its status. After a failure (a
    nonzero status) the process exits within ``ENTR_EXIT_GRACE_S`` seconds (default
    `EXIT_GRACE_S`) even if a background thread never finishes, saying which ones it
    left; every checkpoint the run saves has been waited for before the failure, so
    nothing saved is cut short."""
    code = main()
    if code:
        try:
            grace = float(os.environ.get("ENTR_EXIT_GRACE_S", EXIT_GRACE_S))
        except ValueError:
            grace = EXIT_GRACE_S
        threading.Thread(target=_exit_when_stuck, args=(code, grace), daemon=True,
                         name="entr-exit-guard").start()
    sys.exit(code)


def _exit_when_stuck(code: int, grace_s: float) -> None:
    time.sleep(grace_s)  # a daemon thread: the process normally exits before this ends
    stuck = sorted(t.name for t in threading.enumerate()
                   if not t.daemon and t is not threading.main_thread())
    print(f"entr-run: exiting with status {code}; {len(stuck)} background thread(s) still "
          f"waiting {grace_s:.0f} s after the failure: {', '.join(stuck)}",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
