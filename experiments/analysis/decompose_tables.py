"""The decomposition's tables and console summary (`experiments.analysis.decompose`):
runs grouped by config fields (``--by``), the Markdown table of the groups, and the
printed summary of one report (premises with intervals, each gate's key points, the
mask fractions at matched recall, the rule-based tau)."""

from __future__ import annotations

import pathlib
from typing import Any, Sequence

from experiments.analysis import gate_curves as gc
from experiments.analysis.decomposed import ENTROPY_EDGES, LOW_H
from experiments.analysis.runs import Run
from experiments.run.fields import flatten


def group_runs(runs: Sequence[Run], keys: Sequence[str]) -> dict[str, list[Run]]:
    """Runs grouped by the values of dotted config ``keys`` (e.g.
    ``sampler.weight_quant``); label ``key=value,...`` (last dotted part of each key).

    Raises:
      ValueError: a key is a field of no run's config."""
    flats = [flatten(r.config) for r in runs]
    unknown = [k for k in keys if not any(k in f for f in flats)]
    if unknown:
        raise ValueError(f"--by {' '.join(unknown)}: no run's config.json has this field; "
                         "give dotted config fields, e.g. sampler.weight_quant")
    groups: dict[str, list[Run]] = {}
    for r, flat in zip(runs, flats):
        label = ",".join(f"{k.split('.')[-1]}={flat.get(k)}" for k in keys)
        groups.setdefault(label, []).append(r)
    return dict(sorted(groups.items()))


def resampled(boot: dict[str, Any]) -> str:
    """What a bootstrap resampled, in words: ``"5 runs"`` or ``"16 steps within 2 runs"``."""
    if boot["unit"] == "run":
        return f"{boot['units']} runs"
    return f"{boot['units']} steps within {boot['runs']} run{'s' * (boot['runs'] != 1)}"


def mismatch_table(summaries: dict[str, dict[str, Any]]) -> str:
    """A Markdown table, one row per group: tokens, runs, ``E[delta_mis^2]``, the largest
    ``|delta_mis|``, the exponent ``k`` with its interval, ``E[delta_mis^2 | H]`` of
    off-mode tokens (``q < 0.5``) per entropy bin, and the share ENTR (tau 1) cuts."""
    heads = [f"H>={e:g}" for e in ENTROPY_EDGES[:-1]]
    lines = ["| condition | runs | tokens | E[d_mis^2] | max abs d_mis | k [95% CI] | "
             "k off-mode [95% CI] | low-H amplification [95% CI] | bootstrap over | "
             + " | ".join(f"off-mode {h}" for h in heads) + " | ENTR tau=1 cuts |",
             "|" + "---|" * (10 + len(heads))]
    g = lambda v: "" if v is None or v != v else f"{v:.2g}"  # noqa: E731
    for label, s in summaries.items():
        b, boot = s["premises"]["mis_vs_q"], s["bootstrap"]
        iv = lambda v, c: f"{v:.2f} [{', '.join(f'{x:.2f}' for x in c) if c else ''}]"  # noqa: E731
        off = s["premises"]["mis_vs_entropy_off_mode"]
        cells = [f"{g(y)} ({n})" for y, n in zip(off["y_mean"][:-1], off["count"][:-1])]
        entr = s["gates"]["overall"]["entr"]["grid"]
        lines.append(f"| {label} | {len(s['runs'])} | {s['tokens']} | {g(s['delta_mis_sq_mean'])} | "
                     f"{g(s['max_abs_delta_mis'])} | {iv(b['exponent'], boot['exponent_ci95'])} | "
                     f"{iv(b['exponent_off_mode'], boot['exponent_off_mode_ci95'])} | "
                     f"{iv(s['premises']['low_entropy_amplification']['ratio'], boot['amplification_ci95'])} | "
                     f"{resampled(boot)} | " + " | ".join(cells) + f" | {entr[0]['all']:.4f} |")
    return "\n".join(lines)


def print_summary(summary: dict[str, Any], tokens: int, runs: int, out: pathlib.Path) -> None:
    """Print a `decompose.report` summary of ``tokens`` tokens of ``runs`` runs written to
    ``out``, and write its matched-recall table to ``out/gates.md``."""
    print(f"{tokens} tokens of {runs} run(s) -> {out}")
    a, b = summary["premises"]["stale_vs_entropy"], summary["premises"]["mis_vs_q"]
    boot = summary["bootstrap"]
    ci = lambda c: "[" + ", ".join(f"{x:.3g}" for x in c) + "]" if c else "[n/a]"  # noqa: E731
    print(f"E[delta^2] {summary['delta_sq_mean']:.3g}: drift E[delta_stale^2] "
          f"{summary['delta_stale_sq_mean']:.3g}, mismatch E[delta_mis^2] "
          f"{summary['delta_mis_sq_mean']:.3g} (max |delta_mis| {summary['max_abs_delta_mis']:.3g})")
    print(f"(a) E[delta_stale^2 | H] slope {a['slope']:.4g} {ci(boot['slope_ci95'])} "
          f"(95% CIs: bootstrap over {resampled(boot)})")
    amp = summary["premises"]["low_entropy_amplification"]
    print(f"(b) E[delta_mis^2 | q] ~ ((1-q)/q)^k, k = {b['exponent']:.3g} "
          f"{ci(boot['exponent_ci95'])}; off-mode (q < 0.5) k = {b['exponent_off_mode']:.3g} "
          f"{ci(boot['exponent_off_mode_ci95'])}; low-entropy amplification "
          f"{amp['ratio']:.3g} {ci(boot['amplification_ci95'])} ({amp['low_tokens']} off-mode "
          f"tokens with H < {LOW_H:g})")
    mat = summary["gates"]["material"]
    for g, kp in summary["gates"]["overall"].items():
        m_auc = f"{mat[g]['auc']:.3f}" if g in mat else "-"
        print(f"gate {g:7s} AUC {kp['auc']:.3f} (material {m_auc})  mis cut at 2% stale cut "
              f"{kp['y_at_x']['0.02']:.3f}  default: stale {kp['default']['x']:.4f} "
              f"mis {kp['default']['y']:.4f}")
    table = gc.matched_recall_table(summary["gates"])
    (out / "gates.md").write_text(table + "\n")
    print(table)
    print(f"ENTR tau cutting <= 2% of staleness-dominated tokens: "
          f"{summary['gates']['tau_rule_2pct']:.4g}; of the material ones "
          f"(|delta| > {mat['floor_nats']:g}: {mat['stale']} stale, {mat['mis']} mis): "
          f"{mat.get('tau_rule_2pct', float('nan')):.4g}")
