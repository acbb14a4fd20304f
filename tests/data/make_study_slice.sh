#!/usr/bin/env bash
# Re-create tests/data/study_slice: a CI-sized slice of the pre-registered study
# experiments/studies/stress_fp8.toml (its tune stage narrowed to async GRPO and ENTR's
# first tau candidate, one tuning seed, warm start A, 14 RL steps of 4 prompts x
# 4 samples, token samples every 4 steps). It exercises the decomposition (its token
# samples carry logp_version), notebooks/decomposition.ipynb and the study's stage layout;
# it measures nothing. Keeps only the small files the analyses read.
#
# Usage (repository root, venv active):  bash tests/data/make_study_slice.sh [OUT_DIR]
set -euo pipefail
out="${1:-tests/data/study_slice}"
mapfile -t slice < tests/data/study_slice.args
rm -rf "$out"
python -m experiments.study tune experiments/studies/stress_fp8.toml --out "$out" --workers 2 \
  --warm-start A \
  "${slice[@]}"
for run in "$out"/tune/*/*/; do
  [ "$(basename "$run")" = shared_eval ] && { rm -rf "$run"; continue; }
  tests/data/trim_run.sh make_study_slice.sh "$run"
done
du -sh "$out"
