#!/usr/bin/env bash
# The GPU checks of issue 15 section 5, in one run of at most ~8 minutes on one H200:
#
#   1. gpu_tests.xml/.json  the `-m gpu` tests (tests/test_rehearsal.py: the full-size
#                           rehearsal of the GPU preset on the accelerator, bf16)
#   2. learner.json         benchmarks/learner.py --gpu: ENTR train step at the
#                           Qwen2.5-0.5B shape in bf16, tokens/s and MFU (goal >= 40%)
#   3. sampler.json         benchmarks/sampler.py --gpu: JaxSampler decode throughput
#                           (HF generate beside it only when torch sees a CUDA device)
#   4. mismatch.json        benchmarks/mismatch.py: bf16 sampler vs f32 learner log-prob
#                           gap per behaviour-entropy bin, on a policy warm-started here
#                           (`entr-run stress`, SFT only; a random policy has every token in
#                           the top entropy bin)
#   suite.json              per step: exit status, seconds, the file it wrote; the device
#   suite.log               every step's output
#
# Usage (from the repository root):
#
#   benchmarks/gpu_suite.sh OUT_DIR            # e.g. benchmarks/gpu_suite.sh "$OUT"
#
# Environment:
#   PYTHON        interpreter with the project's dependencies and a CUDA jax
#                 (default: .venv/bin/python if present, else python3)
#   SUITE_BUDGET  scales every step's time limit (default 1.0); a step that overruns is
#                 stopped and recorded (rc 124), the next one still runs
#   ENTR_DATA_DIR data folder (the stress task generates its own data; not needed)
#
# Offline (the device machine reaches no package registry). Either
#   (a) carry a virtual environment built on a machine of the same architecture and
#       Python: `python -m venv .venv && .venv/bin/pip install -e ".[dev,hf]" "jax[cuda12]"`
#       (or jax[cuda13] to match the driver), then copy `.venv` along (`carry`) and run
#       with the default PYTHON; or
#   (b) use an interpreter that already has jax with CUDA, flax, optax, orbax, chex and
#       torch (this workplace's H200 image: python3), and carry the project's other
#       dependencies as wheels (versions of the tested venv), fetched where a registry is
#       reachable:
#         echo /.whl/ >> .git/info/exclude
#         python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#           --implementation cp --platform manylinux2014_x86_64 -d .whl \
#           tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.1 math-verify==0.9.0 \
#           latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 pebble==5.2.3 \
#           rank-bm25==0.2.2 tenacity==9.2.1 tensorboardX==2.6.5 grain==0.2.18 \
#           array_record==0.8.6 platformdirs==4.14.9
#       (each wheel's own Requires-Dist: `unzip -p .whl/NAME-*.whl '*/METADATA'`), then on
#       the device, before this script:
#         python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#         export PYTHONPATH=/tmp/site PYTHON=python3
#       and check that nothing is missing: `$PYTHON -m experiments.run quickstart --help`.
#
# Nothing here asserts a speed: the figures go to docs/performance.md with the date.

set -u -o pipefail

OUT=${1:?usage: benchmarks/gpu_suite.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
BUDGET=${SUITE_BUDGET:-1.0}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# tests/conftest.py defaults JAX to the CPU; the suite wants the accelerator
export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
WORK=$(mktemp -d "${TMPDIR:-/tmp}/entr-gpu-suite.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
LOG="$OUT/suite.log"
: > "$LOG"
STEPS="$WORK/steps.jsonl"
: > "$STEPS"

limit() { "$PYTHON" -c "import sys; print(max(10, int(float(sys.argv[1]) * $BUDGET)))" "$1"; }

# step NAME SECONDS OUTFILE CMD...: run CMD with a time limit, stdout to OUTFILE (when not
# empty), stderr and a header to the log; record the exit status and the seconds
step() {
  local name=$1 secs out=$3 t0 rc
  secs=$(limit "$2")
  shift 3
  echo "=== $name (limit ${secs}s): $*" | tee -a "$LOG"
  t0=$(date +%s.%N)
  if [ -n "$out" ]; then
    timeout --kill-after=10 "$secs" "$@" > "$out.tmp" 2>> "$LOG"; rc=$?
    mv "$out.tmp" "$out"
  else
    timeout --kill-after=10 "$secs" "$@" >> "$LOG" 2>&1; rc=$?
  fi
  "$PYTHON" - "$name" "$rc" "$t0" "$(date +%s.%N)" "$secs" "${out:-}" >> "$STEPS" <<'EOF'
import json, sys
name, rc, t0, t1, secs, out = sys.argv[1:]
print(json.dumps({"step": name, "rc": int(rc), "seconds": round(float(t1) - float(t0), 1),
                  "limit_s": int(secs), "timed_out": int(rc) in (124, 137),
                  "output": out.rsplit("/", 1)[-1] or None}))
EOF
  echo "=== $name: rc=$rc" | tee -a "$LOG"
}

"$PYTHON" - > "$WORK/device.json" 2>> "$LOG" <<'EOF'
import json, os, subprocess
import jax
info = {"jax": jax.__version__, "backend": jax.default_backend(),
        "devices": [str(d.device_kind) for d in jax.devices()]}
try:
    info["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
         "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
except (OSError, subprocess.SubprocessError) as e:
    info["nvidia_smi"] = f"unavailable: {e}"
print(json.dumps(info))
EOF

# 1. the -m gpu tests (exit 5 = none collected)
step gpu_tests 210 "" "$PYTHON" -m pytest -q -n 0 -m gpu -p no:cacheprovider \
  --junitxml "$OUT/gpu_tests.xml" tests/

# 2. learner at the Qwen2.5-0.5B shape, bf16 (H200 dense bf16 peak: 989 TFLOP/s)
step learner 90 "$OUT/learner.json" "$PYTHON" benchmarks/learner.py --gpu --batch 8 \
  --seq-len 1024 --steps 5 --peak-tflops 989

# 3. sampler decode; HF generate only where torch has CUDA (a CPU HF run would not end)
SKIP_HF=--skip-hf
if "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" \
    2>> "$LOG"; then SKIP_HF=""; fi
step sampler 60 "$OUT/sampler.json" "$PYTHON" benchmarks/sampler.py --gpu --repeats 3 $SKIP_HF

# 4. bf16 sampler vs f32 learner, per entropy bin, on a warm-started tiny policy
step stress_sft 60 "" "$PYTHON" -m experiments.run stress --run_dir "$WORK/stress" \
  --rl_steps 0 --sft.steps 600 --task.eval_examples 32
step mismatch 45 "$OUT/mismatch.json" "$PYTHON" benchmarks/mismatch.py \
  --model "$WORK/stress/sft_model" --prompts 32 --samples 8 --variants f32 bf16

"$PYTHON" - "$OUT" "$WORK/device.json" "$STEPS" <<'EOF'
import json, os, sys, time, xml.etree.ElementTree as ET
out, device, steps = sys.argv[1:]
result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "device": json.load(open(device)) if os.path.getsize(device) else None,
          "steps": [json.loads(l) for l in open(steps) if l.strip()]}
junit = os.path.join(out, "gpu_tests.xml")
if os.path.exists(junit):
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    result["gpu_tests"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors",
                                                                "skipped")}
for name in ("learner", "sampler", "mismatch"):
    path = os.path.join(out, f"{name}.json")
    try:
        result[name] = json.load(open(path))
    except (OSError, ValueError):
        result[name] = None
entr = (result.get("learner") or {}).get("entr_jax") or {}
result["learner_mfu"] = entr.get("mfu")
json.dump(result, open(os.path.join(out, "suite.json"), "w"), indent=1)
print(json.dumps({s["step"]: s["rc"] for s in result["steps"]}),
      "learner MFU:", result["learner_mfu"])
EOF
