#!/usr/bin/env bash
# Re-create tests/data/stress_runs: the CI-sized slice of the stress regime (issue 12;
# docs/stress.md section 4), a comparison sweep (experiments/comparison.py) of ENTR and
# async GRPO, one seed, 14 RL steps of 4 prompts x 4 samples in the regime's setting
# (lr 5e-5, 4 PPO mini-batches per rollout batch, inter lag 8 + 3 in-flight switches, no
# sampler mismatch; the full lag on 3 of the 14 steps), token samples every 4 steps, from
# the regime's warm start. Keeps only the small files the notebooks and the comparison
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
spec="$(mktemp --suffix=.toml)"
trap 'rm -f "$spec"' EXIT
cat > "$spec" <<TOML
preset = "stress"
seeds = [0]
[comparison]
base = { aggregation = "token_mean", l_norm = "None", clip_low = 0.2, clip_high = 0.28 }
[comparison.methods.entr]
objective = "entr"
own = { tau = 1.0, eps = 0.01, entropy_source = "behavior_full", denominator = "all_tokens" }
[comparison.methods.grpo_async]
objective = "grpo"
own = { kl_coef = 0.0 }
[fixed]
"model.path" = "$sft"
"sft.steps" = 0
"checkpoint.every" = 0
rl_steps = 14
token_samples_every = 4
"task.prompts_per_step" = 4
"task.samples_per_prompt" = 4
"task.eval_examples" = 16
"task.eval_samples" = 2
"task.chain_train_size" = 2000
"optim.learning_rate" = 5e-5
"learner.minibatches" = 4
"staleness.inter_lag" = 8
"staleness.intra_switches" = 3
"sampler.logit_noise_std" = 0.0
TOML
rm -rf "$out"
python -m experiments.sweep run "$spec" --out "$out" --workers 2
for run in "$out"/*/; do
  if [ ! -f "$run/summary.json" ]; then
    echo "make_stress_runs.sh: $run did not finish; see its sweep.log" >&2
    exit 1
  fi
  find "$run" -mindepth 1 -maxdepth 1 \
    ! -name config.json ! -name metrics.jsonl ! -name timing.jsonl ! -name summary.json \
    ! -name eval ! -name token_samples -exec rm -rf {} +
done
du -sh "$out"
