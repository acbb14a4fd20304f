"""Pre-registered method comparisons: every gate tuned on the same budget on tuning seeds,
the chosen values tested on held-out seeds, from frozen warm starts.

A study spec is a comparison sweep spec (`experiments.multirun.sweep`, `experiments.multirun.comparison`)
with two more tables, written and committed before any of its runs::

    preset = "stress"
    [preregistration]
    primary_metric = "eval_ref_logp_after"     # a summary.json key; higher is better
    secondary_metrics = ["eval_accuracy_after"]
    baseline = "grpo_async"                     # paired differences are taken against it
    arms = ["grpo_sync", "grpo_async", "entr", "icepop"]   # compared in the test stage
    tuning_arms = ["grpo_sync", "grpo_async"]  # also run on the tuning seeds (untuned)
    rule_arm = "entr"                           # + "entr_rule": tau from the decomposition
    rule_tokens = "material"                    # the rule's tokens: "all" or |delta| > 0.01
    tuning_seeds = [1000, 1001]
    test_seeds = [0, 1, 2]
    [[preregistration.warm_starts]]             # a blocking factor; runs refuse other weights
    name = "A"
    path = "warm_starts/stress_a"
    sha256 = "..."                              # sha256sum model.safetensors
    [tuning.entr]                               # candidates of a method's own parameters
    own = [{ tau = 1.0 }, { tau = 2.0 }, { tau = 4.0 }, { tau = 8.0 }]
    [comparison] ...                            # base and methods, as in a sweep spec
    [fixed] ...

Stages (each a set of sweeps, one per warm start, resumable: finished runs are skipped;
run in paired blocks, every arm of a seed on every warm start before the next seed, so a
stage cut short leaves whole (warm start, seed) pairs):

* ``tune``: every candidate of every ``[tuning.X]`` method (labels ``X@0``, ``X@1``, ...)
  and the ``tuning_arms`` on ``tuning_seeds`` x warm starts, into ``OUT/tune/<ws>/``;
* ``choose``: per tuned method, the candidate with the highest mean primary metric over
  its tuning runs (ties: the earlier candidate) -> ``OUT/choice.json``, with every
  candidate's mean; with ``rule_arm``, the ENTR ``tau`` that cuts at most 2 % of the
  staleness-dominated tokens of the baseline's tuning runs (`experiments.analysis.decompose`)
  becomes the arm ``<rule_arm>_rule``;
* ``test``: the ``arms`` with their chosen values (+ the rule arm) on ``test_seeds`` x
  warm starts, into ``OUT/test/<ws>/``;
* ``report``: `experiments.analysis.study_report`, printed and written to
  ``OUT/report.md`` and ``OUT/report.json`` (an interim look says so); ``--figures``: also
  ``OUT/report_paired.png`` (`experiments.analysis.study_plots`).

Usage::

    python -m experiments.study plan   SPEC.toml                  # what each stage runs
    python -m experiments.study tune   SPEC.toml --out DIR --workers 2
    python -m experiments.study status SPEC.toml --out DIR     # the tuning runs so far
    python -m experiments.study choose SPEC.toml --out DIR
    python -m experiments.study test   SPEC.toml --out DIR --workers 2
    python -m experiments.study report SPEC.toml --out DIR
    python -m experiments.study archive SPEC.toml --out DIR --to results/NAME   # to commit

Paths in a study (warm starts) are relative to the directory the command runs in: the
repository root.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import pathlib
import sys
import tomllib
from typing import Any

from experiments.multirun import comparison, provenance, sweep
from experiments.multirun.study_archive import archive
from experiments.multirun.study_args import check_args, load_choice

REQUIRED = ("primary_metric", "baseline", "arms", "tuning_seeds", "test_seeds", "warm_starts")


def load_study(path: str | pathlib.Path) -> dict[str, Any]:
    """Read and check a study spec; ValueError naming the offending key."""
    where = f"study spec {path}"
    try:
        with open(path, "rb") as f:
            spec = tomllib.load(f)
    except OSError as err:
        raise ValueError(f"{where}: cannot be read ({err.strerror}): pass a study's .toml file, "
                         "e.g. experiments/studies/stress_fp8.toml") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{where} is not TOML ({err}): pass a study's .toml file") from None
    unknown = set(spec) - {"preset", "preregistration", "tuning", "comparison", "fixed"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    pre = spec.get("preregistration")
    if not isinstance(pre, dict):
        raise ValueError(f"{where}: a [preregistration] table is required")
    missing = [k for k in REQUIRED if k not in pre]
    if missing:
        raise ValueError(f"{where}: [preregistration] lacks {missing}")
    if "comparison" not in spec:
        raise ValueError(f"{where}: a [comparison] table is required (the arms' methods)")
    methods = spec["comparison"].get("methods", {})
    for arm in [*pre["arms"], pre["baseline"], *pre.get("tuning_arms", [])]:
        if arm not in methods:
            raise ValueError(f"{where}: arm {arm!r} is not a [comparison.methods] table")
    for name, t in spec.get("tuning", {}).items():
        if name not in methods:
            raise ValueError(f"{where}: [tuning.{name}] names no [comparison.methods] table")
        if not isinstance(t.get("own"), list) or not t["own"]:
            raise ValueError(f"{where}: [tuning.{name}] own must be a non-empty list of tables")
    if set(pre["tuning_seeds"]) & set(pre["test_seeds"]):
        raise ValueError(f"{where}: tuning_seeds and test_seeds overlap: "
                         f"{sorted(set(pre['tuning_seeds']) & set(pre['test_seeds']))}")
    for ws in pre["warm_starts"]:
        if set(ws) != {"name", "path", "sha256"}:
            raise ValueError(f"{where}: each warm start needs exactly name, path, sha256: {ws}")
    rule = pre.get("rule_arm")
    if rule is not None and methods.get(rule, {}).get("objective") != "entr":
        raise ValueError(f"{where}: rule_arm {rule!r} must be an ENTR method")
    if pre.setdefault("rule_tokens", "all") not in ("all", "material"):
        raise ValueError(f"{where}: rule_tokens must be \"all\" or \"material\", got "
                         f"{pre['rule_tokens']!r}")
    spec.setdefault("fixed", {})
    spec.setdefault("tuning", {})
    return spec


def _sweep_spec(study: dict[str, Any], methods: dict[str, dict], seeds: list[int],
                ws: dict[str, str]) -> dict[str, Any]:
    """The sweep spec of one stage and warm start (checked as `sweep.load_spec` checks)."""
    spec = {"preset": study["preset"], "seeds": list(seeds), "grid": [{}],
            "fixed": {**study["fixed"], "model.path": ws["path"], "model.sha256": ws["sha256"]},
            "comparison": {"base": study["comparison"].get("base", {}), "methods": methods}}
    comparison.parse_methods(spec, f"study stage ({ws['name']})")
    return spec


def _with_own(method: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(method)
    out["own"] = {**out.get("own", {}), **own}
    return out


def tuning_methods(study: dict[str, Any]) -> dict[str, dict]:
    """Label -> method of the tuning stage: ``X@i`` for candidate i of ``[tuning.X]``, and
    the ``tuning_arms`` as they are."""
    methods = study["comparison"]["methods"]
    out = {f"{name}@{i}": _with_own(methods[name], own)
           for name, t in study["tuning"].items() for i, own in enumerate(t["own"])}
    out.update({a: methods[a] for a in study["preregistration"].get("tuning_arms", [])})
    return out


def test_methods(study: dict[str, Any], choice: dict[str, Any]) -> dict[str, dict]:
    """Label -> method of the test stage: each arm with its chosen own values (tuned
    methods), plus the rule arm."""
    methods = study["comparison"]["methods"]
    out = {}
    for arm in study["preregistration"]["arms"]:
        chosen = choice["chosen"].get(arm)
        out[arm] = _with_own(methods[arm], chosen["own"]) if chosen else methods[arm]
    rule = study["preregistration"].get("rule_arm")
    if rule:
        out[f"{rule}_rule"] = _with_own(methods[rule], {"tau": choice["rule"]["tau"]})
    return out


def stage_sweeps(study: dict[str, Any], stage: str, out: str | pathlib.Path,
                 choice: dict[str, Any] | None = None, sets: dict[str, Any] | None = None,
                 warm_start: str | None = None) -> list[tuple[dict, pathlib.Path]]:
    """``[(sweep spec, out dir)]`` of a stage, one per warm start (only ``warm_start``'s
    when given); ``sets`` replace or add ``[fixed]`` entries (`experiments.multirun.sweep.apply_set`:
    a smaller copy of the study, e.g. for a CI slice; refused for a key a method sets).

    Raises:
      ValueError: ``warm_start`` names none of the study's warm starts.
    """
    pre = study["preregistration"]
    names = [ws["name"] for ws in pre["warm_starts"]]
    if warm_start is not None and warm_start not in names:
        raise ValueError(f"--warm-start {warm_start!r}: the study's warm starts are {names}")
    methods = tuning_methods(study) if stage == "tune" else test_methods(study, choice)
    seeds = pre["tuning_seeds"] if stage == "tune" else pre["test_seeds"]
    return [(sweep.apply_set(_sweep_spec(study, methods, seeds, ws), sets or {}),
             pathlib.Path(out) / stage / ws["name"]) for ws in pre["warm_starts"]
            if warm_start in (None, ws["name"])]


def run_stage(study: dict[str, Any], stage: str, out: str | pathlib.Path, workers: int,
              choice: dict[str, Any] | None = None, only: str | None = None,
              sets: dict[str, Any] | None = None, warm_start: str | None = None,
              record_diff: bool = False) -> list[dict]:
    """Run a stage's sweeps (finished runs skipped) in paired blocks: the runs of the first
    seed on every warm start (all arms), then the next seed's, so a stage cut short
    leaves whole (warm start, seed) pairs to compare; returns the run records. Refused
    from a tree that is not a commit on main (`experiments.multirun.provenance.check_tree`)."""
    seeds = study["preregistration"]["tuning_seeds" if stage == "tune" else "test_seeds"]
    keyed, sweeps = [], stage_sweeps(study, stage, out, choice, sets, warm_start)
    for w, (spec, where) in enumerate(sweeps):
        runs = sweep.expand(spec, where)
        comparison.verify(spec, runs)
        keyed += [((seeds.index(r.overrides["seed"]), w, i), r) for i, r in enumerate(runs)]
    chosen = sweep.select([r for _, r in sorted(keyed, key=lambda kr: kr[0])], only)
    provenance.check_tree(out, stage, record_diff)
    for spec, where in sweeps:  # written once the selection is known to be good
        comparison.write_spec(spec, where)
    return sweep.run_runs(study["preset"], chosen, workers)


def plan(study: dict[str, Any]) -> dict[str, Any]:
    """What each stage runs: the registration, the tuning grids, the tune stage's method
    labels, each test arm and where its values come from, and the run counts."""
    pre = study["preregistration"]
    blocks = len(pre["warm_starts"])
    arms = {a: "tuned: the choose stage's candidate" if a in study["tuning"]
            else "untuned: its [comparison.methods] values" for a in pre["arms"]}
    if pre.get("rule_arm"):
        arms[f"{pre['rule_arm']}_rule"] = "tau from the baseline's tuning runs (choose)"
    return {"preregistration": pre, "tuning": study["tuning"],
            "tune_methods": list(tuning_methods(study)), "test_arms": arms,
            "tune_runs": len(tuning_methods(study)) * len(pre["tuning_seeds"]) * blocks,
            "test_runs": len(arms) * len(pre["test_seeds"]) * blocks}


def _metric(summary: dict[str, Any], key: str) -> float:
    value = summary.get(key)
    return float(value) if value is not None else float("nan")


def stage_results(study: dict[str, Any], stage: str, out: str | pathlib.Path,
                  choice: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per finished run of a stage: ``arm`` (method label), ``ws``, ``seed``,
    ``path`` and every pre-registered metric."""
    pre = study["preregistration"]
    keys = [pre["primary_metric"], *pre.get("secondary_metrics", [])]
    rows = []
    for spec, where in stage_sweeps(study, stage, out, choice):
        ws = where.name
        for run in sweep.expand(spec, where):
            path = run.run_dir / "summary.json"
            if not path.exists():
                continue
            summary = json.loads(path.read_text())
            rows.append({"arm": json.loads((run.run_dir / "config.json").read_text())["name"],
                         "ws": ws, "seed": run.overrides["seed"], "path": str(run.run_dir),
                         **{k: _metric(summary, k) for k in keys}})
    return rows


def tune_status(study: dict[str, Any], out: str | pathlib.Path) -> list[dict[str, Any]]:
    """The tuning stage so far, one row per method label (``X@i`` candidates, then the
    tuning arms): ``own`` (the candidate's values), ``done`` / ``expected`` runs, the mean
    primary metric over the finished ones (NaN when none; not a choice until every
    candidate has all its runs, `choose`) and ``values`` {``ws/seed``: metric}."""
    pre = study["preregistration"]
    key = pre["primary_metric"]
    rows = stage_results(study, "tune", out)
    expected = len(pre["tuning_seeds"]) * len(pre["warm_starts"])
    candidates = {f"{name}@{i}": own for name, t in study["tuning"].items()
                  for i, own in enumerate(t["own"])}
    out_rows = []
    for label, method in tuning_methods(study).items():
        mine = [r for r in rows if r["arm"] == label]
        vals = [r[key] for r in mine]
        out_rows.append({"label": label, "own": candidates.get(label, method.get("own", {})),
                         "done": len(mine),
                         "expected": expected,
                         "mean": sum(vals) / len(vals) if vals else float("nan"),
                         "values": {f"{r['ws']}/{r['seed']}": r[key] for r in mine}})
    return out_rows


def choose(study: dict[str, Any], out: str | pathlib.Path) -> dict[str, Any]:
    """The tuning stage's choice (see the module docstring); written to ``OUT/choice.json``.

    Raises:
      ValueError: a tuning run (a candidate's or a tuning arm's, on a tuning seed x warm
        start) is unfinished; the message lists every one.
    """
    pre = study["preregistration"]
    key = pre["primary_metric"]
    rows = {r["label"]: r for r in tune_status(study, out)}
    runs = [f"{ws['name']}/{s}" for ws in pre["warm_starts"] for s in pre["tuning_seeds"]]
    lacking = {label: [k for k in runs if k not in r["values"]] for label, r in rows.items()}
    lacking = {label: ks for label, ks in lacking.items() if ks}
    if len(lacking) == len(rows) and all(len(ks) == len(runs) for ks in lacking.values()):
        raise ValueError(f"choose: no finished tuning runs under {pathlib.Path(out) / 'tune'}: "
                         "run the tune stage first (or pass the --out it wrote)")
    if lacking:
        raise ValueError(
            f"choose: {sum(map(len, lacking.values()))} of {len(rows) * len(runs)} tuning runs "
            "are unfinished (method: warm start/seed): "
            + "; ".join(f"{label}: {', '.join(ks)}" for label, ks in lacking.items())
            + "; finish them with the tune stage on the same --out (finished runs are skipped)")
    chosen, candidates = {}, {}
    for name, t in study["tuning"].items():
        means = [rows[f"{name}@{i}"]["mean"] for i in range(len(t["own"]))]
        best = max(range(len(means)), key=lambda i: (means[i], -i))
        chosen[name] = {"own": t["own"][best], "index": best, "mean": means[best]}
        candidates[name] = [{"own": own, "mean": m} for own, m in zip(t["own"], means)]
    result = {"primary_metric": key, "chosen": chosen, "candidates": candidates,
              "tuning_runs_per_candidate": len(runs)}
    if pre.get("rule_arm"):
        result["rule"] = rule_tau(study, out)
    path = pathlib.Path(out) / "choice.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return result


def rule_tau(study: dict[str, Any], out: str | pathlib.Path) -> dict[str, Any]:
    """The ENTR ``tau`` that cuts at most 2 % of the staleness-dominated tokens of the
    baseline's tuning runs (no gate shapes their tokens), from the decomposition
    (`experiments.analysis.decompose.gate_report`, ``tau_rule_2pct``); over the material
    tokens (``|delta| > 0.01``) alone when the registration's ``rule_tokens`` says so."""
    from experiments.analysis import decompose
    from experiments.analysis.runs import load_run

    pre = study["preregistration"]
    paths = [r["path"] for r in stage_results(study, "tune", out) if r["arm"] == pre["baseline"]]
    if not paths:
        raise ValueError(f"choose: no finished tuning runs of the baseline {pre['baseline']!r} "
                         "to set the rule's tau from")
    tokens, seq = decompose.load([load_run(p) for p in paths])
    eps = study["comparison"]["methods"][pre["rule_arm"]].get("own", {}).get("eps", 0.01)
    gates = decompose.gate_report(tokens, seq, eps)
    tau = (gates if pre["rule_tokens"] == "all" else gates["material"]).get("tau_rule_2pct", math.nan)
    if not math.isfinite(tau):
        raise ValueError("choose: the decomposition gives no finite tau for the rule")
    return {"tau": float(tau), "stale_cut_budget": 0.02, "runs": paths, "tokens": len(tokens),
            "rule_tokens": pre["rule_tokens"]}


def stage_walls(study: dict[str, Any], out: str | pathlib.Path) -> dict[str, dict]:
    """`study_report.stage_times` of each stage so far (the test stage once
    ``OUT/choice.json`` exists)."""
    from experiments.analysis.study_report import stage_times

    choice = load_choice(study, out) if (pathlib.Path(out) / "choice.json").exists() else None
    return {stage: stage_times(stage_results(study, stage, out, choice))
            for stage in (("tune", "test") if choice else ("tune",))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.study", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=("plan", "tune", "status", "choose", "test", "report",
                                          "archive"))
    parser.add_argument("spec")
    parser.add_argument("--out", default=None)
    parser.add_argument("--workers", type=int, default=None, help="tune/test (default 1)")
    parser.add_argument("--only", metavar="REGEX", default=None,
                        help="only the runs whose name matches REGEX (tune/test)")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=None,
                        help="replace or add a [fixed] entry (tune/test; a smaller copy)")
    parser.add_argument("--to", metavar="DIR", default=None,
                        help="archive: the folder the finished runs' small files go to")
    parser.add_argument("--figures", action="store_true", default=None,
                        help="report: also OUT/report_paired.png (matplotlib)")
    parser.add_argument("--record-diff", action="store_true", default=None,
                        help="tune/test: run from uncommitted changes, writing their diff "
                             "to OUT (refused otherwise)")
    parser.add_argument("--warm-start", metavar="NAME", default=None,
                        help="only this warm start's runs (tune/test; e.g. one per machine)")
    args = parser.parse_args(argv)
    try:
        check_args(args)
        study = load_study(args.spec)
        choice = load_choice(study, args.out) if args.stage in ("test", "report") else None
        if args.stage == "plan":
            print(json.dumps(plan(study), indent=1))
            return 0
        if args.stage == "archive":
            if not args.to:
                raise ValueError("archive needs --to DIR")
            print(f"{archive(study, args.out, args.to)} finished runs archived in {args.to}")
            return 0
        if args.stage == "status":
            from experiments.analysis.study_report import format_stage_times, format_tune_status

            print(format_tune_status(study["preregistration"]["primary_metric"],
                                     tune_status(study, args.out)))
            print(format_stage_times(stage_walls(study, args.out)))
            return 0
        if args.stage == "choose":
            print(json.dumps(choose(study, args.out), indent=1))
            return 0
        if args.stage == "report":
            from experiments.analysis.study_report import format_report, study_report

            rows = stage_results(study, "test", args.out, choice)
            if not rows:
                raise ValueError(f"no finished test runs under {pathlib.Path(args.out) / 'test'}: "
                                 "run the test stage first (or pass the --out it wrote)")
            report = study_report(study, rows, choice)
            text = format_report(report)
            (pathlib.Path(args.out) / "report.json").write_text(json.dumps(report, indent=1) + "\n")
            (pathlib.Path(args.out) / "report.md").write_text(text + "\n")
            if args.figures:
                from experiments.analysis.study_plots import paired_figure

                paired_figure(report).savefig(pathlib.Path(args.out) / "report_paired.png", dpi=120)
            print(text)
            return 0
        records = run_stage(study, args.stage, args.out, args.workers or 1, choice, args.only,
                            sweep.parse_set(args.set or []), args.warm_start,
                            bool(args.record_diff))
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"study: error: {err}", file=sys.stderr)
        return 2
    for rec in records:
        print(json.dumps(rec))
    failed = [r for r in records if r["status"].startswith("rc=")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
