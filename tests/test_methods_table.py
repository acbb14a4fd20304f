"""The method-comparison table (experiments.analysis.methods) on hand-made run directories:
per-method means with their t intervals, the gate's mask fraction and the paired gap to
the reference method are the hand values."""

import json

import pytest

from experiments.analysis import load_runs
from experiments.analysis.methods import format_rows, main, method_rows


def _run(root, method, seed, after, before=0.4, mask=(0.0, 0.0), clip=(0.01, 0.03),
         rewards=(0.2, 0.6)):
    d = root / f"method={method}_seed={seed}"
    d.mkdir(parents=True)
    cfg = {"name": method, "seed": seed, "rl_steps": 2, "objective": {"name": method.split("_")[0]},
           "optim": {"learning_rate": 3e-4}, "sampler": {"logit_noise_std": 0.5},
           "staleness": {"mode": "sync" if method.endswith("sync") else "simulated",
                         "inter_lag": 30, "intra_switches": 3}}
    (d / "config.json").write_text(json.dumps(cfg))
    rows = [{"step": i, "reward/mean": rw, "mask/fraction": mk, "clip/frac_low": c,
             "clip/frac_high": c / 2, "train/grad_norm": 0.5 + i, "ess/token_fraction": 0.9 - i / 10,
             "kl_mu_pi/k3": 0.01 * (i + 1), "entropy_pi/mean": 0.3}
            for i, (rw, mk, c) in enumerate(zip(rewards, mask, clip))]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"eval_accuracy_after": after,
                                                "eval_accuracy_before": before}))


def test_method_rows_are_per_seed_means_with_t_intervals_and_paired_gaps(tmp_path, capsys):
    for seed, (a, e) in enumerate([(0.30, 0.40), (0.20, 0.35), (0.25, 0.42)]):
        _run(tmp_path, "grpo_async", seed, a)
        _run(tmp_path, "entr", seed, e, mask=(0.02, 0.04 + 0.01 * seed))
    _run(tmp_path, "icepop", 5, 0.5)  # no common seed with the reference: no gap
    (d := tmp_path / "method=entr_seed=9").mkdir()  # unfinished: left out
    for f in ("config.json", "metrics.jsonl"):
        (d / f).write_text((tmp_path / "method=entr_seed=0" / f).read_text())
    rows = {r["method"]: r for r in method_rows(load_runs(tmp_path))}
    assert sorted(rows) == ["entr", "grpo_async", "icepop"]
    e = rows["entr"]
    assert e["seeds"] == [0, 1, 2]
    assert e["eval_after"][0] == pytest.approx(1.17 / 3)
    # gains 0.00, -0.05, +0.02: mean -0.01, s = 0.036056, t_{0.975,2} = 4.302653
    assert e["eval_gain"][0] == pytest.approx(-0.01)
    assert e["eval_gain"][1] == pytest.approx(4.302653 * 0.0360555 / 3 ** 0.5, rel=1e-4)
    # per-run step means 0.03, 0.035, 0.04
    assert e["mask"][:1] + e["mask"][2:] == (pytest.approx(0.035), 3)
    # entr - grpo_async per seed: +0.10, +0.15, +0.17
    assert e["gap"][0] == pytest.approx(0.14) and e["gap"][2] == 3
    assert e["final_reward"][0] == pytest.approx(0.4)  # mean of the (only) 2 steps' rewards
    assert e["clip"][0] == pytest.approx((0.015 + 0.045) / 2)  # low + high, mean over steps
    assert (e["gnorm_max"], e["ess_min"], e["k3_max"]) == pytest.approx((1.5, 0.8, 0.02))
    assert rows["grpo_async"]["mask"][0] == 0.0 and rows["grpo_async"]["gap"][2] == 0  # no self-gap
    assert rows["icepop"]["gap"][2] == 0
    table = format_rows(list(rows.values()))
    assert "| entr | 0,1,2 | 0.390 ± " in table and "| 0.140 ± " in table
    assert "| icepop | 5 | 0.500 (1) |" in table
    assert table.endswith(
        "\n\n± is the 95% Student-t half-width over the seeds (their count in parentheses): "
        "t_{0.975, n-1} * s / sqrt(n). At 3 seeds it is 4.30 standard errors wide. A claim "
        "needs a pre-registered study with its own seeds and tuning: python -m "
        "experiments.study (experiments/studies/stress_fp8.toml).")
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "(1 unfinished run(s) left out)" in out
    assert main([str(tmp_path), "--reference", "grpo_sync"]) == 0
    assert "no finished run of the reference method 'grpo_sync'" in capsys.readouterr().out


def test_the_note_says_two_seeds_decide_nothing(tmp_path):
    for seed in (0, 1):
        _run(tmp_path, "grpo_async", seed, 0.3 + seed / 10)
        _run(tmp_path, "entr", seed, 0.4)
    note = format_rows(method_rows(load_runs(tmp_path))).split("\n\n")[1]
    assert "At 2 seeds it is 12.71 standard errors wide: 2 seeds decide nothing." in note


def test_a_method_with_one_seed_twice_is_refused_with_both_runs_named(tmp_path, capsys):
    _run(tmp_path, "entr", 0, 0.3)
    (tmp_path / "lr2").mkdir()
    _run(tmp_path / "lr2", "entr", 0, 0.4)
    with pytest.raises(ValueError, match="method 'entr' has seed 0 twice"):
        method_rows(load_runs(tmp_path))
    assert main([str(tmp_path)]) == 2
    assert "methods: error:" in capsys.readouterr().err


def test_runs_of_two_settings_are_refused_naming_the_field(tmp_path):
    """A table over methods trained under different conditions would pair them: runs
    whose configs differ beyond the objective, staleness, seed and bookkeeping are
    refused (the table used to pair ENTR at one learning rate with GRPO at another)."""
    _run(tmp_path, "grpo_async", 0, 0.3)
    _run(tmp_path, "entr", 0, 0.4)
    cfg_path = tmp_path / "method=entr_seed=0" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["optim"]["learning_rate"] = 1e-4
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="differ in optim.learning_rate"):
        method_rows(load_runs(tmp_path))
