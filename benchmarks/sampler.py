"""Decode throughput of `JaxSampler` vs Hugging Face transformers ``generate``, as JSON.

Usage (from the repository root)::

    python benchmarks/sampler.py            # CPU: ~5M-param Qwen2, batch 8, 128 new tokens
    python benchmarks/sampler.py --gpu      # larger model for an accelerator (JAX default
                                            # backend; HF on CUDA when torch has it)
    python benchmarks/sampler.py --devices 1   # CPU: the JAX sampler on one host device only

Both engines run the same weights: the random `Decoder` is written with
`entr_jax.model.save_pretrained` and read back by ``AutoModelForCausalLM.from_pretrained``
(the max |logit difference| on the benchmark prompts is reported as ``parity_max_abs``).
Both sample with temperature 1, no filtering, no stop tokens, and generate exactly
``--new-tokens`` tokens for every row of equal-length random prompts (so HF needs no
padding). ``tokens_per_s = batch * new_tokens / seconds`` of a whole ``generate`` call
(prefill included); the JAX sampler also reports its decode-only rate.

Each engine gets one warm-up call first (JAX compiles there: ``warmup_s_incl_compile``,
reported apart), then ``--repeats`` rounds time each engine once, in alternating order,
with the 1-minute load average sampled every round. Figures are medians with ``p25``/``p75``
and extremes; ``ratio_jax_over_hf_tokens_per_s`` is the median of the per-round paired
ratios. The JAX sampler also computes the full-vocabulary entropy and log-prob of every
sampled token (``entropy_mu``, ``logp_mu``); HF ``generate`` computes neither.

Memory roofline. Beside tokens/s the JAX sampler reports ``roofline``: the bytes a decode
step must read (every weight but the embedding table, in the serving dtype, plus the K
and V of every position so far in every layer; mean over the steps), divided by the
measured step time and by a measured device bandwidth (a jitted ``x + 1`` over
``--copy-mb`` MB, read + write, median of 10), as ``fraction_of_copy_bandwidth``; and
``warmup_compilations``, the XLA compilations of its warm-up call. ``--dtype bfloat16``
serves in bf16 (`JaxSamplerConfig.dtype`, ``model.sampler_dtype`` of a run),
``--scan-layers`` scans over stacked layers (`JaxSamplerConfig.scan_layers`).

Cores: torch runs its intra-op threads on every core. XLA:CPU runs the small matmuls of a
decode step (32 rows) on one thread, so on CPU the script by default also times the JAX
sampler with ``--devices`` replicas (default: one per core), the process started with that
many host devices (``XLA_FLAGS=--xla_force_host_platform_device_count``, set here before
JAX starts): `JaxSamplerConfig.num_devices` splits the batch into one device batch per
replica and runs them concurrently. ``jax_sampler`` is then the replicated sampler and
``jax_sampler_1_device`` the single-device one, each with its paired ratio to HF
(``ratio_jax_over_hf_tokens_per_s``, ``ratio_jax_1_device_over_hf_tokens_per_s``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import monitoring

from entr_jax.interfaces import SamplingParams
from entr_jax.model import Decoder, ModelConfig, save_pretrained
from samplers.jax_sampler import JaxSampler, JaxSamplerConfig

from objectives import spread  # benchmarks/objectives.py (this script's folder is on sys.path)

SIZES = {
    "cpu": dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_layers=4,
                num_heads=4, num_kv_heads=2, head_dim=64, batch=8, prompt_len=32,
                new_tokens=128),
    "gpu": dict(vocab_size=32768, hidden_size=1024, intermediate_size=2816, num_layers=16,
                num_heads=16, num_kv_heads=4, head_dim=64, batch=64, prompt_len=128,
                new_tokens=256),
}


def build_model(s: dict) -> Decoder:
    cfg = ModelConfig(
        architecture="qwen2", vocab_size=s["vocab_size"], hidden_size=s["hidden_size"],
        intermediate_size=s["intermediate_size"], num_layers=s["num_layers"],
        num_heads=s["num_heads"], num_kv_heads=s["num_kv_heads"], head_dim=s["head_dim"],
        attention_bias=True, max_position_embeddings=4096,
    )
    return Decoder(cfg, rngs=nnx.Rngs(0))


class JaxEngine:
    """The embedded sampler on ``prompts``: one warm-up call (compilation) at construction,
    then `call` times one whole ``generate`` (prefill included)."""

    def __init__(self, model: Decoder, prompts: np.ndarray, new_tokens: int, name: str,
                 devices: int = 1, dtype: str = "float32", scan_layers: bool = False,
                 bandwidth: float | None = None):
        self.name, self.devices, self.dtype = name, devices, dtype
        self.prompts, self.new_tokens = prompts.tolist(), new_tokens
        self.bytes_per_step = decode_bytes_per_step(model, len(prompts), prompts.shape[1],
                                                    new_tokens, jnp.dtype(dtype).itemsize)
        self.bandwidth = bandwidth
        self.sampler = JaxSampler(model, config=JaxSamplerConfig(
            max_batch_size=len(prompts), min_prompt_bucket=prompts.shape[1], steps_per_call=32,
            num_devices=devices, dtype=dtype, scan_layers=scan_layers))
        compiles = []
        listener = lambda event, *a, **k: compiles.append(event) if event.endswith(  # noqa: E731
            "backend_compile_duration") else None
        monitoring.register_event_time_span_listener(listener)
        t0 = time.perf_counter()
        self.sampler.generate(self.prompts, SamplingParams(max_new_tokens=new_tokens, seed=0))
        self.warmup_s = time.perf_counter() - t0
        monitoring.unregister_event_time_span_listener(listener)
        self.warmup_compilations = len(compiles)
        self.decode_rates: list[float] = []
        self.step_s: list[float] = []
        self.prefill_s: list[float] = []

    def call(self, r: int) -> float:
        t0 = time.perf_counter()
        out = self.sampler.generate(self.prompts,
                                    SamplingParams(max_new_tokens=self.new_tokens, seed=r + 1))
        seconds = time.perf_counter() - t0
        assert all(len(g[0].response_ids) == self.new_tokens for g in out)
        st = self.sampler.last_stats
        # decode_steps sums the device batches' steps (concurrent on replicas); every row
        # decodes the same number of steps, so one batch's count times all rows
        steps = st["decode_steps"] / st["prefills"]
        self.decode_rates.append(len(self.prompts) * steps / st["decode_time_s"])
        self.step_s.append(st["decode_time_s"] / steps)
        self.prefill_s.append(st["prefill_time_s"])
        return seconds

    def extra(self) -> dict:
        out = {"decode_tokens_per_s": spread(self.decode_rates),
               "decode_step_s": spread(self.step_s, 6),
               "prefill_s": spread(self.prefill_s),
               "warmup_s_incl_compile": round(self.warmup_s, 3),
               "warmup_compilations": self.warmup_compilations,
               "dtype": self.dtype, "scan_layers": self.sampler.config.scan_layers,
               "backend": jax.default_backend(), "num_devices": self.devices}
        if self.bandwidth:  # one device's bandwidth: meaningful for one replica
            step = statistics.median(self.step_s)
            out["roofline"] = {
                "bytes_per_decode_step": self.bytes_per_step,
                "achieved_bytes_per_s": round(self.bytes_per_step / step),
                "copy_bandwidth_bytes_per_s": round(self.bandwidth),
                "fraction_of_copy_bandwidth": round(self.bytes_per_step / step / self.bandwidth, 4)}
        return out


def decode_bytes_per_step(model: Decoder, batch: int, prompt_len: int, new_tokens: int,
                          itemsize: int) -> int:
    """Bytes one decode step must read, mean over the response: every parameter except
    the embedding table (only ``batch`` rows of it are read; when the embedding is tied
    it is the unembedding, read whole) in the serving dtype, plus keys and values of
    every position so far in every layer (``2 * N * B * K * hd * (P + t)``)."""
    cfg = model.config
    params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    if not cfg.tie_word_embeddings:
        params -= cfg.vocab_size * cfg.hidden_size
    positions = prompt_len + (new_tokens - 1) / 2  # mean of P + t over t = 0 .. n - 1
    kv = 2 * cfg.num_layers * batch * cfg.num_kv_heads * cfg.head_dim * positions
    return int((params + kv) * itemsize)


def copy_bandwidth(megabytes: int) -> float:
    """Device memory bandwidth in bytes/s: a jitted ``x + 1`` over ``megabytes`` of f32
    (one read and one write of every byte), median of 10 after a warm-up."""
    x = jnp.zeros((megabytes * 2**20 // 4,), jnp.float32)
    f = jax.jit(lambda a: a + 1)
    f(x).block_until_ready()
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    return 2 * x.nbytes / statistics.median(times)


class HfEngine:
    """Hugging Face ``generate`` (KV cache on, the same sampling) on the same weights."""

    name = "hf_generate"

    def __init__(self, path: str, prompts: np.ndarray, new_tokens: int, model: Decoder,
                 dtype: str = "float32"):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch, self.dtype = torch, dtype
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(
            self.device).eval()
        self.ids = torch.as_tensor(prompts, dtype=torch.long, device=self.device)
        mask = torch.ones_like(self.ids)
        with torch.no_grad():
            hf_logits = self.hf(input_ids=self.ids, attention_mask=mask).logits.float().cpu().numpy()
        ours = np.asarray(nnx.jit(lambda m, x: m(x))(model, jnp.asarray(prompts, jnp.int32)))
        self.parity_max_abs = float(np.max(np.abs(hf_logits - ours)))
        self.length = prompts.shape[1] + new_tokens
        self.kwargs = dict(attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                           top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           eos_token_id=None, pad_token_id=0, use_cache=True)
        t0 = time.perf_counter()
        with torch.no_grad():
            self.hf.generate(self.ids, **self.kwargs)
        self.warmup_s = time.perf_counter() - t0

    def call(self, r: int) -> float:
        torch = self.torch
        torch.manual_seed(r + 1)
        with torch.no_grad():
            t0 = time.perf_counter()
            out = self.hf.generate(self.ids, **self.kwargs)
            if self.device == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
        assert out.shape[1] == self.length
        return seconds

    def extra(self) -> dict:
        return {"device": self.device, "torch_threads": self.torch.get_num_threads(),
                "dtype": self.dtype, "warmup_s": round(self.warmup_s, 3)}


def interleaved(engines: list, repeats: int, tokens: int) -> dict:
    """``repeats`` rounds, each timing every engine once (the order alternating by round),
    with the 1-minute load average sampled every round: load drift hits both sides."""
    seconds: dict[str, list[float]] = {e.name: [] for e in engines}
    loads = []
    for r in range(repeats):
        for e in (engines if r % 2 == 0 else engines[::-1]):
            seconds[e.name].append(e.call(r))
        loads.append(os.getloadavg()[0])
    out = {"repeats": repeats, "load_1m": spread(loads)}
    for e in engines:
        out[e.name] = {"tokens_per_s": spread([tokens / t for t in seconds[e.name]]),
                       "seconds": spread(seconds[e.name]), **e.extra()}
    hf = seconds.get(HfEngine.name)
    for e in engines:
        if hf is not None and e.name != HfEngine.name:
            key = "ratio_" + e.name.replace("_sampler", "") + "_over_hf_tokens_per_s"
            out[key] = spread([tb / ta for ta, tb in zip(seconds[e.name], hf)])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--gpu", action="store_true", help="larger model for an accelerator")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=10,
                        help="interleaved rounds (each times every engine once)")
    parser.add_argument("--skip-hf", action="store_true", help="only the JAX sampler")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="the serving dtype of both engines")
    parser.add_argument("--scan-layers", action="store_true",
                        help="the JAX sampler scans over stacked layers")
    parser.add_argument("--copy-mb", type=int, default=None,
                        help="size of the bandwidth probe (default: 64 on CPU, 1024 with --gpu)")
    parser.add_argument("--devices", type=int, default=None,
                        help="replicas of the JAX sampler (JaxSamplerConfig.num_devices); on "
                             "CPU the process gets as many host devices (default: one per "
                             "core; 1 = the single-device sampler only); with --gpu: 1")
    args = parser.parse_args()
    devices = args.devices or (1 if args.gpu else os.cpu_count())
    if devices > 1 and not args.gpu:  # before JAX starts its CPU backend
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={devices}")
    s = dict(SIZES["gpu" if args.gpu else "cpu"])
    if args.batch:
        s["batch"] = args.batch
    if args.new_tokens:
        s["new_tokens"] = args.new_tokens
    model = build_model(s)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    prompts = np.random.default_rng(0).integers(0, s["vocab_size"], (s["batch"], s["prompt_len"]))
    result = {"variant": "gpu" if args.gpu else "cpu", "params": int(n_params), **s,
              "cpu_count": os.cpu_count(), "jax_devices": jax.device_count()}
    tokens = s["batch"] * s["new_tokens"]
    result["load_1m_before"] = os.getloadavg()[0]
    bandwidth = copy_bandwidth(args.copy_mb or (1024 if args.gpu else 64))
    kw = dict(dtype=args.dtype, scan_layers=args.scan_layers)
    engines = [JaxEngine(model, prompts, s["new_tokens"], "jax_sampler", devices, **kw,
                         bandwidth=bandwidth if devices == 1 else None)]
    if devices > 1:
        engines.append(JaxEngine(model, prompts, s["new_tokens"], "jax_sampler_1_device", **kw,
                                 bandwidth=bandwidth))
    with tempfile.TemporaryDirectory() as path:
        if not args.skip_hf:
            save_pretrained(model, path)
            engines.append(HfEngine(path, prompts, s["new_tokens"], model, args.dtype))
            result["parity_max_abs"] = engines[-1].parity_max_abs
        result.update(interleaved(engines, args.repeats, tokens))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
