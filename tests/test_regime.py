"""The stress-regime table (experiments.analysis.regime) on hand-made run directories:
the sync baseline is paired by setting and seed, the gap's t interval is the hand value."""

import json
import math

import pytest

from experiments.analysis import load_runs
from experiments.analysis.regime import format_rows, main, regime_rows


def _run(root, name, mode, seed, after, lr=3e-4, noise=0.5, gnorm=(0.1, 0.4), intra=3,
         full_lag=None, learner=None, before=0.1):
    d = root / name
    d.mkdir(parents=True)
    cfg = {"name": "grpo_async" if name.startswith("method=grpo_async_") else "stress",
           "seed": seed, "rl_steps": 2, "objective": {"name": "grpo"},
           "optim": {"learning_rate": lr}, "sampler": {"logit_noise_std": noise},
           "staleness": {"mode": mode, "inter_lag": 4, "intra_switches": intra,
                         "ring_size": intra + 1},
           "run_dir": str(d), "checkpoint": {"every": seed},  # bookkeeping: not the setting
           "shared_eval_dir": str(d / "shared")}  # nor where the start's evaluation is shared
    if learner is not None:
        cfg["learner"] = learner
    (d / "config.json").write_text(json.dumps(cfg))
    rows = [{"step": i, "reward/mean": 0.1, "train/grad_norm": g, "ess/token_fraction": 0.9 - i / 10,
             "kl_mu_pi/k3": 0.01 * (i + 1), "entropy_pi/mean": 0.2 + i,
             "staleness/inter_mean": float(min(i, 4)), "staleness/intra_mean": 0.5 * i}
            for i, g in enumerate(gnorm)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"eval_accuracy_after": after, "eval_accuracy_before": before}
    if full_lag is not None:  # recorded by runs made since the field exists
        summary["staleness_full_lag_steps"] = full_lag
    (d / "summary.json").write_text(json.dumps(summary))


def test_gap_pairs_the_sync_baseline_by_setting_and_seed(tmp_path, capsys):
    for seed, (s, a) in enumerate([(0.30, 0.20), (0.25, 0.20), (0.35, 0.24)]):
        _run(tmp_path, f"sync{seed}", "sync", seed, s, before=0.1 + seed / 10)
        _run(tmp_path, f"async{seed}", "simulated", seed, a, before=0.1 + seed / 10)
    _run(tmp_path, "sync_other_lr", "sync", 0, 0.9, lr=1e-4)  # another setting: not paired
    rows = regime_rows(load_runs(tmp_path))
    assert len(rows) == 1
    r = rows[0]
    assert (r["method"], r["lr"], r["noise"], r["inter"], r["intra"]) == ("grpo", 3e-4, 0.5, 4, 3)
    # gaps -0.10, -0.05, -0.11: mean -0.0867, s = 0.03215, t_{0.975,2} = 4.3027
    assert r["gap"][0] == pytest.approx(-0.08666667)
    assert r["gap"][1] == pytest.approx(4.302653 * 0.0321455 / 3 ** 0.5, rel=1e-4)
    assert r["gap"][2] == 3 and r["bites"] == "yes"
    assert r["sync"][0] == pytest.approx(0.30) and r["stale"][0] == pytest.approx(0.64 / 3)
    assert (r["gnorm_max"], r["ess_min"], r["k3_max"], r["entropy_last"]) == pytest.approx((0.4, 0.8, 0.02, 1.2))
    # realised over all steps (inter 0, 1; intra 0, 0.5); no step of 2 gets inter 4 + intra
    # 3 in full (counted from the config's schedule: these summaries do not record it)
    assert (r["inter_all"], r["intra_all"], r["full_lag_steps"]) == (0.5, 0.25, 0)
    # the warm start, as the sync runs evaluated it: 0.1, 0.2, 0.3, t half-width 4.3027 * 0.1 / sqrt 3
    assert r["start"] == pytest.approx((0.2, 4.302653 * 0.1 / 3 ** 0.5, 3), rel=1e-5)
    assert "| grpo | 0.0003 | 0.5 | 2 |  | 4 | 3 | 0.200 ± 0.248 (3) | 0.300 ± " in format_rows(rows)
    assert "| 0.5 | 0.2 | 0 of 2 |" in format_rows(rows)
    assert main([str(tmp_path), "--value", "eval_gain"]) == 0
    assert "-0.087 ± 0.080 (3)" in capsys.readouterr().out


def test_a_gap_whose_interval_straddles_zero_does_not_bite(tmp_path):
    for seed, (s, a) in enumerate([(0.30, 0.20), (0.25, 0.30)]):
        _run(tmp_path, f"sync{seed}", "sync", seed, s)
        _run(tmp_path, f"async{seed}", "simulated", seed, a, gnorm=(0.1,) * 7, intra=1,
             full_lag=1 + seed)  # the summary's count is used when recorded: 1 and 2
    (row,) = regime_rows(load_runs(tmp_path))
    assert row["gap"][0] == pytest.approx(-0.025) and row["bites"] == "no"
    assert row["full_lag_steps"] == 1.5 and row["inter_all"] == pytest.approx(18 / 7)  # 0+1+2+3+4+4+4


def test_rows_use_the_paired_seeds_only_and_one_seed_does_not_decide(tmp_path, capsys):
    _run(tmp_path, "method=grpo_async_s0", "simulated", 0, 0.20)
    _run(tmp_path, "method=grpo_async_s1", "simulated", 1, 0.40)  # no sync seed 1: unpaired
    _run(tmp_path, "sync0", "sync", 0, 0.30)
    (row,) = regime_rows(load_runs(tmp_path))
    assert row["stale"][:1] + row["stale"][2:] == (pytest.approx(0.20), 1)
    assert row["gap"][0] == pytest.approx(-0.10) and row["bites"] == "n/a"
    assert row["method"] == "grpo_async"  # the comparison label, not the objective name
    assert main([str(tmp_path / "missing")]) == 2
    assert "regime: error: load_runs: no run directories" in capsys.readouterr().err


def test_full_lag_is_blank_for_async_runs_and_counted_from_the_schedule_otherwise(tmp_path):
    from experiments.analysis.regime import _of, full_lag

    _run(tmp_path, "a", "async", 0, 0.2)
    _run(tmp_path, "b", "simulated", 0, 0.2, gnorm=(0.1,) * 3, intra=1)
    _run(tmp_path, "c", "simulated", 0, 0.2, full_lag=None)
    runs = {r.path.name: r for r in load_runs(tmp_path)}
    assert math.isnan(full_lag(runs["a"])) and _of(full_lag(runs["a"]), 2) == ""
    # rl_steps 2 at inter 4 + 1: no step in full; with rl_steps 9, steps 5..8
    assert full_lag(runs["b"]) == 0.0
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    (tmp_path / "b" / "config.json").write_text(json.dumps(dict(cfg, rl_steps=9)))
    assert full_lag(load_runs(tmp_path / "b")[0]) == 4.0
    assert _of(4.0, 9) == "4 of 9"


def test_runs_that_differ_in_any_other_field_are_not_paired_and_the_field_is_shown(tmp_path):
    """The setting is the whole resolved config but the comparison (staleness, objective,
    seed) and bookkeeping: sync and stale runs at another learner.minibatches are another
    setting, and the table says which (the old key, (lr, noise, steps), paired them)."""
    for seed in (0, 1):
        _run(tmp_path, f"sync{seed}", "sync", seed, 0.30, learner={"minibatches": 1})
        _run(tmp_path, f"async{seed}", "simulated", seed, 0.20, learner={"minibatches": 1})
        _run(tmp_path, f"sync_mb4_{seed}", "sync", seed, 0.50, learner={"minibatches": 4})
        _run(tmp_path, f"async_mb4_{seed}", "simulated", seed, 0.25, learner={"minibatches": 4})
    rows = regime_rows(load_runs(tmp_path))
    by_other = {r["other"]: r for r in rows}
    assert set(by_other) == {"learner.minibatches=1", "learner.minibatches=4"}
    assert by_other["learner.minibatches=1"]["gap"][0] == pytest.approx(-0.10)
    assert by_other["learner.minibatches=4"]["gap"][0] == pytest.approx(-0.25)
    assert by_other["learner.minibatches=4"]["gap"][2] == 2
    assert "| grpo | 0.0003 | 0.5 | 2 | learner.minibatches=4 | 4 | 3 |" in format_rows(rows)


def test_gnorm_max_is_the_largest_update_of_a_step_when_recorded(tmp_path):
    """With several updates per step, train/grad_norm is their mean: the indicator reads
    train/grad_norm_max (the largest update), and train/grad_norm in runs without it."""
    from experiments.analysis.regime import indicators

    _run(tmp_path, "old", "simulated", 0, 0.2, gnorm=(0.1, 0.4))
    d = tmp_path / "new"
    _run(tmp_path, "new", "simulated", 0, 0.2, gnorm=(0.1, 0.4))
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    for r, m in zip(rows, (2.5, 0.7)):
        r["train/grad_norm_max"] = m
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = {r.path.name: r for r in load_runs(tmp_path)}
    assert indicators(runs["old"])["gnorm_max"] == 0.4
    assert indicators(runs["new"])["gnorm_max"] == 2.5


def test_a_run_older_than_a_field_pairs_with_a_new_run_at_its_default(tmp_path):
    """A run reused from an older sweep lacks fields added since (here the fleet's outage
    wait); it reads as their defaults, so it pairs with a new run that has the default and
    not with one given another value (failed before: the missing field split the setting)."""
    _run(tmp_path, "sync_old", "sync", 0, 0.30)
    for name, wait in (("async_new", 900.0), ("async_other", 60.0)):
        _run(tmp_path, name, "simulated", 0, 0.20)
        cfg = json.loads((tmp_path / name / "config.json").read_text())
        cfg["sampler"]["fleet"] = {"outage_wait_s": wait}
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    rows = regime_rows(load_runs(tmp_path))
    assert len(rows) == 1 and rows[0]["gap"][0] == pytest.approx(-0.10)
