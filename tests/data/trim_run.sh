#!/usr/bin/env bash
# tests/data/trim_run.sh CALLER RUN_DIR: refuse a run that did not finish, then keep only the
# small files the stored slices need (config, metrics, timing, summary, eval, token samples).
set -euo pipefail
caller="$1" run="$2"
if [ ! -f "$run/summary.json" ]; then
  echo "$caller: $run did not finish; see its sweep.log" >&2
  exit 1
fi
find "$run" -mindepth 1 -maxdepth 1 \
  ! -name config.json ! -name metrics.jsonl ! -name timing.jsonl ! -name summary.json \
  ! -name eval ! -name token_samples -exec rm -rf {} +
