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
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

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
                 devices: int = 1):
        self.name, self.devices = name, devices
        self.prompts, self.new_tokens = prompts.tolist(), new_tokens
        self.sampler = JaxSampler(model, config=JaxSamplerConfig(
            max_batch_size=len(prompts), min_prompt_bucket=prompts.shape[1], steps_per_call=32,
            num_devices=devices))
        t0 = time.perf_counter()
        self.sampler.generate(self.prompts, SamplingParams(max_new_tokens=new_tokens, seed=0))
        self.warmup_s = time.perf_counter() - t0
        self.decode_rates: list[float] = []
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
        self.prefill_s.append(st["prefill_time_s"])
        return seconds

    def extra(self) -> dict:
        return {"decode_tokens_per_s": spread(self.decode_rates),
                "prefill_s": spread(self.prefill_s),
                "warmup_s_incl_compile": round(self.warmup_s, 3),
                "backend": jax.default_backend(), "num_devices": self.devices}


class HfEngine:
    """Hugging Face ``generate`` (KV cache on, the same sampling) on the same weights."""

    name = "hf_generate"

    def __init__(self, path: str, prompts: np.ndarray, new_tokens: int, model: Decoder):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(self.device).eval()
        self.ids = torch.as_tensor(prompts, dtype=torch.long, device=self.device)
        mask = torch.ones_like(self.ids)
        with torch.no_grad():
            hf_logits = self.hf(input_ids=self.ids, attention_mask=mask).logits.float().cpu().numpy()
        ours = np.asarray(model(jnp.asarray(prompts, jnp.int32)))
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
                "warmup_s": round(self.warmup_s, 3)}


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
    engines = [JaxEngine(model, prompts, s["new_tokens"], "jax_sampler", devices)]
    if devices > 1:
        engines.append(JaxEngine(model, prompts, s["new_tokens"], "jax_sampler_1_device"))
    with tempfile.TemporaryDirectory() as path:
        if not args.skip_hf:
            save_pretrained(model, path)
            engines.append(HfEngine(path, prompts, s["new_tokens"], model))
            result["parity_max_abs"] = engines[-1].parity_max_abs
        result.update(interleaved(engines, args.repeats, tokens))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
