"""The token-level decomposition of the log-ratio into mismatch and staleness, and ESTR's
two premises tested on it (docs/decomposition.md).

Per loss token of a run's ``token_samples/step_<n>.npz`` (written with ``logp_version``,
the learner's log-prob at the token's own version; `experiments.run.decomposition`):

* ``delta = logp_pi - logp_mu`` (float32, as the learner computes it), split exactly into
  ``delta_mis = logp_version - logp_mu`` (train-inference mismatch) and
  ``delta_stale = logp_pi - logp_version`` (policy drift since the token's version);
* ``H = entropy_mu`` (behaviour entropy, nats), ``q = mu(o_t) = exp(logp_mu)``,
  ``entropy_pi``, ``age = version - token_version`` (learner versions).

Premises of ESTR (arXiv 2607.22186, Sec. 3.1 and 3.5), with FIXED bins and a bootstrap
over runs (over steps when there is one run):

(a) staleness drift grows with the entropy: ``E[delta_stale^2 | H] = a H + b``;
(b) mismatch explodes for improbable tokens: ``E[delta_mis^2 | q]`` grows as ``q -> 0``;
    fitted as a power law ``E[delta_mis^2 | q] ~ c ((1 - q) / q)^k`` (the paper's
    off-mode model has ``k = 1`` for a fixed logit perturbation; Var(xi)/q^2 corresponds
    to ``k = 2``).

Command line: ``python -m experiments.analysis.decompose RUN_DIR [RUN_DIR ...] --out DIR``
writes ``DIR/tokens.npz`` (the per-token table), ``DIR/decomposition.json`` (bins, fits
with 95 % intervals, gate curves' key points) and, with ``--figures``, the figures.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any, Sequence

import numpy as np

from experiments.analysis import gate_curves as gc
from experiments.analysis.decompose_tables import group_runs, mismatch_table, print_summary
from experiments.analysis.decomposed import (
    ENTROPY_EDGES,
    FIELDS,
    HIGH_H,
    LOW_H,
    MATERIAL_NATS,
    Decomposed,
    classify,
    scores,
)
from experiments.analysis.runs import Run, load_runs
from experiments.analysis.tokens import wls_fit

# fixed q bins (left edges; the last bin is open-ended)
Q_EDGES = (0.0, 1e-3, 1e-2, 0.05, 0.2, 0.5, 0.8, 0.95, 0.99, 0.999)


def load_run(run: Run, index: int = 0) -> tuple[Decomposed, dict[str, np.ndarray]]:
    """A run's decomposed loss tokens, and each token's gate scores that need the step's
    ``[B, T]`` structure (``trm``: its row's statistic; ``m2po``: its rank in the step).

    Raises:
      FileNotFoundError: no token samples in the run (names the directory).
      ValueError: token samples without ``logp_version`` (an ``async`` run, or one that
        predates the decomposition), naming the file and the fix.
    """
    files = sorted((run.path / "token_samples").glob("step_*.npz"),
                   key=lambda p: int(p.stem.split("_")[1]))
    if not files:
        raise FileNotFoundError(f"no token samples in {run.path / 'token_samples'} "
                                "(the run needs token_samples_every > 0)")
    version = {m["step"]: m["version"] for m in run.metrics}
    parts: dict[str, list] = {f: [] for f in FIELDS}
    seq = {"trm": [], "m2po": []}
    for path in files:
        n = int(path.stem.split("_")[1])
        with np.load(path) as z:
            if "logp_version" not in z:
                raise ValueError(
                    f"{path} has no logp_version: the run was not decomposed (async mode, or "
                    "written before the decomposition existed); rerun it in sync or "
                    "simulated staleness mode, which score every sampled token at its "
                    "version")
            m = z["loss_mask"].astype(bool)
            f32 = {k: z[k].astype(np.float32) for k in ("logp_pi", "logp_mu", "logp_version",
                                                         "entropy_mu", "entropy_pi")}
        delta = f32["logp_pi"] - f32["logp_mu"]
        for k, v in f32.items():
            parts[k].append(v[m].astype(np.float64))
        parts["delta"].append(delta[m].astype(np.float64))
        parts["delta_mis"].append((f32["logp_version"] - f32["logp_mu"])[m].astype(np.float64))
        parts["delta_stale"].append((f32["logp_pi"] - f32["logp_version"])[m].astype(np.float64))
        with np.load(path) as z:
            tv = z["token_version"][m].astype(np.int64)
        parts["age"].append(version[n] - tv if n in version else np.full(m.sum(), -1, np.int64))
        parts["run"].append(np.full(m.sum(), index, np.int64))
        parts["step"].append(np.full(m.sum(), n, np.int64))
        parts["row"].append(np.nonzero(m)[0].astype(np.int64))
        seq["trm"].append(gc.score_trm(delta, m)[m])
        seq["m2po"].append(gc.score_m2po(delta[m]))
    tokens = Decomposed(**{k: np.concatenate(v) for k, v in parts.items()})
    return tokens, {k: np.concatenate(v) for k, v in seq.items()}


def load(runs: Sequence[Run]) -> tuple[Decomposed, dict[str, np.ndarray]]:
    """`load_run` of several runs, concatenated (``run`` indexes ``runs``)."""
    loaded = [load_run(r, i) for i, r in enumerate(runs)]
    tokens = Decomposed(**{f: np.concatenate([getattr(t, f) for t, _ in loaded]) for f in FIELDS})
    return tokens, {k: np.concatenate([s[k] for _, s in loaded]) for k in ("trm", "m2po")}


def binned(x: np.ndarray, y: np.ndarray, edges: Sequence[float]) -> dict[str, list]:
    """``count``, ``x_mean`` and ``y_mean`` per fixed bin ``edges[i] <= x < edges[i+1]``
    (the last bin open-ended; tokens below ``edges[0]`` dropped); NaN means for empty
    bins."""
    idx = np.searchsorted(np.asarray(edges, np.float64), x, side="right") - 1
    k = len(edges)
    count = np.bincount(idx[idx >= 0], minlength=k)[:k]
    with np.errstate(invalid="ignore", divide="ignore"):
        xm = np.bincount(idx[idx >= 0], weights=x[idx >= 0], minlength=k)[:k] / count
        ym = np.bincount(idx[idx >= 0], weights=y[idx >= 0], minlength=k)[:k] / count
    return {"edges": list(map(float, edges)), "count": count.tolist(),
            "x_mean": xm.tolist(), "y_mean": ym.tolist()}


def _wls(x, y, w, log: bool = False) -> tuple[float, float]:
    """`experiments.analysis.tokens.wls_fit` of ``y = a x + b`` (or ``log y = a log x + b``)
    over the bins with positive weight and finite values: ``(a, b)``, (NaN, NaN) with fewer
    than two."""
    x, y, w = (np.asarray(v, np.float64) for v in (x, y, w))
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            x, y = np.log(x), np.log(y)
    try:
        fit = wls_fit(x, y, w)
    except ValueError:  # fewer than two usable bins
        return float("nan"), float("nan")
    return fit.slope, fit.intercept


def premise_fits(t: Decomposed) -> dict[str, Any]:
    """Point estimates: (a) slope/intercept of ``E[delta_stale^2 | H]`` on H over
    `ENTROPY_EDGES` bins, count-weighted; (b) exponent ``k`` of ``E[delta_mis^2 | q] ~
    c ((1-q)/q)^k`` over `Q_EDGES` bins below q = 0.999 (log-log, count-weighted), and
    ``E[delta_mis^2 | H]`` per entropy bin, for all tokens and apart for off-mode tokens
    (``q < 0.5``) and the others; the exponent over the off-mode q bins alone; and the
    low-entropy amplification ``E[delta_mis^2 | off-mode, H < LOW_H] / E[delta_mis^2 |
    off-mode, H >= HIGH_H]`` (ESTR's premise: well above 1)."""
    a = binned(t.entropy_mu, t.delta_stale ** 2, ENTROPY_EDGES)
    slope, intercept = _wls(a["x_mean"], a["y_mean"], a["count"])
    q = t.q
    b = binned(q, t.delta_mis ** 2, Q_EDGES)
    odds = [(1 - m) / m if m == m and 0 < m < 1 else float("nan") for m in b["x_mean"]]
    k, logc = _wls(odds[:-1], b["y_mean"][:-1], b["count"][:-1], log=True)
    off = q < 0.5  # not the mode: a sampled token with mu <= 0.5 has a likelier rival
    k_off = _wls([o for o, e in zip(odds, Q_EDGES) if e < 0.5],
                 [y for y, e in zip(b["y_mean"], Q_EDGES) if e < 0.5],
                 [c for c, e in zip(b["count"], Q_EDGES) if e < 0.5], log=True)[0]
    low, high = off & (t.entropy_mu < LOW_H), off & (t.entropy_mu >= HIGH_H)
    amplification = (float(np.mean(t.delta_mis[low] ** 2) / np.mean(t.delta_mis[high] ** 2))
                     if low.any() and high.any() and np.any(t.delta_mis[high] != 0)
                     else float("nan"))
    return {"stale_vs_entropy": {"bins": a, "slope": slope, "intercept": intercept},
            "mis_vs_q": {"bins": b, "odds": odds, "exponent": k, "log_coef": logc,
                         "exponent_off_mode": k_off},
            "low_entropy_amplification": {"ratio": amplification, "low_tokens": int(low.sum()),
                                          "high_tokens": int(high.sum())},
            "mis_vs_entropy": binned(t.entropy_mu, t.delta_mis ** 2, ENTROPY_EDGES),
            "mis_vs_entropy_off_mode": binned(t.entropy_mu[off], t.delta_mis[off] ** 2,
                                              ENTROPY_EDGES),
            "mis_vs_entropy_mode": binned(t.entropy_mu[~off], t.delta_mis[~off] ** 2,
                                          ENTROPY_EDGES)}


MIN_RUNS_FOR_RUN_BOOTSTRAP = 5


def bootstrap(t: Decomposed, n_boot: int = 200, seed: int = 0) -> dict[str, Any]:
    """95 % percentile intervals of the slope (a), the exponents (b) and the low-entropy
    amplification.

    The unit of independence is the run (its tokens share weights, prompts and warm start),
    so with at least ``MIN_RUNS_FOR_RUN_BOOTSTRAP`` runs whole runs are resampled with
    replacement. With fewer, a run bootstrap has too few distinct resamples to mean anything
    (two runs give three), so whole steps are resampled *within* each run (stratified: every
    run keeps its number of steps); such intervals leave out the variation between runs and
    the report says so (``unit`` ``"step"``, ``runs``). A run with a single step has no
    steps to resample, so then runs are resampled whatever their number."""
    runs = np.unique(t.run)
    steps_per_run = [len(np.unique(t.step[t.run == r])) for r in runs]
    by_run = len(runs) >= MIN_RUNS_FOR_RUN_BOOTSTRAP or min(steps_per_run) < 2
    # strata: one stratum of runs, or one stratum of (run, step) units per run
    if by_run:
        strata = [{int(u): np.nonzero(t.run == u)[0] for u in runs}]
    else:
        strata = [{int(s): np.nonzero((t.run == r) & (t.step == s))[0]
                   for s in np.unique(t.step[t.run == r])} for r in runs]
    rng = np.random.default_rng(seed)
    slopes, exps, exps_off, amps = [], [], [], []
    for _ in range(n_boot):
        parts = []
        for members in strata:
            keys = list(members)
            parts += [members[keys[i]] for i in rng.integers(0, len(keys), len(keys))]
        sub = t.select(np.concatenate(parts))
        f = premise_fits(sub)
        slopes.append(f["stale_vs_entropy"]["slope"])
        exps.append(f["mis_vs_q"]["exponent"])
        exps_off.append(f["mis_vs_q"]["exponent_off_mode"])
        amps.append(f["low_entropy_amplification"]["ratio"])

    def ci(v):
        v = np.asarray(v, np.float64)
        v = v[np.isfinite(v)]
        return [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] if len(v) else None

    return {"unit": "run" if by_run else "step", "runs": int(len(runs)),
            "units": int(sum(len(m) for m in strata)),
            "n_boot": n_boot, "slope_ci95": ci(slopes), "exponent_ci95": ci(exps),
            "exponent_off_mode_ci95": ci(exps_off), "amplification_ci95": ci(amps)}


def gate_report(t: Decomposed, seq: dict[str, np.ndarray], eps: float = 0.01,
                grids: dict[str, Sequence[float]] | None = None) -> dict[str, Any]:
    """Every gate's curve key points (`gate_curves.key_points`), overall, over the
    *material* tokens only (``|delta| > MATERIAL_NATS``: most mismatch-dominated tokens
    are mode tokens where both parts are tiny, and no gate's decision about them matters)
    and per entropy bin; and the rule-based ENTR ``tau`` that cuts at most 2 % of the
    staleness-dominated tokens (all, and material)."""
    stale, mis = classify(t)
    sc = scores(t, seq, eps)
    grids = grids or {}
    material = np.abs(t.delta) > MATERIAL_NATS
    out: dict[str, Any] = {"classes": {"stale": int(stale.sum()), "mis": int(mis.sum())},
                           "overall": {}, "by_entropy": [],
                           "material": {"floor_nats": MATERIAL_NATS,
                                        "stale": int((stale & material).sum()),
                                        "mis": int((mis & material).sum())}}
    for g in gc.GATES:
        c = gc.curve(g, sc[g], stale, mis)
        out["overall"][g] = gc.key_points(c, grid=grids.get(g, ()))
        if (stale & material).any() and (mis & material).any():
            cm = gc.curve(g, sc[g][material], stale[material], mis[material])
            out["material"][g] = gc.key_points(cm, grid=grids.get(g, ()))
    out["tau_rule_2pct"] = gc.curve("entr", sc["entr"], stale, mis).threshold_at_x(0.02)
    if "entr" in out["material"]:
        out["material"]["tau_rule_2pct"] = gc.curve(
            "entr", sc["entr"][material], stale[material], mis[material]).threshold_at_x(0.02)
    idx = np.searchsorted(np.asarray(ENTROPY_EDGES), t.entropy_mu, side="right") - 1
    for i, lo in enumerate(ENTROPY_EDGES):
        sel = idx == i
        row = {"lo": lo, "hi": ENTROPY_EDGES[i + 1] if i + 1 < len(ENTROPY_EDGES) else None,
               "stale": int((sel & stale).sum()), "mis": int((sel & mis).sum())}
        for g in gc.GATES:
            c = gc.curve(g, sc[g][sel], stale[sel], mis[sel])
            row[g] = {"auc": c.auc(), "default": c.at_threshold(gc.DEFAULTS[g])}
        out["by_entropy"].append(row)
    return out


def report(runs: Sequence[Run], n_boot: int = 200, eps: float = 0.01
           ) -> tuple[Decomposed, dict[str, np.ndarray], dict[str, Any]]:
    """The decomposition of ``runs`` (tokens, their sequence-level gate scores) and its JSON
    report (premises, bootstrap, gates)."""
    t, seq = load(runs)
    summary = {
        "runs": [str(r.path) for r in runs], "tokens": len(t),
        "delta_sq_mean": float(np.mean(t.delta ** 2)),
        "delta_mis_sq_mean": float(np.mean(t.delta_mis ** 2)),
        "delta_stale_sq_mean": float(np.mean(t.delta_stale ** 2)),
        "max_abs_delta_mis": float(np.max(np.abs(t.delta_mis))) if len(t) else 0.0,
        "max_abs_sum_error": float(np.max(np.abs(t.delta_mis + t.delta_stale - t.delta)))
        if len(t) else 0.0,
        "premises": premise_fits(t), "bootstrap": bootstrap(t, n_boot),
        "gates": gate_report(t, seq, eps, grids={g: (gc.DEFAULTS[g],) for g in gc.GATES}),
    }
    return t, seq, summary


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.analysis.decompose",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories, or folders of run directories")
    ap.add_argument("--out", required=True, help="output folder (tokens.npz, decomposition.json)")
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--eps", type=float, default=0.01, help="ENTR's entropy floor")
    ap.add_argument("--figures", action="store_true", help="also write PNG figures (matplotlib)")
    ap.add_argument("--by", metavar="FIELD", nargs="+", default=None,
                    help="report each group of runs with equal values of these dotted config "
                         "fields apart (OUT/<group>/) and print a table of the groups")
    args = ap.parse_args(argv)
    if pathlib.Path(args.out).exists() and not pathlib.Path(args.out).is_dir():
        print(f"decompose: --out {args.out} is a file: give a folder (made if missing)",
              file=sys.stderr)
        return 2
    try:
        runs = [r for root in args.runs for r in load_runs(root)]
        if args.by:
            summaries = {}
            for label, group in group_runs(runs, args.by).items():
                _, _, summaries[label] = report(group, args.n_boot, args.eps)
                where = pathlib.Path(args.out) / label
                where.mkdir(parents=True, exist_ok=True)
                (where / "decomposition.json").write_text(
                    json.dumps(summaries[label], indent=1, default=float) + "\n")
            table = mismatch_table(summaries)
            (pathlib.Path(args.out) / "groups.md").write_text(table + "\n")
            print(table)
            return 0
        tokens, seq, summary = report(runs, args.n_boot, args.eps)
    except (FileNotFoundError, ValueError) as e:
        print(f"decompose: {e}", file=sys.stderr)
        return 2
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "tokens.npz", **{f: getattr(tokens, f) for f in FIELDS},
                        q=tokens.q)
    (out / "decomposition.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    if args.figures:
        from experiments.analysis.decompose_plots import write_figures

        write_figures(tokens, seq, summary, out)
    print_summary(summary, len(tokens), len(runs), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
