"""A dry run of benchmarks/gpu_suite.sh on the CPU at tiny shapes (SUITE_TINY=1), so the
script and every benchmark it calls keep working between runs on an accelerator: every
step ends with status 0 inside its limit and writes the figure it exists for.

The limits are the accelerator's times 3 (SUITE_BUDGET=3): alone on the 2-core machine
the tiny steps take 6-22 s, but beside the rest of the suite (`-n 2`, other jobs) the
mismatch step overran its 45 s once; a hang still ends the step."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_gpu_suite_runs_every_step_at_tiny_shapes_on_cpu(tmp_path):
    env = dict(os.environ, SUITE_TINY="1", SUITE_BUDGET="3", JAX_PLATFORMS="cpu",
               PYTHON=sys.executable, ENTR_JAX_CACHE="0")
    env.pop("XLA_FLAGS", None)  # one device, as the suite's steps expect
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_suite.sh"), str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    log = (tmp_path / "suite.log").read_text() if (tmp_path / "suite.log").exists() else ""
    assert proc.returncode == 0, proc.stderr[-2000:] + log[-3000:]
    suite = json.loads((tmp_path / "suite.json").read_text())
    assert suite["tiny"] is True
    steps = {s["step"]: s for s in suite["steps"]}
    assert list(steps) == ["gpu_tests", "learner", "sampler", "warm_start", "mismatch"]
    for name, s in steps.items():
        assert s["rc"] == 0 and not s["timed_out"], (name, s, log[-3000:])
    assert suite["gpu_tests"]["tests"] >= 1 and suite["gpu_tests"]["failures"] == 0
    entr = suite["learner"]["entr_jax"]
    assert entr["tokens_per_s"] > 0 and entr["loss_finite"] and entr["mfu"] > 0
    assert entr["state_init_s_incl_compile"] > 0 and entr["first_step_s_incl_compile"] > 0
    assert "status" in suite["learner"]["google_tunix"]
    jax_sampler = suite["sampler"]["jax_sampler"]
    assert jax_sampler["dtype"] == "bfloat16" and jax_sampler["warmup_compilations"] >= 1
    assert 0 < suite["sampler_roofline"] == jax_sampler["roofline"]["fraction_of_copy_bandwidth"]
    variants = suite["mismatch"]["variants"]
    assert set(variants) == {"f32", "bf16"}
