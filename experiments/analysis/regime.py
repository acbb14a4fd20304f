"""The stress-regime search table (docs/stress.md section 4): for every setting of a sweep,
the staleness-free baseline (``staleness.mode = sync``) against each stale method at the
same learning rate, sampler mismatch and run length, over seeds.

A *setting* is every field of a run's resolved config that can change what it trains on,
other than the comparison itself (`setting`: all but the staleness section, the
objective, the seed and bookkeeping such as ``run_dir``, logging and checkpoints); the
table shows its learning rate, logit noise std and ``rl_steps``, and in ``other`` every
further field whose value varies among the runs read (e.g. ``learner.minibatches=4``).
A stale run (simulated or async staleness) adds its configured ``(inter_lag,
intra_switches)``. Rows pair the stale runs with the sync runs of the same setting **by
seed**, and every number in a row is over
those paired seeds only (``n``): the across-seed mean with its 95% Student-t half-width
(`experiments.analysis.stats.mean_ci`; NaN below 2 seeds) of the sync value, the stale
value and the paired gap ``stale - sync``. ``bites`` is ``yes`` when the gap is negative
and its interval excludes 0 (the stress regime's "async worse than sync" criterion),
``no`` when not, and ``n/a`` below 2 paired seeds.

``start`` is the sync runs' held-out accuracy before RL (the summary's
``eval_accuracy_before``, mean and interval over the paired seeds): the warm start the
setting was measured from, since whether a setting bites depends on it as much as on the
setting (two warm starts of the same recipe, 0.158 and 0.605, in ``docs/stress.md``).

Values (``--value``):
* ``eval_after``: held-out accuracy after RL, the summary's ``eval_accuracy_after``
  (avg@k over the task's evaluation problems, k samples each at the run's temperature,
  drawn through the run's own sampler, synthetic mismatch included);
* ``eval_gain``: ``eval_accuracy_after - eval_accuracy_before``;
* ``final_reward``: mean ``reward/mean`` of the last 10 RL steps' rollouts (under
  staleness those rollouts come from older policies, so prefer ``eval_after``).

Collapse indicators, of the stale method, averaged over its paired seeds (each run's
value over its RL steps): ``gnorm max`` (largest ``train/grad_norm_max``, the gradient
norm of the step's largest optimizer update; ``train/grad_norm`` in older runs), ``ESS min``
(smallest ``ess/token_fraction``), ``k3 max`` (largest ``kl_mu_pi/k3``, the k3 estimate of
KL(mu||pi)), ``entropy last`` (``entropy_pi/mean`` of the last step). The method is the
comparison label of a comparison sweep (``grpo_async``), else the objective name.

What the lag settings realise (means over the stale runs' seeds): ``inter (all)`` and
``intra (all)``, the measured per-trajectory staleness averaged over *every* RL step
(`experiments.analysis.runs.measured_staleness` with ``skip=0``), and ``full-lag steps``,
how many of the run's steps get the configured lag in full (the summary's
``staleness_full_lag_steps``, else `entr_jax.staleness.full_lag_steps` of the run's
config; blank for async runs, whose lag is measured, not planned). Before them the delay
line is not full: a batch can be no older than version 0, so with a fixed lag ``k`` the
first ``k + 1`` steps all train on the starting policy's samples. A 40-step run at inter
lag 30 + 3 switches realises a mean inter staleness of about 18 and has 7 steps at the
full lag.
Unfinished runs (no ``summary.json``) are left out and counted.

Usage::

    python -m experiments.analysis.regime runs/stress_regime [--value eval_after]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Iterable

import numpy as np

from entr_jax import staleness
from experiments.analysis.runs import Run, final_reward, measured_staleness, print_table
from experiments.analysis.stats import excludes_zero, mean_ci
from experiments.run.config import with_field_defaults
from experiments.run.fields import LABEL_FIELDS, flatten

VALUES = ("eval_after", "final_reward", "eval_gain")


# Config fields that are the comparison (staleness, the method's objective, the seed) or
# cannot change what a run trains on (where it writes, logs and checkpoints; the side
# scoring of token_samples_every): left out of a run's setting.
_NOT_SETTING = ("staleness.", "objective.", "logging.", "checkpoint.")
_NOT_SETTING_KEYS = frozenset(LABEL_FIELDS + ("seed", "token_samples_every"))
_SHOWN = ("optim.learning_rate", "sampler.logit_noise_std", "rl_steps")


def setting(run: Run) -> tuple[tuple[str, Any], ...]:
    """A run's setting: the sorted ``(dotted field, value)`` pairs of its resolved config
    without the fields of the comparison and the bookkeeping (module docstring), so two
    runs pair only when everything else they were given is equal. A field the stored
    config predates reads as its default (`experiments.run.config.with_field_defaults`), so a
    run reused from an older sweep pairs with a new one of the same values."""
    return tuple(sorted((k, json.dumps(v) if isinstance(v, list) else v)
                        for k, v in flatten(with_field_defaults(run.config)).items()
                        if k not in _NOT_SETTING_KEYS and not k.startswith(_NOT_SETTING)))


def _shown(s: tuple[tuple[str, Any], ...]) -> tuple[float, float, int]:
    d = dict(s)
    return (float(d["optim.learning_rate"]), float(d.get("sampler.logit_noise_std", 0.0)),
            int(d["rl_steps"]))


def varying_fields(settings: Iterable[tuple[tuple[str, Any], ...]],
                   shown: tuple[str, ...] = _SHOWN) -> list[str]:
    """Fields of `setting` tuples (besides ``shown``) whose value differs between them or
    that some of them lack."""
    settings = list(settings)
    values: dict[str, set] = {}
    for s in settings:
        for k, v in s:
            values.setdefault(k, set()).add(repr(v))
    keys = set().union(*(dict(s).keys() for s in settings)) if settings else set()
    return sorted(k for k in keys if k not in shown and (
        len(values.get(k, ())) > 1 or any(k not in dict(s) for s in settings)))


def value(run: Run, name: str) -> float:
    """``eval_after`` (held-out accuracy after RL), ``eval_gain`` (after - before) or
    ``final_reward`` (mean reward of the last 10 steps' rollouts); NaN when missing.

    Raises:
      ValueError: an unknown ``name``.
    """
    s = run.summary or {}
    if name == "eval_after":
        return float(s.get("eval_accuracy_after", math.nan))
    if name == "eval_gain":
        return float(s.get("eval_accuracy_after", math.nan)) - float(
            s.get("eval_accuracy_before", math.nan))
    if name == "final_reward":
        return final_reward(run)
    raise ValueError(f"regime value must be one of {VALUES}, got {name!r}")


def _indicator(run: Run, key: str, how) -> float:
    xs = [m[key] for m in run.metrics if key in m and math.isfinite(m[key])]
    return float(how(xs)) if xs else math.nan


def indicators(run: Run) -> dict[str, float]:
    """The collapse indicators of one run (see the module docstring)."""
    last = [m for m in run.metrics if "entropy_pi/mean" in m]
    # the largest update's norm of each step (several updates per step with PPO
    # mini-batches); train/grad_norm, their mean, in runs made before it was recorded
    gnorm = "train/grad_norm_max" if any("train/grad_norm_max" in m for m in run.metrics) \
        else "train/grad_norm"
    return {"gnorm_max": _indicator(run, gnorm, max),
            "ess_min": _indicator(run, "ess/token_fraction", min),
            "k3_max": _indicator(run, "kl_mu_pi/k3", max),
            "entropy_last": float(last[-1]["entropy_pi/mean"]) if last else math.nan}


def full_lag(run: Run) -> float:
    """Steps of ``run`` that got its configured lag in full: the summary's
    ``staleness_full_lag_steps`` or, for runs made before it was recorded, the schedule's
    count (`entr_jax.staleness.full_lag_steps`) for the config; NaN when the lag is not
    planned (async mode) or the config is not readable."""
    recorded = (run.summary or {}).get("staleness_full_lag_steps", "missing")
    if recorded != "missing":
        return math.nan if recorded is None else float(recorded)
    try:
        cfg = staleness.StalenessConfig(**run.config["staleness"])
    except (TypeError, ValueError):
        return math.nan
    n = staleness.full_lag_steps(cfg, int(run.config["rl_steps"]))
    return math.nan if n is None else float(n)


def label(run: Run) -> str:
    """A comparison sweep's method label (the run is ``method=<label>_...`` and its config
    ``name`` is the label), else `Run.method`."""
    return run.method


def paired_settings(runs: list[Run], key=None):
    """The stale runs grouped by (method `label`, `setting`, inter lag, intra switches), each
    group with the sync runs (``staleness.mode = sync``) of the same setting: yields
    ``(method, setting, inter, intra, sync_by_seed, stale_by_seed, common_seeds)`` for the
    groups with a common seed, sorted by ``key`` of the group's first four (default: as
    listed). ``runs`` must be finished runs."""
    sync = [r for r in runs if r.config["staleness"]["mode"] == "sync"]
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.config["staleness"]["mode"] != "sync":
            groups.setdefault((label(r), setting(r), r.inter_lag, r.intra_switches), []).append(r)
    order = key or (lambda g: (g[0], repr(g[1]), g[2], g[3]))
    for group in sorted(groups, key=order):
        here = {r.seed: r for r in sync if setting(r) == group[1]}
        mine = {r.seed: r for r in groups[group]}
        seeds = sorted(set(here) & set(mine))
        if seeds:
            yield (*group, here, mine, seeds)


def regime_rows(runs: Iterable[Run], value_name: str = "eval_after") -> list[dict[str, Any]]:
    """One row per (stale method, setting, inter, intra) with a sync baseline of the same
    setting on at least one common seed: ``method, lr, noise, steps, other`` (the varying
    fields of the setting beyond those three, ``"field=value"`` joined by spaces),
    ``inter, intra, start, sync, stale, gap`` (``start``: the sync runs' held-out accuracy
    before RL; each ``(mean, half_width, n)`` over the paired
    seeds), ``bites``
    (``"yes"``/``"no"``/``"n/a"``), the stale runs' mean indicators and what their lag
    realised (``inter_all``, ``intra_all``, ``full_lag_steps``; module doc). Only finished
    runs (a summary) count.

    Raises:
      ValueError: an unknown ``value_name``.
    """
    if value_name not in VALUES:
        raise ValueError(f"regime value must be one of {VALUES}, got {value_name!r}")
    runs = [r for r in runs if r.summary is not None]
    varying = varying_fields([setting(r) for r in runs])
    rows = []
    for method, where, inter, intra, here, mine, seeds in paired_settings(runs, key=lambda g: (
            g[0], _shown(g[1]), repr(g[1]), g[2], g[3])):
        lr, noise, steps = _shown(where)
        d = dict(where)
        other = " ".join(f"{k}={d.get(k, '-')}" for k in varying)
        base = {seed: value(r, value_name) for seed, r in here.items()}
        gap = mean_ci([value(mine[s], value_name) - base[s] for s in seeds])
        ind = [indicators(mine[s]) for s in seeds]
        realised = [measured_staleness(mine[s], skip=0) for s in seeds]
        full = [full_lag(mine[s]) for s in seeds]
        bites = "n/a" if gap[2] < 2 else ("yes" if gap[0] < 0 and excludes_zero(gap[0], gap[1]) else "no")
        rows.append({
            "method": method, "lr": lr, "noise": noise, "steps": steps, "other": other,
            "inter": inter,
            "intra": intra,
            "start": mean_ci([float(here[s].summary.get("eval_accuracy_before", math.nan))
                              for s in seeds]),
            "sync": mean_ci([base[s] for s in seeds]),
            "stale": mean_ci([value(mine[s], value_name) for s in seeds]), "gap": gap,
            "bites": bites, **{k: float(np.nanmean([i[k] for i in ind])) for k in ind[0]},
            "inter_all": float(np.nanmean([x[0] for x in realised])),
            "intra_all": float(np.nanmean([x[1] for x in realised])),
            "full_lag_steps": float(np.nanmean(full)) if any(np.isfinite(full)) else math.nan,
        })
    return rows


def _of(full: float, steps: int) -> str:
    return f"{full:g} of {steps}" if math.isfinite(full) else ""


def format_rows(rows: list[dict[str, Any]], value_name: str = "eval_after") -> str:
    """A Markdown table of `regime_rows` (mean ± 95% half-width (n paired seeds))."""
    if not rows:
        return "(no stale setting with a finished sync baseline on a common seed)"
    ci = lambda t: f"{t[0]:.3f} ± {t[1]:.3f} ({t[2]})"  # noqa: E731
    head = (f"| method | lr | noise | steps | other | inter | intra | start | "
            f"sync {value_name} | "
            f"stale {value_name} | gap stale-sync | bites | gnorm max | ESS min | k3 max | "
            "entropy last | inter (all) | intra (all) | full-lag steps |")
    lines = [head, "|" + "---|" * 19]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['lr']:g} | {r['noise']:g} | {r['steps']} | {r['other']} | "
            f"{r['inter']} | "
            f"{r['intra']} | {ci(r['start'])} | {ci(r['sync'])} | {ci(r['stale'])} | {ci(r['gap'])} | "
            f"{r['bites']} | {r['gnorm_max']:.3g} | {r['ess_min']:.3f} | "
            f"{r['k3_max']:.3g} | {r['entropy_last']:.3f} | {r['inter_all']:.1f} | "
            f"{r['intra_all']:.1f} | {_of(r['full_lag_steps'], r['steps'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.analysis.regime", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", help="a sweep output directory (every run below it is read)")
    p.add_argument("--value", choices=VALUES, default="eval_after",
                   help="eval_after (held-out avg@k after RL; default), eval_gain (after - "
                        "before) or final_reward (last 10 steps' rollouts)")
    args = p.parse_args(argv)
    return print_table("regime", args.runs,
                       lambda runs: format_rows(regime_rows(runs, args.value), args.value))

if __name__ == "__main__":
    sys.exit(main())
