"""The staleness tolerance map: a sweep spec's [map] table builds the two axes' grid (sync
reference once per seed), bad maps are refused naming the fix, and the report pairs each
method with the reference by seed, with hand-computed intervals, on hand-made runs."""

import json

import pytest

from experiments.analysis import load_runs
from experiments.analysis.tolerance import format_report, main, map_report
from experiments.multirun.sweep_spec import check_spec, expand

METHODS = {"grpo_sync": {"objective": "grpo", "own": {"kl_coef": 0.0},
                         "overrides": {"staleness.mode": "sync"}},
           "grpo_async": {"objective": "grpo", "own": {"kl_coef": 0.0}}}


def _spec(**extra):
    spec = {"preset": "stress", "seeds": [0, 1], "map": {"inter_lag": [0, 8, 16],
                                                          "intra_switches": [0, 3]},
            "comparison": {"base": {"aggregation": "token_mean", "l_norm": "None", "clip_low": 0.2, "clip_high": 0.28}, "methods": json.loads(json.dumps(METHODS))}}
    spec.update(extra)
    return spec


def test_map_builds_both_axes_and_runs_the_reference_once_per_seed(tmp_path):
    spec = check_spec(_spec(), "m.toml")
    assert spec["grid"] == [
        {"staleness.inter_lag": [0, 8, 16], "staleness.intra_switches": [0]},
        {"staleness.inter_lag": [0], "staleness.intra_switches": [0, 3]}]
    names = sorted(r.name for r in expand(spec, tmp_path))
    # async: inter 0, 8, 16 at intra 0 and intra 3 at inter 0 (the crossing once), x 2 seeds
    assert len(names) == 2 * 4 + 2
    assert "method=grpo_sync_seed=0" in names and "method=grpo_sync_seed=1" in names
    assert "method=grpo_async_inter_lag=0_intra_switches=3_seed=1" in names
    assert check_spec(spec, "m.toml")["grid"] == spec["grid"]   # a spec checked again


@pytest.mark.parametrize("change, message", [
    ({"grid": [{"optim.learning_rate": [1e-4]}]}, "builds the grid itself: remove the [[grid]]"),
    ({"comparison": None}, "needs a [comparison] table"),
    ({"map": {"inter_lag": [0, 8]}}, "must have exactly the keys ['inter_lag', 'intra_switches']"),
    ({"map": {"inter_lag": [0, 8, 8], "intra_switches": [0]}}, "inter_lag must be a non-empty list of distinct ints >= 0"),
    ({"map": {"inter_lag": [0], "intra_switches": [-1]}}, "intra_switches must be a non-empty list"),
])
def test_bad_maps_are_refused_naming_the_fix(change, message):
    spec = _spec(**change)
    if spec.get("comparison") is None:
        del spec["comparison"]
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_spec(spec, "m.toml")


def _run(root, name, mode, seed, inter, intra, ref_after, acc_after, steps=40):
    d = root / name
    d.mkdir(parents=True)
    label = name.split("_inter")[0].split("_seed")[0].removeprefix("method=")
    cfg = {"name": label, "seed": seed, "rl_steps": steps, "objective": {"name": "grpo"},
           "optim": {"learning_rate": 1e-4},
           "staleness": {"mode": mode, "inter_lag": inter, "intra_switches": intra,
                         "ring_size": 10}, "run_dir": str(d)}
    (d / "config.json").write_text(json.dumps(cfg))
    rows = [{"step": i, "staleness/inter_mean": float(min(i, inter)),
             "staleness/intra_mean": float(intra)} for i in range(4)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({
        "eval_ref_logp_before": -0.02, "eval_ref_logp_after": ref_after,
        "eval_accuracy_before": 0.6, "eval_accuracy_after": acc_after}))


def _map_dir(tmp_path, **spec_extra):
    out = tmp_path / "map"
    out.mkdir()
    spec = check_spec(_spec(**spec_extra), "m.toml")
    (out / "sweep_spec.json").write_text(json.dumps(spec))
    for seed, (ref, acc) in enumerate([(-0.010, 0.70), (-0.012, 0.66), (-0.011, 0.68)]):
        _run(out, f"method=grpo_sync_seed={seed}", "sync", seed, 0, 0, ref, acc)
        # async at inter 8: 0.002 nats and 0.10, 0.06, 0.08 avg@4 below sync, seed by seed
        _run(out, f"method=grpo_async_inter_lag=8_intra_switches=0_seed={seed}", "simulated",
             seed, 8, 0, ref - 0.002, acc - (0.10, 0.06, 0.08)[seed])
    _run(out, "method=grpo_async_inter_lag=0_intra_switches=3_seed=0", "simulated", 0, 0, 3,
         -0.015, 0.5)
    return out


def test_map_report_pairs_each_method_with_the_reference_by_seed(tmp_path, capsys):
    out = _map_dir(tmp_path)
    rep = map_report(load_runs(out), json.loads((out / "sweep_spec.json").read_text()))
    assert rep["reference"]["name"] == "grpo_sync" and rep["reference"]["seeds"] == [0, 1, 2]
    # sync avg@4 0.70, 0.66, 0.68: mean 0.68, s 0.02, t_{0.975,2} 4.302653
    assert rep["reference"]["eval_accuracy_after"] == pytest.approx((0.68, 4.302653 * 0.02 / 3 ** 0.5, 3))
    assert rep["reference"]["eval_accuracy_before"][0] == pytest.approx(0.6)
    (inter8,) = [r for r in rep["rows"] if (r["axis"], r["value"]) == ("inter", 8)]
    assert inter8["seeds"] == [0, 1, 2] and inter8["inter_all"] == pytest.approx(1.5)
    assert inter8["eval_accuracy_after_vs_ref"] == pytest.approx((-0.08, 4.302653 * 0.02 / 3 ** 0.5, 3))
    assert inter8["eval_ref_logp_after_vs_ref"][0] == pytest.approx(-0.002)
    (intra3,) = [r for r in rep["rows"] if (r["axis"], r["value"]) == ("intra", 3)]
    assert intra3["eval_accuracy_after_vs_ref"] == pytest.approx((-0.20, float("nan"), 1), nan_ok=True)
    # no run at inter 16 (nor at the crossing): no row, no made-up point
    assert {(r["axis"], r["value"]) for r in rep["rows"]} == {("inter", 8), ("intra", 3)}
    text = format_report(rep)
    assert "| grpo_async | inter | 8 | 1.5 | 0.0 | -0.0130 ± 0.0025 (3) | -0.0020 ± 0.0000 (3) | 0.600 ± 0.000 (3) | -0.080 ± 0.050 (3) |" in text
    assert "-0.080 ± 0.050 (3) |" in text
    fig_path = tmp_path / "map.png"
    assert main([str(out), "--figure", str(fig_path), "--json", str(tmp_path / "m.json")]) == 0
    assert fig_path.stat().st_size > 10_000
    assert json.loads((tmp_path / "m.json").read_text())["rows"][0]["method"] == "grpo_async"


def test_map_refuses_to_pool_runs_of_different_lengths(tmp_path, capsys):
    out = _map_dir(tmp_path)
    _run(out, "method=grpo_async_inter_lag=16_intra_switches=0_seed=0", "simulated", 0, 16, 0,
         -0.02, 0.4, steps=100)
    assert main([str(out)]) == 2
    assert "differ in rl_steps: one map holds one setting" in capsys.readouterr().err


def test_a_directory_without_a_map_is_refused_naming_the_fix(tmp_path, capsys):
    _run(tmp_path, "method=grpo_sync_seed=0", "sync", 0, 0, 0, -0.01, 0.7)
    assert main([str(tmp_path)]) == 2
    assert "sweep_spec.json not found: run the map with `python -m experiments.sweep run" \
        in capsys.readouterr().err
