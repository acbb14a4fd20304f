#!/usr/bin/env bash
# A stress warm-start chain (docs/results.md, "Warm starts"): the stress preset's SFT (1500
# steps of 16 at lr 1e-3 from the random init of INIT_SEED), then 3 stages of 2000 steps at
# lr 5e-4, each with its own data seed. Each stage prints its held-out avg@4. The chain is
# chaotic in float rounding: another commit or CPU gives other weights, which is why a
# study freezes the result (experiments/warm_starts/<name>/, its sha256 in the study spec).
#
# usage (repository root, venv active):
#   bash experiments/warm_starts/make_stress_chain.sh OUT INIT_SEED SEED1 SEED2 SEED3 SEED4
# the frozen warm starts of experiments/studies/stress_fp8.toml:
#   A: ... runs/ws/A 0 0 1 2 3      B: ... runs/ws/B 1 10 11 12 13
set -euo pipefail
out=$1; init=$2; s1=$3; shift 3
[ -f "$out/s1/summary.json" ] || entr-run stress --run_dir "$out/s1" --rl_steps 0 \
    --seed "$s1" --model.init_seed "$init"
prev=$out/s1
i=2
for s in "$@"; do
  if [ ! -f "$out/s$i/summary.json" ]; then
    rm -rf "$out/s$i"
    entr-run stress --run_dir "$out/s$i" --model.path "$prev/sft_model" \
        --sft.steps 2000 --sft.learning_rate 5e-4 --seed "$s" --rl_steps 0
  fi
  prev=$out/s$i
  i=$((i + 1))
done
echo "warm start: $prev/sft_model"
