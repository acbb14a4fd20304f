"""Learner throughput benchmark; prints one JSON object.

CPU (default): a ~20M-parameter qwen2-shaped decoder at sequence 1024, one ENTR step per
optimizer step (``learners.step.make_train_step``), reported side by side with

* the machine's limit: achieved model FLOP/s, ``6 * N * tokens + 12 * layers * B * L^2 *
  D`` per step (dense matmuls forward + backward, Kaplan et al. 2020 arXiv 2001.08361
  Sec. 2.1, plus causal-free attention scores and values; embeddings' gather excluded from
  N), against an f32 matmul peak measured in the same run: ``--steps`` (>= 10) timed
  steps, each followed by one ``--peak-n`` (default 4096) square matmul, so the step times
  and the peak samples are interleaved; it reports the medians with quartiles and range,
  ``fraction_of_matmul_peak`` as the median of the per-step paired fractions, and the
  1-minute load average sampled before every step (a peak read on a loaded machine, or
  from a few small matmuls, moves the fraction by tens of percent with no code change);
* google-tunix's GRPO update on the same model shape (``tunix.rl.algo_core.grpo_loss_fn``
  + ``nnx.value_and_grad`` + ``optax.adamw`` under ``nnx.jit``; the loss/update path its
  ``GRPOLearner`` trains with, without the rollout cluster), run from a separate venv
  given by ``--tunix-python`` when it exists, as a child process whose steps are
  interleaved with ours (our step, a peak sample, its step, per round);
  ``entr_jax_over_tunix_tokens_per_s`` is the spread of the per-round paired ratios.

``--gpu``: bf16 parameters and activations, Qwen2.5-0.5B shape, random weights; prints
tokens/s and MFU against ``--peak-tflops`` (default 989, H100/H200 dense bf16).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import resource
import subprocess
import sys
import time

import numpy as np

try:  # imported as benchmarks.learner (tests) or run as a script from benchmarks/
    from benchmarks.objectives import spread
except ImportError:
    from objectives import spread

SMALL = dict(architecture="qwen2", vocab_size=16384, hidden_size=384, intermediate_size=1536,
             num_layers=6, num_heads=6, num_kv_heads=2, head_dim=64, attention_bias=True,
             tie_word_embeddings=True)
QWEN05 = dict(architecture="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
              num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, attention_bias=True,
              tie_word_embeddings=True)
TINY = dict(architecture="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128,
            num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16, attention_bias=True,
            tie_word_embeddings=True)  # dry runs of the GPU path on CPU (gpu_suite.sh)
SHAPES = {"qwen05": QWEN05, "small": SMALL, "tiny": TINY}


def _matmul_peak_fn(dtype, n=4096):
    """A timer of one jitted ``n x n`` matmul: returns its FLOP/s each call (``2 n^3`` per
    product, after ``block_until_ready``); compiled and warmed up once here."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()

    def measure() -> float:
        t0 = time.perf_counter()
        f(a, a).block_until_ready()
        return 2 * n**3 / (time.perf_counter() - t0)

    return measure


def _model_flops(cfg, n_params_matmul, batch, length) -> float:
    """Useful FLOPs of one forward + backward (the usual 3x forward) at ``batch`` x ``length``:
    ``6 N`` per token for the weight matmuls (N includes the tied unembedding) plus causal
    attention, whose scores and value mix touch only the ``L (L + 1) / 2`` (query, key)
    pairs with key <= query: ``3 x 2 matmuls x 2 FLOPs x h x d_head`` per pair and layer.
    (Counting the full ``L^2`` would credit the blocked causal kernel with work it skips.)"""
    tokens = batch * length
    pairs = batch * length * (length + 1) // 2
    attention = 12 * cfg.num_layers * pairs * cfg.num_heads * cfg.head_dim
    return 6 * n_params_matmul * tokens + attention


def synthetic_rl_batch(tokens, vocab_size: int, rng):
    """One optimizer batch (``Batch`` with a leading microbatch axis of 1) for timing an RL
    step on ``tokens`` ``[B, L]`` int: loss on response positions ``>= 64``, standard-normal
    advantages drawn from ``rng``, a uniform behavior policy (``logp_mu = -log V``,
    ``entropy_mu = log V``), version 0."""
    import numpy as np

    from entr_jax.types import Batch

    tokens = np.asarray(tokens, np.int32)
    b, length = tokens.shape
    t = length - 1
    return Batch(
        tokens=tokens[None], attention_mask=np.ones((1, b, length), bool),
        loss_mask=np.broadcast_to(np.arange(t) >= 64, (1, b, t)).copy(),
        advantages=rng.normal(size=(1, b, t)).astype(np.float32),
        logp_mu=np.full((1, b, t), -np.log(vocab_size), np.float32),
        entropy_mu=np.full((1, b, t), np.log(vocab_size), np.float32),
        token_version=np.zeros((1, b, t), np.int32),
        num_loss_tokens=np.float32(b * (t - 64)),
    )


def run_entr(shape: dict, *, batch: int, length: int, steps: int, dtype: str,
             peak_fn=None, after_step=None, model_kwargs: dict | None = None) -> dict:
    """Our ENTR train step timed ``steps`` times; after each, one ``peak_fn`` sample and
    ``after_step()`` (e.g. one timed tunix step), so the three are interleaved.
    ``model_kwargs``: extra `Decoder` arguments (e.g. ``{"remat": "full"}``)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from entr_jax.model import Decoder, ModelConfig
    from entr_jax.objectives import make_objective
    from entr_jax.sharding import MeshConfig, make_mesh
    from learners.distributed import shard_batch
    from learners.optim import OptimizerConfig, make_optimizer
    from learners.state import create_train_state
    from learners.step import make_train_step

    cfg = ModelConfig(**shape)
    dt = jnp.bfloat16 if dtype == "bf16" else jnp.float32
    mesh = make_mesh(MeshConfig(data=1, fsdp=jax.device_count()))
    tx = make_optimizer(OptimizerConfig(learning_rate=1e-5))
    t0 = time.perf_counter()
    state, shardings = create_train_state(
        lambda: Decoder(cfg, rngs=nnx.Rngs(0), dtype=dt, param_dtype=dt, **(model_kwargs or {})),
        tx, mesh)
    jax.block_until_ready(state)
    init_s = time.perf_counter() - t0
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    n_matmul = n_params  # tied embedding: the unembedding matmul uses every embedding entry
    step = make_train_step("rl", tx, shardings, mesh, objective=make_objective("entr"),
                           chunk_size=256)
    rng = np.random.default_rng(0)
    host = synthetic_rl_batch(rng.integers(0, cfg.vocab_size, (batch, length)), cfg.vocab_size, rng)
    device_batch = shard_batch(host, mesh)
    t0 = time.perf_counter()
    state, metrics, _ = step(state, device_batch)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - t0
    # Interleaved: step i, then (on CPU) one matmul-peak sample, so load drift hits both.
    step_times, peaks, load = [], [], []
    for _ in range(steps):
        load.append(os.getloadavg()[0])
        t0 = time.perf_counter()
        state, metrics, _ = step(state, device_batch)
        jax.block_until_ready(metrics)
        step_times.append(time.perf_counter() - t0)
        if peak_fn is not None:
            peaks.append(peak_fn())
        if after_step is not None:
            after_step()
    step_s = statistics.median(step_times)
    flops = _model_flops(cfg, n_matmul, batch, length)
    out = {
        "params": int(n_params),
        "batch": batch,
        "seq_len": length,
        "dtype": dtype,
        "model_kwargs": dict(model_kwargs or {}),
        "state_init_s_incl_compile": round(init_s, 3),
        "first_step_s_incl_compile": round(compile_s, 3),
        "steps": steps,
        "step_s": round(step_s, 4),
        "step_s_spread": {k: round(v, 4) for k, v in spread(step_times).items()},
        "tokens_per_s": round(batch * length / step_s, 1),
        "model_flops_per_step": flops,
        "achieved_flops_per_s": flops / step_s,
        "load_1m": {k: round(v, 2) for k, v in spread(load).items()},
        "loss_finite": bool(np.isfinite(float(metrics["loss"]))),
        "_step_times": step_times,  # for paired ratios; main() drops it before printing
    }
    if peaks:
        out["matmul_peak_samples"] = len(peaks)
        out["f32_matmul_peak_flops_per_s"] = spread(peaks)
        # Paired: step i's achieved FLOP/s over the peak sampled right after it.
        out["fraction_of_matmul_peak"] = spread([flops / t / p for t, p in zip(step_times, peaks)])
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        out["peak_device_memory_gb"] = round(stats["peak_bytes_in_use"] / 2**30, 3)
    return out


_TUNIX_SCRIPT = r"""
import json, sys, time
import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx
from tunix.models.qwen2 import model as qm
from tunix.rl import algo_core, common
from tunix.rl.grpo.grpo_learner import GRPOConfig
s = json.loads(sys.argv[1]); B, L = s["batch"], s["length"]
cfg = qm.ModelConfig(num_layers=s["num_layers"], vocab_size=s["vocab_size"],
    embed_dim=s["hidden_size"], hidden_dim=s["intermediate_size"], num_heads=s["num_heads"],
    head_dim=s["head_dim"], num_kv_heads=s["num_kv_heads"], rope_theta=10000, norm_eps=1e-6,
    use_tied_embedding=True)
model = qm.Qwen2(cfg, rngs=nnx.Rngs(0))
n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
opt = nnx.Optimizer(model, optax.adamw(1e-5), wrt=nnx.Param)
import types
algo = GRPOConfig(num_generations=2, num_iterations=1, beta=0.0)
algo = types.SimpleNamespace(**{**vars(algo), "temperature": getattr(algo, "temperature", 1.0)})
P = 64
rng = np.random.default_rng(0)
ex = common.TrainExample(
    prompt_ids=jnp.asarray(rng.integers(1, s["vocab_size"], (B, P)), jnp.int32),
    prompt_mask=jnp.ones((B, P), jnp.int32),
    completion_ids=jnp.asarray(rng.integers(1, s["vocab_size"], (B, L - P)), jnp.int32),
    completion_mask=jnp.ones((B, L - P), jnp.int32),
    advantages=jnp.asarray(rng.normal(size=(B,)), jnp.float32),
    ref_per_token_logps=None, old_per_token_logps=None)
@nnx.jit
def train_step(model, opt, ex):
    def loss_fn(m):
        return algo_core.grpo_loss_fn(m, ex, algo, pad_id=0, eos_id=-1)
    (loss, aux), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    opt.update(model, grads)
    return loss
t0 = time.perf_counter(); loss = train_step(model, opt, ex); jax.block_until_ready(loss)
compile_s = time.perf_counter() - t0
print(json.dumps({"params": int(n_params), "first_step_s_incl_compile": round(compile_s, 3),
    "jax": jax.__version__}), flush=True)
for line in sys.stdin:  # one timed step per request: the parent interleaves them with its own
    t0 = time.perf_counter()
    loss = train_step(model, opt, ex)
    jax.block_until_ready(loss)
    print(json.dumps({"step_s": time.perf_counter() - t0,
                      "loss_finite": bool(np.isfinite(float(loss)))}), flush=True)
"""


class TunixChild:
    """google-tunix's step in its own venv (``python``), as a child process that compiles
    once and then times one step per `step` call, so the parent can interleave its steps
    with ours (load drift then hits both sides alike)."""

    def __init__(self, python: str, shape: dict, *, batch: int, length: int,
                 platform: str | None = "cpu"):
        self.status, self.info, self.proc = "not run", {}, None
        if not os.path.exists(python):
            self.info = {"reason": f"no tunix interpreter at {python}"}
            return
        self.python = python
        spec = dict(shape, batch=batch, length=length)
        env = dict(os.environ)
        if platform is not None:  # None: the parent's platform (the accelerator)
            env["JAX_PLATFORMS"] = platform
        env.pop("XLA_FLAGS", None)
        self.proc = subprocess.Popen([python, "-c", _TUNIX_SCRIPT, json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        ready = self._read()  # compile + first step done; None: it failed (info says why)
        if ready is not None:
            self.info, self.status = ready, "ok"

    def _read(self) -> dict | None:
        line = self.proc.stdout.readline()
        if not line:  # the child exited: keep what it said, stop asking it for steps
            self.info = dict(self.info, stderr_tail=self.proc.stderr.read()[-1500:])
            self.status = "failed"
            return None
        return json.loads(line)

    def step(self) -> dict | None:
        """One timed tunix step: ``{"step_s", "loss_finite"}``, or None once it failed."""
        if self.status != "ok":
            return None
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> dict:
        """The child's figures (``status``, compile time, version), after stopping it."""
        out = dict(self.info or {}, status=self.status)
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
            version = subprocess.run([self.python, "-c", "import importlib.metadata as m;"
                                      "print(m.version('google-tunix'))"],
                                     capture_output=True, text=True)
            out["google_tunix_version"] = version.stdout.strip()
            out["what"] = "tunix grpo_loss_fn + nnx.value_and_grad + optax.adamw under nnx.jit"
        return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10,
                        help="timed steps (CPU: >= 10, each followed by one matmul-peak sample)")
    parser.add_argument("--peak-n", type=int, default=4096, help="size of the f32 peak matmul")
    parser.add_argument("--tunix-python", default="/tmp/tunix_venv/bin/python")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--model", default="{}",
                        help='JSON of extra Decoder arguments, e.g. \'{"remat": "dots"}\'')
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None,
                        help="model shape (default: qwen05 with --gpu, small on CPU)")
    args = parser.parse_args(argv)
    model_kwargs = json.loads(args.model)

    import jax

    if args.gpu:
        print(json.dumps(run_gpu(args, model_kwargs), indent=1))
        return

    batch = args.batch or 2
    if args.steps < 10:
        raise SystemExit("--steps must be >= 10 on CPU: step time and matmul peak are medians "
                         "of that many interleaved samples")
    shape = SHAPES[args.shape or "small"]
    peak_fn = _matmul_peak_fn("float32", n=args.peak_n)
    child = TunixChild(args.tunix_python, shape, batch=batch, length=args.seq_len)
    tunix_steps: list[dict] = []
    entr = run_entr(shape, batch=batch, length=args.seq_len, steps=args.steps, dtype="f32",
                    peak_fn=peak_fn, after_step=lambda: tunix_steps.append(child.step()),
                    model_kwargs=model_kwargs)
    entr_times = entr.pop("_step_times")
    entr["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
    peak = entr["f32_matmul_peak_flops_per_s"]["median"]
    tunix, ratio = tunix_figures(child, tunix_steps, entr_times, batch * args.seq_len)
    print(json.dumps({
        "device": f"cpu x{jax.device_count()} ({os.cpu_count()} cores visible)",
        "f32_matmul_peak_flops_per_s": peak,
        "f32_matmul_peak_n": args.peak_n,
        "entr_jax": entr,
        "google_tunix": tunix,
        "entr_jax_over_tunix_tokens_per_s": ratio,
    }, indent=1))


def tunix_figures(child: TunixChild, steps: list, entr_times: list[float], tokens: int):
    """``(tunix's figures, paired ratio)``: its step times beside ours, round by round
    (tunix's step time over ours = our tokens/s over tunix's); the ratio is None when its
    child did not run."""
    tunix = child.close()
    if tunix["status"] != "ok" or not all(steps):
        return tunix, None
    times = [t["step_s"] for t in steps]
    tunix.update(steps=len(times), step_s=round(statistics.median(times), 4),
                 step_s_spread={k: round(v, 4) for k, v in spread(times).items()},
                 tokens_per_s=round(tokens / statistics.median(times), 1),
                 loss_finite=all(t["loss_finite"] for t in steps),
                 peak_rss_gb_children=round(resource.getrusage(
                     resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 3))
    ratio = {k: round(v, 3) for k, v in spread([t / e for t, e in zip(times, entr_times)]).items()}
    return tunix, ratio


def run_gpu(args, model_kwargs: dict) -> dict:
    """``--gpu``: bf16 at ``--shape`` (default the 0.5B shape) on the default backend, MFU
    against ``--peak-tflops`` per device; google-tunix's step on the same shape interleaved
    with ours when it is importable here (or ``--tunix-python`` exists), in its own
    process on the same device."""
    import importlib.util

    import jax

    shape = SHAPES[args.shape or "qwen05"]
    batch = args.batch or 8
    python = (args.tunix_python if os.path.exists(args.tunix_python)
              else sys.executable if importlib.util.find_spec("tunix") else args.tunix_python)
    child = TunixChild(python, shape, batch=batch, length=args.seq_len, platform=None)
    tunix_steps: list[dict] = []
    entr = run_entr(shape, batch=batch, length=args.seq_len, steps=args.steps, dtype="bf16",
                    model_kwargs=model_kwargs, after_step=lambda: tunix_steps.append(child.step()))
    entr_times = entr.pop("_step_times")
    entr["mfu"] = entr["achieved_flops_per_s"] / (args.peak_tflops * 1e12 * jax.device_count())
    tunix, ratio = tunix_figures(child, tunix_steps, entr_times, batch * args.seq_len)
    return {"device": str(jax.devices()[0].device_kind), "shape": args.shape or "qwen05",
            "entr_jax": entr, "peak_tflops_assumed": args.peak_tflops, "google_tunix": tunix,
            "entr_jax_over_tunix_tokens_per_s": ratio}


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
