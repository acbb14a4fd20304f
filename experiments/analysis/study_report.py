"""The report of a pre-registered study (`experiments.multirun.study`): per arm, the primary and
secondary metrics with 95 % intervals; paired differences against the baseline (and the
sync arm) over (warm start, seed) pairs with 95 % t intervals; the smallest difference the
design could detect with 80 % power; each arm's tuned value beside its result.

Paired difference of arms A and B: ``d_i = metric(A, w_i, s_i) - metric(B, w_i, s_i)``
over the pairs (warm start, seed) both finished; interval ``mean(d) +- t_{0.975, n-1}
sd(d) / sqrt(n)``. Detectable difference (two-sided paired t test at level alpha, power
1 - beta): ``(t_{1-alpha/2, n-1} + t_{1-beta, n-1}) sd(d) / sqrt(n)`` (the usual
approximation that treats the noncentral t as shifted).
"""

from __future__ import annotations

import datetime
import json
import math
import pathlib
from typing import Any, Sequence

import numpy as np
from scipy import stats as _st

from experiments.analysis.stats import mean_ci
from experiments.run.jsonl import read_records


def detectable_difference(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true paired difference a two-sided paired t test of ``n`` pairs with
    standard deviation ``sd`` detects with probability ``power`` at level ``alpha``
    (NaN for ``n < 2``)."""
    if n < 2 or not math.isfinite(sd):
        return float("nan")
    return float((_st.t.ppf(1 - alpha / 2, n - 1) + _st.t.ppf(power, n - 1)) * sd / math.sqrt(n))


def paired(rows: Sequence[dict[str, Any]], a: str, b: str, key: str) -> dict[str, Any]:
    """Paired difference ``a - b`` of ``key`` over (ws, seed) pairs (module docstring)."""
    va = {(r["ws"], r["seed"]): r[key] for r in rows if r["arm"] == a}
    vb = {(r["ws"], r["seed"]): r[key] for r in rows if r["arm"] == b}
    pairs = sorted(set(va) & set(vb))
    d = np.array([va[p] - vb[p] for p in pairs], np.float64)
    d = d[np.isfinite(d)]
    mean, half, n = mean_ci(d.tolist())
    sd = float(d.std(ddof=1)) if n > 1 else float("nan")
    return {"mean": mean, "ci95": [mean - half, mean + half] if n > 1 else None, "n": n,
            "sd": sd, "detectable_80": detectable_difference(sd, n),
            "by_ws": {ws: float(np.mean([va[p] - vb[p] for p in pairs if p[0] == ws]))
                      for ws in sorted({p[0] for p in pairs})}}


def p_value(mean: float, sd: float, n: int) -> float:
    """Two-sided p-value of the paired t test of ``mean = 0`` (NaN for ``n < 2``)."""
    if n < 2 or not math.isfinite(sd):
        return float("nan")
    if sd == 0:
        return 0.0 if mean != 0 else 1.0
    return float(2 * _st.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))


def holm(p: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values of a family ``{name: p}`` (Holm 1979): sorted
    ascending, ``p_(i) * (m - i + 1)`` made monotone and capped at 1; NaN stays NaN and
    does not count in ``m``."""
    finite = sorted((v, k) for k, v in p.items() if math.isfinite(v))
    m, out, run = len(finite), {k: float("nan") for k in p}, 0.0
    for i, (v, k) in enumerate(finite):
        run = max(run, min(1.0, v * (m - i)))
        out[k] = run
    return out


def adjust_family(entries: dict[str, dict[str, Any]], alpha: float = 0.05) -> None:
    """Add to each `paired` result of one family of comparisons (e.g. every arm against the
    baseline, in one metric) its ``p`` (paired t), ``p_holm`` (`holm` over the family) and
    ``ci_bonferroni``: the simultaneous interval at level ``1 - alpha / m`` (m = the
    family's size), the interval that goes with a Bonferroni-adjusted test; Holm rejects
    at least what Bonferroni does."""
    ps = {k: p_value(e["mean"], e["sd"], e["n"]) for k, e in entries.items()}
    adjusted = holm(ps)
    m = sum(math.isfinite(v) for v in ps.values())
    for k, e in entries.items():
        e["p"], e["p_holm"] = ps[k], adjusted[k]
        if e["n"] > 1 and m:
            half = _st.t.ppf(1 - alpha / (2 * m), e["n"] - 1) * e["sd"] / math.sqrt(e["n"])
            e["ci_bonferroni"] = [e["mean"] - half, e["mean"] + half]
        else:
            e["ci_bonferroni"] = None


def mask_fraction(path: str) -> float:
    """Mean of a run's per-step ``mask/fraction`` (0 for an objective without a gate)."""
    vals = [r["mask/fraction"] for r in read_records(pathlib.Path(path) / "metrics.jsonl")
            if "mask/fraction" in r]
    return float(np.mean(vals)) if vals else 0.0


def study_report(study: dict[str, Any], rows: list[dict[str, Any]],
                 choice: dict[str, Any]) -> dict[str, Any]:
    """The study's report from its test-stage rows (`experiments.multirun.study.stage_results`):
    per arm its runs, tuned value, mean mask fraction, every pre-registered metric with its
    95 % interval, and the paired differences to the baseline and the sync arm (`paired`);
    ``runs_done`` of ``runs_expected`` (arms + rule arm x test seeds x warm starts): fewer
    means an interim look, not the pre-registered analysis."""
    pre = study["preregistration"]
    keys = [pre["primary_metric"], *pre.get("secondary_metrics", [])]
    arms = sorted({r["arm"] for r in rows}, key=lambda a: (a != pre["baseline"], a))
    n_arms = len(pre["arms"]) + bool(pre.get("rule_arm"))
    out: dict[str, Any] = {"primary_metric": pre["primary_metric"], "baseline": pre["baseline"],
                           "secondary_metrics": keys[1:], "runs_done": len(rows),
                           "runs_expected": n_arms * len(pre["test_seeds"]) * len(pre["warm_starts"]),
                           "arms": {}}
    sync = next((a for a in arms if study["comparison"]["methods"].get(a, {}).get(
        "overrides", {}).get("staleness.mode") == "sync"), None)
    out["sync"] = sync
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        entry: dict[str, Any] = {"runs": len(mine),
                                 "tuned": choice["chosen"].get(arm, {}).get("own"),
                                 "mask_fraction": float(np.mean([mask_fraction(r["path"]) for r in mine]))}
        if arm.endswith("_rule") and "rule" in choice:
            entry["tuned"] = {"tau": choice["rule"]["tau"], "by": "rule (2% of drift cut)"}
        for k in keys:
            m, h, n = mean_ci([r[k] for r in mine])
            entry[k] = {"mean": m, "ci95_half": h, "n": n}
            if arm != pre["baseline"]:
                entry.setdefault("vs_baseline", {})[k] = paired(rows, arm, pre["baseline"], k)
            if sync and arm != sync:
                entry.setdefault("vs_sync", {})[k] = paired(rows, arm, sync, k)
        out["arms"][arm] = entry
    for family in ("vs_baseline", "vs_sync"):  # Holm across the arms, per metric
        for k in keys:
            adjust_family({a: e[family][k] for a, e in out["arms"].items() if family in e})
    return out


def _num(v: float | None, fmt: str = "+.4f") -> str:
    return "n/a" if v is None or not math.isfinite(v) else format(v, fmt)


def _ci(p: dict[str, Any] | None, fmt: str = "+.4f") -> str:
    """``mean [lo, hi]`` of a `paired` result ("" without one, the mean alone for n < 2)."""
    if not p:
        return ""
    if not p["ci95"]:
        return f"{_num(p['mean'], fmt)} (n={p['n']})"
    return f"{_num(p['mean'], fmt)} [{_num(p['ci95'][0], fmt)}, {_num(p['ci95'][1], fmt)}]"


def _tuned(t: dict[str, Any] | None) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in (t or {}).items())


def format_report(report: dict[str, Any]) -> str:
    """Markdown: the primary metric per arm with the paired differences to the baseline
    (95 % interval, the detectable difference, its mean per warm start) and to the sync
    arm, the tuned value and the mean mask fraction; then the paired differences of the
    secondary metrics. An interim look (fewer runs than expected) says so first."""
    key, base, sync = report["primary_metric"], report["baseline"], report.get("sync")
    done, expected = report["runs_done"], report["runs_expected"]
    lines = [f"test runs finished: {done} of {expected}"
             + (" (INTERIM: not the pre-registered analysis)" if done < expected else ""),
             f"primary metric: {key}; paired differences over (warm start, seed) pairs; 95% t "
             "intervals; detectable: the true difference a two-sided paired t test at 5% "
             "finds with 80% power", "",
             f"| arm | tuned | runs | {key} [95% CI] | - {base} [95% CI] | detectable | "
             f"by warm start | - {sync or 'sync'} [95% CI] | mask fraction |",
             "|---|---|---|---|---|---|---|---|---|"]
    for arm, e in report["arms"].items():
        m, vb = e[key], e.get("vs_baseline", {}).get(key)
        vs = e.get("vs_sync", {}).get(key)
        by_ws = " / ".join(f"{ws} {_num(v)}" for ws, v in vb["by_ws"].items()) if vb else ""
        own = (f"{m['mean']:.4f} [{m['mean'] - m['ci95_half']:.4f}, "
               f"{m['mean'] + m['ci95_half']:.4f}]" if m["n"] > 1 else f"{m['mean']:.4f} (n={m['n']})")
        lines.append(f"| {arm} | {_tuned(e['tuned'])} | {e['runs']} | {own} | "
                     f"{_ci(vb)} | {_num(vb['detectable_80'], '.4f') if vb else ''} | "
                     f"{by_ws} | {_ci(vs)} | {e['mask_fraction']:.4f} |")
    adj = lambda e: "" if not e or "p_holm" not in e else (  # noqa: E731
        f"{_num(e['p'], '.3f')} | {_num(e['p_holm'], '.3f')} | "
        + (f"[{_num(e['ci_bonferroni'][0])}, {_num(e['ci_bonferroni'][1])}]"
           if e["ci_bonferroni"] else ""))
    lines += ["", f"Multiplicity, {key}: paired t p-values, Holm-adjusted across the arms "
              "of each family, and the Bonferroni simultaneous interval that goes with the "
              "adjustment (95 % family-wise)", "",
              f"| arm | - {base}: p | p Holm | Bonferroni CI | - {sync or 'sync'}: p | "
              "p Holm | Bonferroni CI |", "|---|---|---|---|---|---|---|"]
    for arm, e in report["arms"].items():
        vb, vs = e.get("vs_baseline", {}).get(key), e.get("vs_sync", {}).get(key)
        if vb or vs:
            lines.append(f"| {arm} | {adj(vb) or ' | | '} | {adj(vs) or ' | | '} |")
    secondary = report.get("secondary_metrics", [])
    if secondary:
        lines += ["", f"Secondary metrics: paired difference to {base} [95% CI]", "",
                  "| arm | " + " | ".join(secondary) + " |", "|---" * (1 + len(secondary)) + "|"]
        for arm, e in report["arms"].items():
            if "vs_baseline" in e:
                lines.append(f"| {arm} | " + " | ".join(
                    _ci(e["vs_baseline"][k], "+.3f") for k in secondary) + " |")
    return "\n".join(lines)


def format_tune_status(key: str, rows: list[dict[str, Any]]) -> str:
    """Markdown table of `experiments.multirun.study.tune_status`: label, own values, runs done of
    expected, mean ``key`` so far and each run's value; first a line of the runs finished."""
    done, expected = sum(r["done"] for r in rows), sum(r["expected"] for r in rows)
    lines = [f"tuning runs finished: {done} of {expected}", "",
             f"| method | own | runs | mean {key} | runs (ws/seed: value) |", "|---|---|---|---|---|"]
    for r in rows:
        own = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in r["own"].items())
        vals = "; ".join(f"{k}: {v:.5f}" for k, v in r["values"].items())
        mean = f"{r['mean']:.5f}" if math.isfinite(r["mean"]) else ""
        lines.append(f"| {r['label']} | {own} | {r['done']}/{r['expected']} | {mean} | {vals} |")
    return "\n".join(lines)


def stage_times(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per warm start of a stage's rows (`experiments.multirun.study.stage_results`): ``runs``
    finished, ``wall_s`` (the sum of their ``summary.json`` ``wall_clock_s``: what the
    stage costs one worker), ``first_start`` (the earliest ``meta.json`` ``started_at``)
    and ``last_end`` (the latest start + wall; a resumed run's start is its last session's,
    so a span with resumed runs is approximate), both ISO 8601 UTC."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        path = pathlib.Path(r["path"])
        wall = float(json.loads((path / "summary.json").read_text()).get("wall_clock_s") or 0.0)
        meta = path / "meta.json"
        start = (datetime.datetime.fromisoformat(json.loads(meta.read_text())["started_at"])
                 if meta.exists() else None)
        t = out.setdefault(r["ws"], {"runs": 0, "wall_s": 0.0, "first_start": None,
                                     "last_end": None})
        t["runs"] += 1
        t["wall_s"] += wall
        if start is not None:
            end = start + datetime.timedelta(seconds=wall)
            t["first_start"] = min(filter(None, (t["first_start"], start)))
            t["last_end"] = max(filter(None, (t["last_end"], end)))
    iso = lambda d: d.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M") if d else None  # noqa: E731
    return {ws: {**t, "first_start": iso(t["first_start"]), "last_end": iso(t["last_end"])}
            for ws, t in sorted(out.items())}


def format_stage_times(by_stage: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Markdown table of `stage_times` per stage (``{stage: times}``): stage, warm start,
    runs, summed run wall seconds, first start and last end (UTC)."""
    lines = ["| stage | warm start | runs | run wall s (sum) | first start | last end (UTC) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {stage} | {ws} | {t['runs']} | {t['wall_s']:,.0f} | "
              f"{t['first_start'] or '-'} | {t['last_end'] or '-'} |"
              for stage, times in by_stage.items() for ws, t in times.items()]
    return "\n".join(lines)
