"""Write tests/data/tolerance_map: a SYNTHETIC tolerance map (hand-made summaries, no
training) on which notebooks/tolerance_map.ipynb executes in the tests. Every value is
made up by the formulas below; nothing here is a result.

    python tests/data/make_tolerance_map.py
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from experiments.multirun.sweep_spec import check_spec  # noqa: E402

OUT = pathlib.Path(__file__).parent / "tolerance_map"
METHODS = {"grpo_sync": {"objective": "grpo", "own": {"kl_coef": 0.0},
                         "overrides": {"staleness.mode": "sync"}},
           "grpo_async": {"objective": "grpo", "own": {"kl_coef": 0.0}},
           "entr": {"objective": "entr", "own": {"tau": 1.0, "eps": 0.01,
                                                 "entropy_source": "behavior_full",
                                                 "denominator": "all_tokens"}}}


def write_run(name, label, mode, seed, inter, intra, acc, ref):
    d = OUT / name
    d.mkdir(parents=True)
    cfg = {"name": label, "seed": seed, "rl_steps": 40, "objective": {"name": label.split("_")[0]},
           "optim": {"learning_rate": 5e-5},
           "staleness": {"mode": mode, "inter_lag": inter, "intra_switches": intra,
                         "ring_size": 10}, "run_dir": f"tests/data/tolerance_map/{name}"}
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    rows = [{"step": i, "staleness/inter_mean": float(min(i, inter)),
             "staleness/intra_mean": float(intra)} for i in range(40)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({
        "eval_accuracy_before": 0.62, "eval_accuracy_after": acc,
        "eval_ref_logp_before": -0.0166, "eval_ref_logp_after": ref}, indent=1))


def main():
    spec = check_spec({"preset": "stress", "seeds": [0, 1],
                       "map": {"inter_lag": [0, 8, 16], "intra_switches": [0, 3]},
                       "comparison": {"base": {"aggregation": "token_mean", "l_norm": "None",
                                               "clip_low": 0.2, "clip_high": 0.28},
                                      "methods": METHODS}}, "synthetic")
    OUT.mkdir()
    (OUT / "sweep_spec.json").write_text(json.dumps(spec, indent=1, sort_keys=True))
    for seed in (0, 1):
        write_run(f"method=grpo_sync_seed={seed}", "grpo_sync", "sync", seed, 0, 0,
                  0.69 + 0.01 * seed, -0.0108)
        for label, slope in (("grpo_async", 0.012), ("entr", 0.006)):
            for inter, intra in ((0, 0), (8, 0), (16, 0), (0, 3)):
                lag = inter + 2 * intra
                write_run(f"method={label}_inter_lag={inter}_intra_switches={intra}_seed={seed}",
                          label, "simulated", seed, inter, intra,
                          0.69 - slope * lag + 0.01 * seed, -0.0108 - slope * lag / 20)


if __name__ == "__main__":
    main()
