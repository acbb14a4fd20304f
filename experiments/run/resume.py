"""The resume policy: compare the new configuration with the run's saved one, decide,
and say what happens.

``--resume`` continues the run in ``run_dir`` only with the configuration it was started
with. Fields that cannot change the results (`RESULT_NEUTRAL_FIELDS` and
`RESULT_NEUTRAL_SECTIONS`: where files go, how often and how many checkpoints are kept,
diagnostics, W&B logging) may differ; any other
difference refuses the resume, listing every differing field as ``old -> new``, unless
``--resume-override`` is given: then the run continues with the new values and the
change is appended to ``resume_overrides.jsonl`` in the run directory (with the step it
applies from). A finished run (``summary.json``) is never continued: resuming it with the
same configuration says so and shows its summary; with a different one it is refused,
since the summary belongs to the saved configuration.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any, Literal

from experiments.run.config import with_field_defaults
from experiments.run.errors import ResumeRefused
from experiments.run.rundir import RunDir

__all__ = ["RESULT_NEUTRAL_FIELDS", "RESULT_NEUTRAL_SECTIONS", "Change", "ResumePlan", "announce", "config_changes",
           "plan_resume", "record_changes", "say"]

# Dotted config fields that cannot change what a run computes. Everything else that
# differs from the saved config.json refuses a resume (unless --resume-override).
RESULT_NEUTRAL_FIELDS: frozenset[str] = frozenset({
    "name",                   # a label (the default run directory)
    "run_dir",                # where the files are
    "shared_eval_dir",        # where the initial evaluation is shared from (same values)
    "checkpoint.every",       # when state is saved: a resumed run is bitwise the same
    "checkpoint.sft_every",   # when the warm start's state is saved: the same bitwise
    "checkpoint.keep",        # how many checkpoints are kept
    "token_samples_every",    # diagnostics for the notebooks, read-only on the learner
    "learner.max_bad_steps",  # when a diverging run is stopped, not what it computes
    "sampler.export_dir",     # where SGLang weight exports are written
    "sampler.api_key",        # credentials of the SGLang fleet
    "sampler.server_urls",    # which hosts serve the fleet (same weights, same requests)
    "verifier.num_workers",   # how many processes check answers (same answers, same scores)
})
# Sections whose every field is result-neutral: where metrics are also sent (W&B), and the
# SGLang fleet's timeouts, retries and health rules (same weights, same requests).
RESULT_NEUTRAL_SECTIONS: tuple[str, ...] = ("logging.", "sampler.fleet.")

_MISSING = "<absent>"
_SHOWN = 10  # differing fields spelled out in a refusal


@dataclasses.dataclass(frozen=True)
class Change:
    """One differing config field: dotted ``field``, saved value ``old``, new value ``new``
    (``"<absent>"`` for a field one side does not have)."""

    field: str
    old: Any
    new: Any

    @property
    def neutral(self) -> bool:
        return (self.field in RESULT_NEUTRAL_FIELDS
                or self.field.startswith(RESULT_NEUTRAL_SECTIONS))

    def __str__(self) -> str:
        return f"{self.field}: {json.dumps(self.old)} -> {json.dumps(self.new)}"


@dataclasses.dataclass(frozen=True)
class ResumePlan:
    """What ``--resume`` does: ``fresh`` (nothing to continue), ``continue`` (a checkpoint
    to restore) or ``finished`` (summary.json exists); ``changes`` are every differing
    field, ``overrides`` the result-changing ones accepted by ``--resume-override``."""

    action: Literal["fresh", "continue", "finished"]
    changes: tuple[Change, ...] = ()
    overrides: tuple[Change, ...] = ()


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def config_changes(saved: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """Every dotted field whose value differs between two config dicts (sorted)."""
    a, b = _flatten(saved), _flatten(new)
    return [Change(k, a.get(k, _MISSING), b.get(k, _MISSING))
            for k in sorted(set(a) | set(b)) if a.get(k, _MISSING) != b.get(k, _MISSING)]


def _listing(changes: list[Change]) -> str:
    shown = "; ".join(map(str, changes[:_SHOWN]))
    more = len(changes) - _SHOWN
    return shown + (f"; and {more} more" if more > 0 else "")


def plan_resume(run: RunDir, config_json: str, override: bool = False) -> ResumePlan:
    """Decide what ``--resume`` does with ``run`` and the new config (`RunConfig.to_json`).

    Raises:
      ResumeRefused: ``run`` holds no run (no ``config.json`` and nothing `RunDir.holds_run`
        counts: a mistyped ``--run_dir``); a result-changing difference without ``override`` (also for a run
        with no checkpoint yet, which starts over in its directory); any
        result-changing difference for a finished run; a run with checkpoints but no
        ``config.json`` to compare with (without ``override``). The message lists the
        differing fields as ``field: old -> new``. A field the saved ``config.json`` lacks
        (it predates the field) compares as its default
        (`experiments.run.config.with_field_defaults`).
    """
    new = json.loads(config_json)
    saved_path = run / "config.json"
    if not saved_path.is_file() and not run.holds_run():  # a typo must not start a new run
        raise ResumeRefused(
            f"nothing to resume at {run.path}: it holds no run (no config.json, metrics.jsonl, "
            "checkpoint or summary.json); drop --resume to start a run there, or give the "
            "--run_dir of the run to continue")
    if not (run.is_finished() or run.has_checkpoint()):
        return _plan_fresh(run, saved_path, new, override)
    if not saved_path.is_file():
        if not override:
            raise ResumeRefused(
                f"cannot resume {run.path}: it has checkpoints but no config.json to compare "
                "the new configuration with; pass --resume-override to continue with this one")
        saved: dict[str, Any] = {}
    else:
        try:
            saved = json.loads(saved_path.read_text())
        except json.JSONDecodeError as e:
            raise ResumeRefused(f"cannot resume {run.path}: {saved_path} is not valid JSON "
                                f"({e.msg}, line {e.lineno})") from None
    if saved:  # a config.json from before a field existed ran with that field's default
        saved, new = with_field_defaults(saved), with_field_defaults(new)
    changes = config_changes(saved, new)
    changing = [c for c in changes if not c.neutral]
    if run.is_finished():
        if changing:
            raise ResumeRefused(
                f"{run.path} is a finished run (summary.json) and its configuration differs: "
                f"{_listing(changing)}. Its summary belongs to the saved configuration; a "
                "finished run is not continued, even with --resume-override: choose a new "
                "--run_dir")
        return ResumePlan("finished", tuple(changes))
    if changing and not override:
        raise ResumeRefused(
            f"cannot resume {run.path}: the configuration differs from the saved one in "
            f"{len(changing)} field(s) that change the experiment: {_listing(changing)}. "
            "Resume with the saved values, choose a new --run_dir, or pass "
            "--resume-override to continue with the new values (recorded in "
            "resume_overrides.jsonl)")
    return ResumePlan("continue", tuple(changes), tuple(changing))


def _plan_fresh(run: RunDir, saved_path: Any, new: dict[str, Any], override: bool) -> ResumePlan:
    """A run with no checkpoint yet starts over, in its own directory, only with its own
    configuration (a result-changing difference needs ``override``)."""
    if not saved_path.is_file():
        return ResumePlan("fresh")
    try:
        saved = with_field_defaults(json.loads(saved_path.read_text()))
    except (json.JSONDecodeError, TypeError, AttributeError):  # a torn config.json
        return ResumePlan("fresh")
    changes = config_changes(saved, with_field_defaults(new))
    changing = [c for c in changes if not c.neutral]
    if changing and not override:
        raise ResumeRefused(
            f"cannot resume {run.path}: it has no RL checkpoint yet, and the configuration "
            f"differs from the saved one in {len(changing)} field(s) that change the "
            f"experiment: {_listing(changing)}. Resume with the saved values (the phases "
            "it finished are reused), choose a new --run_dir, or pass --resume-override "
            "to start over with the new values (recorded in resume_overrides.jsonl)")
    return ResumePlan("fresh", tuple(changes), tuple(changing))


def record_changes(run: RunDir, plan: ResumePlan, step: int) -> None:
    """Append the plan's changes (if any) to ``resume_overrides.jsonl``: time, the step
    they apply from, and every changed field with ``old``, ``new`` and whether it was a
    result-changing override."""
    if not plan.changes:
        return
    run.append_jsonl("resume_overrides.jsonl", {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "from_step": step,
        "changes": [{"field": c.field, "old": c.old, "new": c.new, "override": not c.neutral}
                    for c in plan.changes],
    })


def announce(run: RunDir, plan: ResumePlan, step: int, checkpoint: str, data_batch: int) -> None:
    """Record the plan's changes (`record_changes`) and say where the run resumed: RL step
    (= the next batch id), the data iterator's position and the checkpoint's path."""
    record_changes(run, plan, step)
    overriding = ", ".join(c.field for c in plan.overrides)
    say(run, f"resuming {run.path} at RL step {step} (next batch id {step}; data iterator at "
             f"batch {data_batch}) from checkpoint {checkpoint}"
             + (f"; overriding {overriding}" if overriding else ""))


def say(run: RunDir, message: str) -> None:
    """One line on stderr and in ``logs/run.log``."""
    print(f"entr-run: {message}", file=sys.stderr, flush=True)
    run.log("run", message)
