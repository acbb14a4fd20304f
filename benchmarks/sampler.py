"""Decode throughput of `JaxSampler` vs Hugging Face transformers ``generate``, as JSON.

Usage (from the repository root)::

    python benchmarks/sampler.py            # CPU: ~5M-param Qwen2, batch 8, 128 new tokens
    python benchmarks/sampler.py --gpu      # larger model for an accelerator (JAX default
                                            # backend; HF on CUDA when torch has it)

Both engines run the same weights: the random `Decoder` is written with
`entr_jax.model.save_pretrained` and read back by ``AutoModelForCausalLM.from_pretrained``
(the max |logit difference| on the benchmark prompts is reported as ``parity_max_abs``).
Both sample with temperature 1, no filtering, no stop tokens, and generate exactly
``--new-tokens`` tokens for every row of equal-length random prompts (so HF needs no
padding). Each engine gets one warm-up call (JAX compiles there), then ``--repeats`` timed
calls; the best is reported. ``tokens_per_s = batch * new_tokens / seconds`` of a whole
``generate`` call (prefill included); the JAX sampler also reports its decode-only rate.
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


def bench_jax(model: Decoder, prompts: np.ndarray, new_tokens: int, repeats: int) -> dict:
    sampler = JaxSampler(model, config=JaxSamplerConfig(
        max_batch_size=len(prompts), min_prompt_bucket=prompts.shape[1], steps_per_call=32))
    params = SamplingParams(max_new_tokens=new_tokens, seed=0)
    t0 = time.perf_counter()
    sampler.generate(prompts.tolist(), params)
    warmup_s = time.perf_counter() - t0
    best = None
    for r in range(repeats):
        t0 = time.perf_counter()
        out = sampler.generate(prompts.tolist(), SamplingParams(max_new_tokens=new_tokens, seed=r))
        seconds = time.perf_counter() - t0
        assert all(len(g[0].response_ids) == new_tokens for g in out)
        if best is None or seconds < best[0]:
            best = (seconds, dict(sampler.last_stats))
    seconds, stats = best
    tokens = len(prompts) * new_tokens
    return {
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "decode_tokens_per_s": len(prompts) * stats["decode_steps"] / stats["decode_time_s"],
        "prefill_s": stats["prefill_time_s"],
        "warmup_s_incl_compile": warmup_s,
        "backend": jax.default_backend(),
    }


def bench_hf(path: str, prompts: np.ndarray, new_tokens: int, repeats: int, model: Decoder):
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    ids = torch.as_tensor(prompts, dtype=torch.long, device=device)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        hf_logits = hf(input_ids=ids, attention_mask=mask).logits.float().cpu().numpy()
    ours = np.asarray(model(jnp.asarray(prompts, jnp.int32)))
    kwargs = dict(attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                  max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=None,
                  pad_token_id=0)
    with torch.no_grad():
        hf.generate(ids, **kwargs)  # warm-up
        best = None
        for r in range(repeats):
            torch.manual_seed(r)
            t0 = time.perf_counter()
            out = hf.generate(ids, **kwargs)
            if device == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            assert out.shape[1] == prompts.shape[1] + new_tokens
            best = seconds if best is None else min(best, seconds)
    return {
        "seconds": best,
        "tokens_per_s": len(prompts) * new_tokens / best,
        "device": device,
        "torch_threads": torch.get_num_threads(),
    }, float(np.max(np.abs(hf_logits - ours)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="larger model for an accelerator")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-hf", action="store_true", help="only the JAX sampler")
    args = parser.parse_args()
    s = dict(SIZES["gpu" if args.gpu else "cpu"])
    if args.batch:
        s["batch"] = args.batch
    if args.new_tokens:
        s["new_tokens"] = args.new_tokens
    model = build_model(s)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    prompts = np.random.default_rng(0).integers(0, s["vocab_size"], (s["batch"], s["prompt_len"]))
    result = {"variant": "gpu" if args.gpu else "cpu", "params": int(n_params), **s,
              "cpu_count": os.cpu_count()}
    result["jax_sampler"] = bench_jax(model, prompts, s["new_tokens"], args.repeats)
    if not args.skip_hf:
        with tempfile.TemporaryDirectory() as path:
            save_pretrained(model, path)
            result["hf_generate"], result["parity_max_abs"] = bench_hf(
                path, prompts, s["new_tokens"], args.repeats, model)
        result["ratio_jax_over_hf_tokens_per_s"] = (
            result["jax_sampler"]["tokens_per_s"] / result["hf_generate"]["tokens_per_s"])
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
