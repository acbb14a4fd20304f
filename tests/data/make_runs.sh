#!/usr/bin/env bash
# Re-create the small real run directories in tests/data/runs (used by tests/test_analysis.py
# and tests/test_notebooks.py). Runs the main job through the sweep tool: GRPO and ENTR at
# inter lags 1 and 3 (one intra switch, the preset's), ENTR with 3 intra switches, and
# GRPO in sync mode; 6 RL steps each, token samples every 2 steps. Then keeps only the
# small files (config, metrics, timing, summary, sft losses, eval, token samples).
#
# Usage (from the repository root, venv active):  bash tests/data/make_runs.sh [OUT_DIR]
# Takes ~10 minutes on 2 CPU cores.
set -euo pipefail
out="${1:-tests/data/runs}"
spec="$(mktemp --suffix=.toml)"
trap 'rm -f "$spec"' EXIT
cat > "$spec" <<'TOML'
preset = "quickstart"
seeds = [0]
[[grid]]
"objective.name" = ["grpo", "entr"]
"staleness.inter_lag" = [1, 3]
[[grid]]
"objective.name" = ["entr"]
"staleness.inter_lag" = [1]
"staleness.intra_switches" = [3]
"staleness.ring_size" = [4]
[[grid]]
"objective.name" = ["grpo"]
"staleness.mode" = ["sync"]
[fixed]
rl_steps = 6
token_samples_every = 2
"sft.steps" = 150
"optim.learning_rate" = 1e-3
"task.prompts_per_step" = 4
"task.samples_per_prompt" = 4
"task.eval_examples" = 8
"task.eval_samples" = 1
"staleness.switch_window" = 8
"checkpoint.every" = 0
TOML
rm -rf "$out"
python -m experiments.sweep run "$spec" --out "$out" --workers 2
for run in "$out"/*/; do
  if [ ! -f "$run/summary.json" ]; then
    echo "make_runs.sh: $run did not finish; see its sweep.log" >&2
    exit 1
  fi
  # keep only the small files the analysis reads (checkpoints, ring, tb, sft_model, ... go)
  find "$run" -mindepth 1 -maxdepth 1 \
    ! -name config.json ! -name metrics.jsonl ! -name timing.jsonl ! -name summary.json \
    ! -name sft.jsonl ! -name eval ! -name token_samples -exec rm -rf {} +
done
du -sh "$out"
