"""A staleness tolerance map (ESTR Fig. 9 for any set of methods): each method's result after
RL as staleness grows, one line per method, with sync GRPO as the reference.

The runs come from a sweep spec with a ``[map]`` table (`experiments.multirun.sweep_spec.map_grids`;
example `experiments/sweeps/tolerance_map.toml`), run with ``python -m experiments.sweep run
SPEC --out DIR`` (resumable: finished runs are skipped). Its two axes cross at
``(inter_lag[0], intra_switches[0])``: the *inter* axis varies ``staleness.inter_lag`` at the
first ``intra_switches``, the *intra* axis varies ``staleness.intra_switches`` at the first
``inter_lag``. The reference is the comparison method that sets ``staleness.mode = sync``
(it reads no lag field, so it runs once per seed and is drawn as a band).

Per method, axis and staleness value, over the finished seeds: the mean of each metric with
its 95 % Student-t half-width (`experiments.analysis.stats.mean_ci`), and the paired
difference ``method - reference`` over the seeds both finished, with its 95 % t interval.
``inter (all)`` is the mean staleness the runs realised over every RL step
(`experiments.analysis.runs.measured_staleness`): with a fixed lag k the delay line fills
first, so a short run realises less than k (docs/stress.md section 3).

Metrics: the primary metric ``eval_ref_logp_after`` (teacher-forced mean log-likelihood per
token of the held-out reference solutions after RL, nats) and ``eval_accuracy_after``
(held-out avg@k); ``--metric`` chooses others from the runs' summaries. The figure draws each
method's mean with its interval against each axis, the reference's mean and band, and the
reference's level before RL (a line below it is a method that ended worse than it started).

Usage::

    python -m experiments.sweep run experiments/sweeps/tolerance_map.toml --out runs/map --workers 2
    python -m experiments.analysis.tolerance runs/map [--figure map.png] [--json map.json]
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from typing import Any, Sequence

from experiments.analysis.regime import label, setting, varying_fields
from experiments.analysis.runs import Run, load_runs, measured_staleness
from experiments.analysis.stats import mean_ci

METRICS = ("eval_ref_logp_after", "eval_accuracy_after")
AXES = ("inter", "intra")


def map_spec(out: str | pathlib.Path) -> dict[str, Any]:
    """The sweep spec a map directory was run from (its ``sweep_spec.json``); ValueError
    naming the file and the fix when it is missing or holds no ``[map]``."""
    path = pathlib.Path(out) / "sweep_spec.json"
    if not path.is_file():
        raise ValueError(f"{path} not found: run the map with `python -m experiments.sweep run "
                         f"SPEC --out {out}` (SPEC with a [map] and a [comparison] table)")
    spec = json.loads(path.read_text())
    if "map" not in spec:
        raise ValueError(f"{path} holds no [map] table: {out} is not a tolerance map "
                         "(see experiments/sweeps/tolerance_map.toml)")
    return spec


def reference_of(spec: dict[str, Any]) -> str:
    """The comparison method that sets ``staleness.mode = sync``; ValueError when none does."""
    for name, method in spec["comparison"]["methods"].items():
        if method.get("overrides", {}).get("staleness.mode") == "sync":
            return name
    raise ValueError("the map's [comparison] has no method with overrides "
                     "{ \"staleness.mode\" = \"sync\" }: add sync GRPO as the reference")


def _value(run: Run, metric: str) -> float:
    v = (run.summary or {}).get(metric)
    return float(v) if isinstance(v, (int, float)) else math.nan


def _paired(mine: dict[int, Run], ref: dict[int, Run], metric: str) -> tuple[float, float, int]:
    seeds = sorted(set(mine) & set(ref))
    return mean_ci([_value(mine[s], metric) - _value(ref[s], metric) for s in seeds])


def map_report(runs: Sequence[Run], spec: dict[str, Any],
               metrics: Sequence[str] = METRICS) -> dict[str, Any]:
    """The map as a dict: ``reference`` ``{name, seeds, <metric>: (mean, half, n),
    <metric>_before: ...}``, and ``rows``: one per (method, axis, value) with the runs'
    ``seeds``, realised ``inter_all``/``intra_all``, and per metric ``(mean, half, n)`` and
    ``<metric>_vs_ref`` (paired difference to the reference). Only finished runs count.

    Raises:
      ValueError: runs whose settings differ outside the staleness section and the
        objective (e.g. two run lengths), naming the fields: they are not pooled.
    """
    runs = [r for r in runs if r.summary is not None]
    if len({setting(r) for r in runs}) > 1:
        raise ValueError("the map's runs differ in " + ", ".join(varying_fields(
            [setting(r) for r in runs], shown=())) + ": one map holds one setting; run the "
            "other setting into another --out")
    ref_name = reference_of(spec)
    inter0, intra0 = spec["map"]["inter_lag"][0], spec["map"]["intra_switches"][0]
    ref = {r.seed: r for r in runs if label(r) == ref_name}
    before = {m: m.replace("_after", "_before") for m in metrics}
    reference = {"name": ref_name, "seeds": sorted(ref)}
    for m in metrics:
        reference[m] = mean_ci([_value(r, m) for r in ref.values()])
        reference[before[m]] = mean_ci([_value(r, before[m]) for r in ref.values()])
    rows = []
    for method in spec["comparison"]["methods"]:
        if method == ref_name:
            continue
        mine = [r for r in runs if label(r) == method]
        for axis, values in (("inter", spec["map"]["inter_lag"]),
                             ("intra", spec["map"]["intra_switches"])):
            for v in sorted(values):
                at = (v, intra0) if axis == "inter" else (inter0, v)
                here = {r.seed: r for r in mine if (r.inter_lag, r.intra_switches) == at}
                if not here:
                    continue
                realised = [measured_staleness(r, skip=0) for r in here.values()]
                row = {"method": method, "axis": axis, "value": v, "seeds": sorted(here),
                       "inter_all": sum(x[0] for x in realised) / len(realised),
                       "intra_all": sum(x[1] for x in realised) / len(realised)}
                for m in metrics:
                    row[m] = mean_ci([_value(r, m) for r in here.values()])
                    row[f"{m}_vs_ref"] = _paired(here, ref, m)
                rows.append(row)
    return {"inter_at": inter0, "intra_at": intra0, "metrics": list(metrics),
            "values": {"inter": list(spec["map"]["inter_lag"]),
                       "intra": list(spec["map"]["intra_switches"])},
            "reference": reference, "rows": rows}


def _ci(t: Sequence[float], digits: int, signed: bool = False) -> str:
    """``mean ± half (n)``; a difference (``signed``) carries its sign."""
    mean, half, n = t
    if not math.isfinite(mean):
        return "no data"
    m = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    return f"{m} ± {half:.{digits}f} ({n})" if math.isfinite(half) else f"{m} ({n})"


def _digits(metric: str) -> int:
    return 4 if "logp" in metric else 3


def format_report(report: dict[str, Any]) -> str:
    """Markdown: the reference line, then one table row per (method, axis, value);
    ``±`` is a 95 % t half-width over seeds, ``(n)`` the seeds it is over."""
    ref = report["reference"]
    ms = report["metrics"]
    lines = [f"Reference {ref['name']} over seeds {ref['seeds']}: " + "; ".join(
        f"{m} {_ci(ref[m], _digits(m))} (before RL {_ci(ref[m.replace('_after', '_before')], _digits(m))})"
        for m in ms), "",
        f"Axes cross at inter lag {report['inter_at']}, intra switches {report['intra_at']}; "
        "± is the 95 % t half-width over seeds, (n) the seeds; 'vs ref' is paired by seed.", "",
        "| method | axis | value | inter (all) | intra (all) | " + " | ".join(
            f"{m} | {m} vs {ref['name']}" for m in ms) + " |",
        "|" + "---|" * (5 + 2 * len(ms))]
    for r in report["rows"]:
        cells = " | ".join(f"{_ci(r[m], _digits(m))} | {_ci(r[m + '_vs_ref'], _digits(m), True)}"
                           for m in ms)
        lines.append(f"| {r['method']} | {r['axis']} | {r['value']} | {r['inter_all']:.1f} | "
                     f"{r['intra_all']:.1f} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.analysis.tolerance",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the map's sweep directory (--out of `experiments.sweep run`)")
    p.add_argument("--metric", action="append", default=None,
                   help=f"a summary metric to map (repeatable; default {', '.join(METRICS)})")
    p.add_argument("--figure", help="write the figure here (PNG)")
    p.add_argument("--json", help="write the report here (JSON)")
    args = p.parse_args(argv)
    try:
        report = map_report(load_runs(args.out), map_spec(args.out), args.metric or METRICS)
    except (FileNotFoundError, ValueError) as err:
        print(f"tolerance: error: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))
    if args.figure:
        from experiments.analysis.tolerance_plots import map_figure

        fig = map_figure(report)
        fig.savefig(args.figure, dpi=110, bbox_inches="tight")
        print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
