"""Full-size rehearsal on CPU: a Qwen2.5-0.5B-shaped policy through the whole RL loop.

What it does, per dtype (``--dtypes float32 bfloat16``):

1. writes a random-init Qwen2.5-0.5B-shaped checkpoint (`QWEN25_05B`: vocabulary 151,936,
   tied embeddings, hidden 896, 24 layers, 14 query / 2 key-value heads, head 64, SwiGLU
   4864, RoPE theta 1e6, context 32,768, as in the published ``config.json``) with the
   project's own `entr_jax.model.save_pretrained`, in bfloat16 like the published
   weights, plus the embedded tiny tokenizer (the real one is not shipped; token ids the
   tokenizer does not know decode to nothing, as Qwen's 271 padding ids do);
2. runs ``entr-run math`` -- the GPU preset itself: async staleness, bf16-capable FSDP
   learner, ENTR -- with ``--model.path`` that checkpoint, the embedded JAX sampler in
   place of the SGLang fleet (there is no engine on CPU), tiny prompts (the ``arithmetic``
   task), short generation, ``--sft.steps 0``, a small batch, 2 RL steps, a checkpoint
   after each, and per-token scoring every step (``token_samples_every 1``). The learner,
   sampler and checkpoint dtypes are ``--model.dtype/param_dtype/sampler_dtype`` = the
   dtype;
3. in a second process, restores the newest checkpoint through the job
   (`experiments.run.job.Job`), exports the trained policy with `experiments.run.export.export_policy` (Hugging Face
   layout), reloads it with `entr_jax.model.from_pretrained` and checks that every
   parameter is bitwise the checkpoint's and that the logits of one prompt agree.

Each step runs in its own process, so its peak resident memory is its own (``wait4``).
Prints one JSON object: per dtype the step times, the phase split, the peak RSS of each
process, the checks, and the 1/5/15-minute load averages before and after.

Usage (from the repository root; ``ENTR_DATA_DIR`` as for every run)::

    python benchmarks/rehearsal.py                        # both dtypes, full size
    python benchmarks/rehearsal.py --dtypes bfloat16 --workdir /tmp/reh --keep
    python benchmarks/rehearsal.py --shape small          # a 4-layer stand-in, a minute

The full-size run of one dtype takes tens of minutes on 2 cores and needs about
10 GiB (float32) of memory; run one at a time on a shared machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Qwen/Qwen2.5-0.5B config.json (the shape; token ids come from the tokenizer shipped here)
QWEN25_05B = dict(architecture="qwen2", vocab_size=151936, hidden_size=896,
                  intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2,
                  head_dim=64, rope_theta=1000000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, attention_bias=True,
                  max_position_embeddings=32768)
# a quick stand-in of the same family (checks the script, not the shapes)
SMALL = dict(QWEN25_05B, vocab_size=4096, hidden_size=128, intermediate_size=256,
             num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32)
SHAPES = {"qwen2.5-0.5b": QWEN25_05B, "small": SMALL}

RL_STEPS = 2
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def job_args(model_dir: str, run_dir: str, dtype: str, mode: str = "async",
             microbatches: int = 2) -> list[str]:
    """``entr-run`` arguments of the rehearsal (the ``math`` GPU preset, CPU-sized);
    ``mode``: ``staleness.mode`` (the preset's ``async``, or ``sync``: sampler and learner
    take turns, so their compilations and buffers do not overlap); ``microbatches``:
    ``learner.microbatches`` (1 = no gradient accumulators)."""
    return [
        "math", "--model.path", model_dir, "--run_dir", run_dir,
        "--model.dtype", dtype, "--model.param_dtype", dtype, "--model.sampler_dtype", dtype,
        # no SGLang engine on CPU: the embedded sampler, which reports the exact entropy
        "--sampler.kind", "jax", "--objective.entr.entropy_source", "behavior_full",
        "--task.name", "arithmetic", "--task.template", "plain",
        "--task.prompts_per_step", "2", "--task.samples_per_prompt", "2",
        "--task.max_new_tokens", "8", "--task.max_turns", "1", "--task.max_total_tokens", "8",
        "--task.eval_examples", "2", "--task.eval_samples", "1",
        "--learner.microbatches", str(microbatches),
        "--sft.steps", "0", "--rl_steps", str(RL_STEPS), "--token_samples_every", "1",
        "--checkpoint.every", "1", "--checkpoint.keep", "2",
        "--staleness.mode", mode,
    ]


def write_checkpoint(path: str, shape: str) -> dict:
    """Random-init policy of ``SHAPES[shape]`` saved as bf16 safetensors + tokenizer."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from entr_jax.assets import tiny_dir
    from entr_jax.model import Decoder, ModelConfig, save_pretrained

    tiny = json.load(open(os.path.join(tiny_dir(), "config.json")))
    cfg = ModelConfig(**SHAPES[shape], bos_token_id=tiny["bos_token_id"],
                      eos_token_id=tiny["eos_token_id"], pad_token_id=tiny["pad_token_id"])
    model = Decoder(cfg, rngs=nnx.Rngs(0), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    files = save_pretrained(model, path)
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(tiny_dir(), name)):
            shutil.copy(os.path.join(tiny_dir(), name), os.path.join(path, name))
    n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return {"params": int(n), "files": files,
            "bytes": sum(os.path.getsize(os.path.join(path, f)) for f in files)}


def export_and_reload(model_dir: str, run_dir: str, dtype: str, export_dir: str,
                      mode: str = "async", microbatches: str = "2") -> dict:
    """Restore the run's newest checkpoint through the job, export it, reload, compare."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from entr_jax.model import from_pretrained, to_hf_state_dict
    from experiments.run.export import export_policy
    from experiments.run.job import Job
    from experiments.run.cli import parse

    cfg, _ = parse(job_args(model_dir, run_dir, dtype, mode, int(microbatches)))
    job = Job(cfg, resume=True, show_progress=False)
    # the sampler and the source are not needed here: their copy of the weights is released
    parts = job.parts = dataclasses.replace(job.build_parts(), sampler=None, source=None)
    t0 = time.perf_counter()
    restored = parts.learner.restore_latest()
    restore_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    export_policy(parts.learner.state, export_dir, cfg.model.path, job.run.writer)
    export_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    dt = jnp.dtype(dtype)
    reloaded = from_pretrained(export_dir, dtype=dt, param_dtype=dt)
    reload_s = time.perf_counter() - t0
    trained = parts.learner.state.model()
    # per HF tensor (one per layer of each stacked block parameter)
    a, b = to_hf_state_dict(trained), to_hf_state_dict(reloaded)
    mismatched = [name for name in a if name not in b or not np.array_equal(a[name], b[name])]
    ids = jnp.asarray(parts.tokenizer.encode("12+34=", add_special_tokens=False), jnp.int32)[None]
    logits_diff = float(jnp.max(jnp.abs(trained(ids) - reloaded(ids))))
    out = {"restored_step": int(restored["queue_state"]["book"]["start_step"]),
           "version": int(jax.device_get(parts.learner.state.version)),
           "params_compared": len(a), "params_not_bitwise_equal": mismatched,
           "logits_max_abs_diff": logits_diff,
           "export_dtype": json.load(open(os.path.join(export_dir, "config.json")))["dtype"],
           "restore_s": restore_s, "export_s": export_s, "reload_s": reload_s}
    parts.learner.close()
    parts.task.verifier.close()
    return out


def _rss_gib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def _child(argv: list[str], env: dict, timeout: float, log: str,
           max_rss_gib: float | None = None) -> dict:
    """Run ``argv`` to completion; its wall time, exit status and peak RSS (``wait4``).
    Killed past ``timeout`` seconds, or when its resident memory passes ``max_rss_gib``
    (polled every 0.5 s: a guard for shared machines, not a measurement)."""
    t0 = time.perf_counter()
    killed = None
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                killed = f"timeout ({timeout:.0f} s)"
            elif max_rss_gib and _rss_gib(proc.pid) > max_rss_gib:
                killed = f"resident memory over --max-rss-gib {max_rss_gib}"
            if killed:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.5)
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = {"rc": proc.returncode, "wall_s": round(time.perf_counter() - t0, 2),
           "peak_rss_gib": round(usage.ru_maxrss / 2**20, 3),
           "user_cpu_s": round(usage.ru_utime, 1), "log": log}
    if killed:
        out["killed"] = killed
    return out


def _jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def rehearse(dtype: str, workdir: str, shape: str, timeout: float,
             max_rss_gib: float | None = None, mode: str = "async",
             microbatches: int = 2) -> dict:
    """Steps 1-3 of the module docstring for one dtype; the JSON record."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.setdefault("JAX_PLATFORMS", "cpu")
    model_dir = os.path.join(workdir, f"model_{shape}")
    run_dir = os.path.join(workdir, f"run_{dtype}")
    export_dir = os.path.join(workdir, f"export_{dtype}")
    load_before = os.getloadavg()
    out: dict = {"dtype": dtype, "shape": shape, "load_avg_before": load_before}
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        w = _child([sys.executable, __file__, "--write-checkpoint", model_dir, "--shape", shape],
                   env, timeout, os.path.join(workdir, "write_checkpoint.log"))
        out["write_checkpoint"] = w
        if w["rc"] != 0:
            return dict(out, ok=False, failed="write_checkpoint")
        out["checkpoint"] = json.loads(open(w["log"]).read().strip().splitlines()[-1])
    job = _child([sys.executable, "-m", "experiments.run"]
                 + job_args(model_dir, run_dir, dtype, mode, microbatches),
                 env, timeout, os.path.join(workdir, f"job_{dtype}.log"), max_rss_gib)
    out["job"] = job
    if job["rc"] != 0:
        return dict(out, ok=False, failed="job", job_log_tail=open(job["log"]).read()[-3000:])
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    timing = _jsonl(os.path.join(run_dir, "timing.jsonl"))
    metrics = _jsonl(os.path.join(run_dir, "metrics.jsonl"))
    steps = [{"step": t["step"], "sample_s": t.get("time/sample_s"),
              "wait_s": t.get("time/wait_s"), "learn_s": t.get("time/learn_s"),
              "trained_tokens_per_s": t.get("throughput/trained_tokens_per_s")} for t in timing]
    learn = sum(s["learn_s"] or 0.0 for s in steps)
    wait = sum(s["wait_s"] or 0.0 for s in steps)
    sample = sum(s["sample_s"] or 0.0 for s in steps)
    # async: sampling overlaps the learner, only the learner's waits take RL time
    sampling_in_rl = wait if mode == "async" else sample
    out["steps"] = steps
    out["step_time_s"] = {"first_incl_compile": steps[0]["learn_s"] if steps else None,
                          "last": steps[-1]["learn_s"] if steps else None}
    out["phases_s"] = {
        "job_process": job["wall_s"],
        "job_wall": summary["wall_clock_s"],
        "imports_and_setup": job["wall_s"] - summary["wall_clock_s"],
        "evaluation_before_and_after": summary["wall_clock_s"] - summary["rl_wall_clock_s"],
        "rl": summary["rl_wall_clock_s"],
        "rl_learn": learn, "rl_sample": sample, "rl_wait_for_sampler": wait,
        "rl_checkpoint_scoring_logging": summary["rl_wall_clock_s"] - learn - sampling_in_rl,
    }
    out["rl"] = {"steps": len(metrics), "versions": [m.get("version") for m in metrics],
                 "loss": [m.get("loss") for m in metrics],
                 "reward_mean": [m.get("reward/mean") for m in metrics],
                 "entropy_mu_mean": [m.get("entropy/mu_mean", m.get("entropy_mu/mean"))
                                     for m in metrics],
                 "checkpoints": sorted(int(d) for d in os.listdir(os.path.join(run_dir,
                                       "checkpoints")) if d.isdigit())}
    exp = _child([sys.executable, __file__, "--export", model_dir, run_dir, dtype, export_dir,
                  mode, str(microbatches)], env, timeout,
                 os.path.join(workdir, f"export_{dtype}.log"), max_rss_gib)
    out["export_process"] = exp
    if exp["rc"] != 0:
        return dict(out, ok=False, failed="export",
                    export_log_tail=open(exp["log"]).read()[-3000:])
    out["export_reload"] = json.loads(open(exp["log"]).read().strip().splitlines()[-1])
    out["phases_s"].update({k: out["export_reload"][k] for k in ("restore_s", "export_s",
                                                                 "reload_s")})
    out["peak_rss_gib"] = max(job["peak_rss_gib"], exp["peak_rss_gib"])
    out["load_avg_after"] = os.getloadavg()
    er = out["export_reload"]
    out["ok"] = (len(metrics) == RL_STEPS and er["version"] == RL_STEPS
                 and not er["params_not_bitwise_equal"] and er["logits_max_abs_diff"] == 0.0
                 and all(m.get("loss") is not None for m in metrics))
    return out


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                   choices=["float32", "bfloat16"])
    p.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    p.add_argument("--workdir", default="", help="keep files here (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per process")
    p.add_argument("--mode", default="async", choices=["async", "sync"],
                   help="staleness.mode of the job (the preset's: async)")
    p.add_argument("--microbatches", type=int, default=2,
                   help="learner.microbatches of the job (1: no gradient accumulators)")
    p.add_argument("--max-rss-gib", type=float, default=None,
                   help="kill a process whose resident memory passes this (shared machines)")
    p.add_argument("--write-checkpoint", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--export", nargs="+", metavar="MODEL RUN DTYPE OUT [MODE MICROBATCHES]",
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.write_checkpoint:  # child process
        print(json.dumps(write_checkpoint(args.write_checkpoint, args.shape)))
        return None
    if args.export:  # child process
        print(json.dumps(export_and_reload(*args.export)))
        return None
    workdir = args.workdir or tempfile.mkdtemp(prefix="entr-rehearsal-")
    os.makedirs(workdir, exist_ok=True)
    result = {"what": "CPU rehearsal of the GPU preset 'math' at the Qwen2.5-0.5B shape "
                      "(benchmarks/rehearsal.py)",
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "cpu_count": os.cpu_count(), "rl_steps": RL_STEPS,
              "entr_run_args": job_args("MODEL", "RUN", "DTYPE", args.mode, args.microbatches),
              "runs": {}}
    try:
        for dtype in args.dtypes:
            result["runs"][dtype] = rehearse(dtype, workdir, args.shape, args.timeout,
                                             args.max_rss_gib, args.mode, args.microbatches)
    finally:
        if not args.workdir and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            result["workdir"] = workdir
    result["ok"] = all(r.get("ok") for r in result["runs"].values())
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main()
