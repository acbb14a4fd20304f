#!/usr/bin/env bash
# Re-create tests/data/stress_runs: the CI-sized slice of the stress regime (issue 12;
# docs/stress.md section 4), the method comparison sweep (stress_methods.toml) narrowed to
# ENTR and async GRPO, one seed, 14 RL steps of 4 prompts x 4 samples in the regime's
# setting (lr 5e-5, 4 PPO mini-batches per rollout batch, inter lag 8 + 3 in-flight
# switches, no sampler mismatch; the full lag on 3 of the 14 steps), token samples every
# 4 steps, from the regime's warm start. Keeps only the small files the notebooks and the comparison
# report read (config, metrics, timing, summary, eval, token samples, sweep_spec.json).
#
# Usage (repository root, venv active):  bash tests/data/make_stress_runs.sh [OUT_DIR]
# The warm start is $STRESS_SFT (default runs/stress_sft3500/sft_model); when it is missing
# it is made first with the two commands at the top of experiments/sweeps/stress_regime.toml
# (the long part: ~40 minutes on 2 cores). The sweep itself takes a few minutes.
set -euo pipefail
out="${1:-tests/data/stress_runs}"
sft="${STRESS_SFT:-runs/stress_sft3500/sft_model}"
if [ ! -f "$sft/config.json" ]; then
  [ -f runs/stress_sft/sft_model/config.json ] || \
    python -m experiments.run stress --run_dir runs/stress_sft --rl_steps 0
  python -m experiments.run stress --run_dir "$(dirname "$sft")" \
    --model.path runs/stress_sft/sft_model --sft.steps 2000 --sft.learning_rate 5e-4 \
    --seed 1 --rl_steps 0
fi
# The slice is experiments/sweeps/stress_methods.toml itself (its comparison base and its
# [fixed] regime settings), narrowed by the arguments in tests/data/stress_slice.args: two
# methods, seed 0, and small shapes (--set). tests/test_sweep.py checks that the stored
# runs' configs are what these arguments resolve to.
mapfile -t slice < tests/data/stress_slice.args
rm -rf "$out"
python -m experiments.sweep run experiments/sweeps/stress_methods.toml --out "$out" --workers 2 \
  "${slice[@]}" --set "model.path=$sft"
for run in "$out"/*/; do
  tests/data/trim_run.sh make_stress_runs.sh "$run"
done
du -sh "$out"
